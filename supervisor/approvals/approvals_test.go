package approvals

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/identity"
)

func TestApprovals(t *testing.T) {
	now := time.Now()
	a := New(time.Minute, 10*time.Second)
	a.now = func() time.Time { return now }
	alice, bob := identity.Caller{UID: 1000}, identity.Caller{UID: 1001}

	// Approve, redeem once; a replay is refused.
	ap, _ := a.Request("sql.write", alice, "DELETE FROM t", "d1", "")
	if _, err := a.Decide(ap.ID, alice, true); !errors.Is(err, ErrSelfApproval) {
		t.Fatalf("self-approval: %v", err)
	}
	if _, err := a.Redeem(ap.ID, alice, "d1"); !errors.Is(err, ErrState) {
		t.Fatalf("redeem pending: %v", err)
	}
	if got, err := a.Decide(ap.ID, bob, true); err != nil || got.State != Approved || *got.DecidedBy != bob {
		t.Fatalf("approve: %+v %v", got, err)
	}
	if _, err := a.Decide(ap.ID, bob, false); !errors.Is(err, ErrState) {
		t.Fatalf("decide twice: %v", err)
	}
	if _, err := a.Redeem(ap.ID, bob, "d1"); !errors.Is(err, ErrMismatch) {
		t.Fatalf("another caller: %v", err)
	}
	if _, err := a.Redeem(ap.ID, alice, "d2"); !errors.Is(err, ErrMismatch) {
		t.Fatalf("another request: %v", err)
	}
	if got, err := a.Redeem(ap.ID, alice, "d1"); err != nil || got.State != Spent {
		t.Fatalf("redeem: %+v %v", got, err)
	}
	if _, err := a.Redeem(ap.ID, alice, "d1"); !errors.Is(err, ErrState) {
		t.Fatalf("replay: %v", err)
	}
	// Restored when what it was spent on never ran.
	a.Restore(ap.ID)
	if _, err := a.Redeem(ap.ID, alice, "d1"); err != nil {
		t.Fatalf("after restore: %v", err)
	}

	// Deny.
	ap, _ = a.Request("sql.write", alice, "DROP TABLE t", "d3", "")
	a.Decide(ap.ID, bob, false)
	if _, err := a.Redeem(ap.ID, alice, "d3"); !errors.Is(err, ErrState) {
		t.Fatalf("redeem denied: %v", err)
	}

	// Expiry: a pending request after its TTL, an approved one after its window.
	pending, _ := a.Request("sql.write", alice, "x", "d4", "")
	approved, _ := a.Request("sql.write", alice, "y", "d5", "")
	a.Decide(approved.ID, bob, true)
	now = now.Add(2 * time.Minute)
	if _, err := a.Decide(pending.ID, bob, true); !errors.Is(err, ErrState) {
		t.Fatalf("decide expired: %v", err)
	}
	if got, err := a.Redeem(approved.ID, alice, "d5"); !errors.Is(err, ErrState) || got.State != Expired {
		t.Fatalf("redeem after the window: %+v %v", got, err)
	}
	if n := len(a.List(Pending)); n != 0 {
		t.Fatalf("%d pending", n)
	}
	if _, err := a.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	// At most MaxPending waiting per requester.
	for i := 0; i < MaxPending; i++ {
		if _, err := a.Request("sql.write", bob, "z", fmt.Sprint("d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Request("sql.write", bob, "z", "d-over", ""); !errors.Is(err, ErrTooManyPending) {
		t.Fatalf("over the cap: %v", err)
	}
	// The same request again, while its approval waits, is that approval.
	first, _ := a.Request("sql.write", bob, "z", "d0", "")
	if again, err := a.Request("sql.write", bob, "z", "d0", ""); err != nil || again.ID != first.ID {
		t.Fatalf("the same request: %v, %s and %s", err, first.ID, again.ID)
	}
}

// What approvals keep is bounded in bytes: requests of 1 MiB subjects whose approvals
// expire and are requested again (a caller who never waits for a decision) keep at
// most MaxKeptBytes, by forgetting the oldest expired ones; when everything kept is
// still pending, a new request is refused.
func TestApprovalsKeepBoundedBytes(t *testing.T) {
	now := time.Now()
	a := New(time.Minute, 10*time.Second)
	a.now = func() time.Time { return now }
	big := strings.Repeat("x", 1<<20)
	var first Approval
	for i := 0; i < 4*MaxKeptBytes>>20; i++ {
		ap, err := a.Request("sql.write", identity.Caller{UID: 1000}, map[string]any{"sql": big}, "d", "")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if i == 0 {
			first = ap
		}
		if k := a.KeptBytes(); k > MaxKeptBytes {
			t.Fatalf("request %d: %d bytes kept", i, k)
		}
		now = now.Add(2 * time.Minute) // it expires undecided
	}
	if _, err := a.Get(first.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the oldest expired approval is still kept: %v", err)
	}
	// Pending ones are never forgotten for room: past the bound the request is refused.
	var err error
	for i := 0; err == nil; i++ {
		_, err = a.Request("sql.write", identity.Caller{UID: 5000 + i}, map[string]any{"sql": big}, "d", "")
		if i > MaxKeptBytes>>20 {
			t.Fatal("more than MaxKeptBytes of pending approvals")
		}
	}
	if !errors.Is(err, ErrTooManyPending) || a.KeptBytes() > MaxKeptBytes {
		t.Fatalf("past the bound: %v, %d bytes", err, a.KeptBytes())
	}
	if n := len(a.List(Pending)); n < MaxKeptBytes>>20-2 {
		t.Fatalf("%d pending kept", n)
	}
}

// What is kept is what is counted (a subject's white space is not kept), one
// requester's live approvals are bounded on their own, and an approval spent on a
// statement that may yet be given back (Restore) is never forgotten for room.
func TestApprovalsKeepWhatTheyCount(t *testing.T) {
	now := time.Now()
	a := New(time.Minute, 10*time.Second)
	a.now = func() time.Time { return now }
	spaces := json.RawMessage("[" + strings.Repeat(" ", 1<<20) + "1]")
	ap, err := a.Request("sql.write", identity.Caller{UID: 1}, map[string]any{"params": spaces}, "d", "")
	if err != nil || len(ap.Subject) > 100 || a.KeptBytes() > 1000 {
		t.Fatalf("kept %d bytes of subject, %d counted: %v", len(ap.Subject), a.KeptBytes(), err)
	}
	big := strings.Repeat("x", 1<<20)
	var n int
	for n = 0; n < 100; n++ {
		if _, err = a.Request("sql.write", identity.Caller{UID: 2}, map[string]any{"sql": big}, fmt.Sprint("d", n), ""); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrTooManyPending) || !strings.Contains(err.Error(), "this caller's") || n != MaxKeptBytesPerRequester>>20-1 {
		t.Fatalf("after %d: %v", n, err)
	}
	// An approval spent on a statement that never ran stays, whatever others ask.
	spent, _ := a.Request("sql.write", identity.Caller{UID: 3}, map[string]any{"sql": big}, "d3", "")
	a.Decide(spent.ID, identity.Caller{UID: 4}, true)
	if _, err := a.Redeem(spent.ID, identity.Caller{UID: 3}, "d3"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		a.Request("sql.write", identity.Caller{UID: 100 + i}, map[string]any{"sql": big}, "d", "")
		now = now.Add(time.Millisecond)
	}
	a.Restore(spent.ID)
	if got, err := a.Get(spent.ID); err != nil || got.State != Approved {
		t.Fatalf("the spent approval: %+v %v", got, err)
	}
}
