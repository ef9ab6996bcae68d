// Package approvals is the daemon's approval queue: requests for a person's
// consent to one action (a SQL write, held code), each decided by someone other
// than its requester (or confirmed by the person at the requester's MCP client),
// then redeemed once for exactly the request it was given for. It keeps them in
// memory, bounded; what happens to each is the audit log's to record (the API
// records it). It imports only identity: never runs, sessions, the API or the store.
package approvals

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/sandcell/sandcell/supervisor/identity"
)

// Errors of the approval mechanism.
var (
	ErrNotFound = errors.New("supervisor: no such approval")
	// ErrState: the approval is not in the state the operation needs
	// (deciding one already decided, redeeming one pending, denied, spent or expired).
	ErrState = errors.New("supervisor: approval not usable")
	// ErrMismatch: redeemed by another caller or for another request.
	ErrMismatch = errors.New("supervisor: approval is for another request")
	// ErrSelfApproval: the decider is the requester (four eyes: nobody approves
	// their own request, whatever their roles).
	ErrSelfApproval = errors.New("supervisor: a caller cannot decide its own request")
	// ErrTooManyPending: the requester has MaxPending requests waiting.
	ErrTooManyPending = errors.New("supervisor: too many approvals pending for this caller")
)

// MaxPending bounds the pending approvals of one requester.
const MaxPending = 32

// MaxKeptBytes bounds what the approvals of a daemon keep, in bytes of their subjects
// as compact JSON (a statement and its parameters can be a whole request body, 1
// MiB), and MaxKeptBytesPerRequester what one requester's live (pending or approved)
// approvals keep. Past MaxKeptBytes the oldest finished approvals (denied, expired,
// spent and past their window) are forgotten first (their audit records stay); when
// only live ones are left, or the requester is at its own bound, a new request is
// refused with ErrTooManyPending.
const (
	MaxKeptBytes             = 64 << 20
	MaxKeptBytesPerRequester = 16 << 20
)

// approvalOverhead is counted for each approval besides its subject: ids, times,
// the digest, the map entry.
const approvalOverhead = 512

// State is where an approval is in its life.
type State string

// The states: pending until an approver decides or it expires; an approved one is
// spent by its one use or expires unused.
const (
	Pending  State = "pending"
	Approved State = "approved"
	Denied   State = "denied"
	Spent    State = "spent"
	Expired  State = "expired"
)

// Approval is a request for a person's consent to one action: an action name the
// policy lists (for example "sql.write"), the caller who asked, what exactly would be
// done (Subject, shown to the approver) and its Digest (the SHA-256 of the request,
// which redeeming must match).
type Approval struct {
	ID        string          `json:"id"`
	Action    string          `json:"action"`
	State     State           `json:"state"`
	Requester identity.Caller `json:"requester"`
	// Subject is what would be done, as compact JSON (what Request was given).
	Subject   json.RawMessage `json:"subject"`
	Digest    string          `json:"digest"`
	CreatedAt time.Time       `json:"created_at"`
	// ExpiresAt is when a pending approval lapses, or, once approved, when the
	// window to use it closes.
	ExpiresAt time.Time        `json:"expires_at"`
	DecidedBy *identity.Caller `json:"decided_by,omitempty"`
	DecidedAt *time.Time       `json:"decided_at,omitempty"`
	// Confirmed: decided by its requester, through the person at its MCP client
	// (Confirm), not by an approver.
	Confirmed bool `json:"confirmed,omitempty"`
	// Head is a digest of what was asked without what costs work to read (the
	// workspace's files, for code), or "" (see Room).
	Head string `json:"-"`
	// Grant, on an approved tool call, is how many calls the decision covers: this
	// one and the run's next calls to the same tool, at most Grant in all (1: this
	// call alone). See Decide.
	Grant int `json:"grant,omitempty"`
}

// MaxGrant bounds Approval.Grant: one decision covers at most this many calls.
const MaxGrant = 10_000

// Queue holds the approvals of a daemon (in memory: a restart forgets them; each
// step is in the audit log). Its methods are safe for concurrent use.
type Queue struct {
	// TTL is how long a request waits for a decision; Window how long an approved
	// one may be used.
	TTL, Window time.Duration

	mu sync.Mutex
	// decided is closed, and replaced, when a decision is recorded (Wait).
	decided chan struct{}
	m       map[string]*Approval
	size    map[string]int64 // of each approval in m, counted in kept
	kept    int64
	// now is the clock (tests move it).
	now func() time.Time
}

// New returns an empty queue: requests wait ttl for a decision, and an approved one
// may be used within window.
func New(ttl, window time.Duration) *Queue {
	return &Queue{TTL: ttl, Window: window, m: map[string]*Approval{}, size: map[string]int64{}, now: time.Now,
		decided: make(chan struct{})}
}

// expire moves lapsed approvals to expired and forgets old ones; a.mu is held.
func (a *Queue) expire() {
	now := a.now()
	for id, ap := range a.m {
		if (ap.State == Pending || ap.State == Approved) && now.After(ap.ExpiresAt) {
			ap.State = Expired
		}
		if ap.State != Pending && ap.State != Approved && now.Sub(ap.ExpiresAt) > 24*time.Hour {
			a.forget(id)
		}
	}
}

// finished reports whether ap can no longer be used, nor given back (Restore): only
// those are forgotten to make room.
func (a *Queue) finished(ap *Approval) bool {
	switch ap.State {
	case Pending, Approved:
		return false
	case Spent:
		return a.now().After(ap.ExpiresAt)
	}
	return true
}

// forget drops approval id; a.mu is held.
func (a *Queue) forget(id string) {
	a.kept -= a.size[id]
	delete(a.size, id)
	delete(a.m, id)
}

// makeRoom forgets the oldest finished approvals (decided, spent, expired) until n
// more bytes fit in MaxKeptBytes, and reports whether they do; a.mu is held.
func (a *Queue) makeRoom(n int64) bool {
	for a.kept+n > MaxKeptBytes {
		var oldest *Approval
		for _, ap := range a.m {
			if a.finished(ap) && (oldest == nil || ap.CreatedAt.Before(oldest.CreatedAt)) {
				oldest = ap
			}
		}
		if oldest == nil {
			return false
		}
		a.forget(oldest.ID)
	}
	return true
}

// KeptBytes is what the approvals keep now, counted as MaxKeptBytes counts it.
func (a *Queue) KeptBytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.kept
}

// Request records a pending approval and returns a copy, or an error wrapping
// ErrTooManyPending (MaxPending of the requester's wait, or MaxKeptBytes is kept by
// approvals still pending or approved).
func (a *Queue) Request(action string, requester identity.Caller, subject any, digest, head string) (Approval, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expire()
	pending, live := 0, int64(0)
	for id, ap := range a.m {
		if ap.Requester == requester && ap.State == Pending && ap.Action == action && ap.Digest == digest {
			return *ap, nil // the same request again: the same approval, waiting still
		}
		if ap.Requester == requester && ap.State == Pending {
			pending++
		}
		if ap.Requester == requester && !a.finished(ap) {
			live += a.size[id]
		}
	}
	if pending >= MaxPending {
		return Approval{}, fmt.Errorf("%w: this caller has %d waiting for a decision, at most %d", ErrTooManyPending, pending, MaxPending)
	}
	// What is kept is exactly what is counted: the subject as compact JSON (a raw
	// parameter list can carry a megabyte of white space).
	b, err := json.Marshal(subject)
	if err != nil {
		return Approval{}, err
	}
	n := int64(len(b)+len(digest)) + approvalOverhead
	if live+n > MaxKeptBytesPerRequester {
		return Approval{}, fmt.Errorf("%w: this caller's approvals waiting or approved keep %d bytes, at most %d",
			ErrTooManyPending, live, MaxKeptBytesPerRequester)
	}
	if !a.makeRoom(n) {
		return Approval{}, fmt.Errorf("%w: the approvals of all callers waiting or approved keep %d bytes, at most %d",
			ErrTooManyPending, a.kept, MaxKeptBytes)
	}
	now := a.now().UTC()
	ap := &Approval{ID: ulid.MustNew(ulid.Now(), rand.Reader).String(), Action: action, State: Pending,
		Requester: requester, Subject: b, Digest: digest, Head: head, CreatedAt: now, ExpiresAt: now.Add(a.TTL)}
	a.m[ap.ID] = ap
	a.size[ap.ID], a.kept = n, a.kept+n
	return *ap, nil
}

// Room returns an error wrapping ErrTooManyPending when requester has MaxPending
// approvals waiting, as Request would, without the subject Request needs: a caller
// asks before it makes one that costs work (the gate of code hashes a workspace).
// It returns nil when head is not "" and one of those has it: the same request
// again, perhaps, which Request answers with the approval that waits.
func (a *Queue) Room(requester identity.Caller, head string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expire()
	pending := 0
	for _, ap := range a.m {
		if ap.Requester == requester && ap.State == Pending {
			if head != "" && ap.Head == head {
				return nil
			}
			pending++
		}
	}
	if pending >= MaxPending {
		return fmt.Errorf("%w: this caller has %d waiting for a decision, at most %d", ErrTooManyPending, pending, MaxPending)
	}
	return nil
}

// Usable returns approval id if Redeem could spend it for caller with the right
// digest: ErrNotFound (also when it is another caller's) or ErrState
// otherwise. It spends nothing; a caller asks before it makes the digest.
func (a *Queue) Usable(id string, caller identity.Caller) (Approval, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.lookup(id)
	switch {
	case err != nil:
		return Approval{}, err
	case ap.Requester != caller:
		return Approval{}, ErrNotFound
	case ap.State != Approved:
		return *ap, fmt.Errorf("%w: it is %s", ErrState, ap.State)
	}
	return *ap, nil
}

// lookup expires what has lapsed and returns approval id; a.mu is held.
func (a *Queue) lookup(id string) (*Approval, error) {
	a.expire()
	ap, ok := a.m[id]
	if !ok {
		return nil, ErrNotFound
	}
	return ap, nil
}

// Get returns approval id.
func (a *Queue) Get(id string) (Approval, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.lookup(id)
	if err != nil {
		return Approval{}, err
	}
	return *ap, nil
}

// List returns the approvals in state (all when empty), oldest first.
func (a *Queue) List(state State) []Approval {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expire()
	out := []Approval{}
	for _, ap := range a.m {
		if state == "" || ap.State == state {
			out = append(out, *ap)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Decide approves or denies a pending approval. Approved, it may be redeemed once
// within Window.
func (a *Queue) Decide(id string, by identity.Caller, approve bool) (Approval, error) {
	return a.DecideGrant(id, by, approve, 1)
}

// DecideGrant is Decide for a tool call (action "tool.call"): approved with grant
// n (1 to MaxGrant), it covers this call and the run's next calls to the same
// tool, n in all; denied, n is not used.
func (a *Queue) DecideGrant(id string, by identity.Caller, approve bool, n int) (Approval, error) {
	if approve && (n < 1 || n > MaxGrant) {
		return Approval{}, fmt.Errorf("%w: a grant covers 1 to %d calls, not %d", ErrState, MaxGrant, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.lookup(id)
	if err != nil {
		return Approval{}, err
	}
	if ap.State != Pending {
		return *ap, fmt.Errorf("%w: it is %s", ErrState, ap.State)
	}
	if by == ap.Requester {
		return *ap, ErrSelfApproval
	}
	if approve && n > 1 {
		ap.Grant = n
	}
	return a.decide(ap, by, approve, false), nil
}

// Wait returns approval id once it is no longer pending (decided, or expired at
// its TTL), or ctx's error when ctx ends first.
func (a *Queue) Wait(ctx context.Context, id string) (Approval, error) {
	for {
		a.mu.Lock()
		ap, err := a.lookup(id)
		if err != nil {
			a.mu.Unlock()
			return Approval{}, err
		}
		got, decided := *ap, a.decided
		a.mu.Unlock()
		if got.State != Pending {
			return got, nil
		}
		t := time.NewTimer(time.Until(got.ExpiresAt) + time.Millisecond)
		select {
		case <-decided:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return got, ctx.Err()
		}
		t.Stop()
	}
}

// decide records by's decision on the pending ap (a.mu is held).
func (a *Queue) decide(ap *Approval, by identity.Caller, approve, confirmed bool) Approval {
	close(a.decided)
	a.decided = make(chan struct{})
	now := a.now().UTC()
	ap.DecidedBy, ap.DecidedAt, ap.Confirmed = &by, &now, confirmed
	if approve {
		ap.State, ap.ExpiresAt = Approved, now.Add(a.Window)
	} else {
		ap.State = Denied
	}
	return *ap
}

// Decidable reports whether by may decide approval id now: as an approver (confirm
// false, Decide's rules) or as its requester (confirm true, Confirm's). The errors
// are theirs; a decision recorded after a nil answer can still lose a race to
// another, which Decide or Confirm then reports.
func (a *Queue) Decidable(id string, by identity.Caller, confirm bool) (Approval, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.lookup(id)
	switch {
	case err != nil:
		return Approval{}, err
	case confirm && ap.Requester != by:
		return Approval{}, ErrNotFound
	case ap.State != Pending:
		return *ap, fmt.Errorf("%w: it is %s", ErrState, ap.State)
	case !confirm && by == ap.Requester:
		return *ap, ErrSelfApproval
	}
	return *ap, nil
}

// Confirm decides a pending approval by its own requester: what the person at the
// requester's MCP client answered when asked (elicitation). Whether that may count
// is the caller's to decide (policy's approvals.elicitation). Only the requester
// may (the converse of Decide); to anyone else the approval does not exist.
func (a *Queue) Confirm(id string, by identity.Caller, approve bool) (Approval, error) {
	return a.ConfirmGrant(id, by, approve, 1)
}

// ConfirmGrant is Confirm with a grant (see DecideGrant), for a tool call.
func (a *Queue) ConfirmGrant(id string, by identity.Caller, approve bool, n int) (Approval, error) {
	if approve && (n < 1 || n > MaxGrant) {
		return Approval{}, fmt.Errorf("%w: a grant covers 1 to %d calls, not %d", ErrState, MaxGrant, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.lookup(id)
	if err != nil || ap.Requester != by {
		return Approval{}, ErrNotFound // another's is none of this caller's
	}
	if ap.State != Pending {
		return *ap, fmt.Errorf("%w: it is %s", ErrState, ap.State)
	}
	if approve && n > 1 {
		ap.Grant = n
	}
	return a.decide(ap, by, approve, true), nil
}

// Redeem spends an approved approval for the request with digest by its requester:
// it succeeds once.
func (a *Queue) Redeem(id string, caller identity.Caller, digest string) (Approval, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.lookup(id)
	if err != nil {
		return Approval{}, err
	}
	if ap.Requester != caller || ap.Digest != digest {
		return *ap, ErrMismatch
	}
	if ap.State != Approved {
		return *ap, fmt.Errorf("%w: it is %s", ErrState, ap.State)
	}
	ap.State = Spent
	return *ap, nil
}

// Withdraw ends approval id while it is pending (expired now): what asked for it
// no longer waits (a run that ended). It changes nothing otherwise.
func (a *Queue) Withdraw(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ap, ok := a.m[id]; ok && ap.State == Pending {
		ap.State, ap.ExpiresAt = Expired, a.now().UTC()
		close(a.decided)
		a.decided = make(chan struct{})
	}
}

// Restore makes a spent approval usable again when what it was spent on never ran
// (the queue was full, the daemon is stopping); it changes nothing otherwise.
func (a *Queue) Restore(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ap, ok := a.m[id]; ok && ap.State == Spent && !a.now().After(ap.ExpiresAt) {
		ap.State = Approved
	}
}
