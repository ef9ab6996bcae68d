// Package audit writes the daemon's decisions to its audit log (the store's
// hash-chained records): each request, admission, refusal, cancel and decision the
// API makes, the end of every run (through the run manager's hook), and the
// daemon's own acts (pruning, as identity.Daemon). It knows when the log cannot be
// written (Down), so that the daemon stops admitting work it could not record. It
// imports the store, identity and the sandbox's protocol (a run's reason) only:
// never runs, sessions or the API.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/store"
)

// Writer writes the daemon's decisions to the audit log: what the API records (each
// request, admission, refusal, cancel, denied caller) and, through the manager, the
// end of every run.
type Writer struct {
	Store *store.Store
	Log   *slog.Logger
	// Healthy, if set, is told each append's outcome (nil: written), so that a
	// daemon whose audit log cannot be written is not ready (it refuses every run).
	Healthy func(error)

	mu   sync.Mutex  // Checked's two steps, together
	down atomic.Bool // the last append or check failed
}

// Record appends one record of kind (see the catalog, store.Kind) by who: its uid is
// the record's, and a TCP caller's token name goes into the detail as "token". detail
// is encoded as JSON: a map, or a struct of the kind's (RunFinished). An error means
// nothing was recorded (the API then refuses to start a run).
func (a *Writer) Record(ctx context.Context, kind store.Kind, who identity.Caller, runID string, detail any) error {
	b, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	if who.Token != "" {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		m["token"] = who.Token
		if b, err = json.Marshal(m); err != nil {
			return err
		}
	}
	uid := who.UID
	// A record is written even when the caller has gone away meanwhile.
	ctx = context.WithoutCancel(ctx)
	_, err = a.Store.Append(ctx, store.Event{Kind: kind, UID: uid, RunID: runID, Detail: b})
	a.Checked(err)
	if err != nil {
		if a.Log != nil {
			a.Log.Error("audit record lost", "kind", kind, "run", runID, "error", err)
		}
		return err
	}
	return nil
}

// ErrDown is RecordRefusal's error while the log is Down.
var ErrDown = errors.New("the audit log cannot be written")

// RecordRefusal records a refusal as Record does, unless the log is Down: then the
// refusal is only logged, at once, and ErrDown returned. A refusal waits for no lock:
// while another process holds the log's, each append waits out SQLite's busy timeout
// (5 s) and fails anyway, and a caller refused for that very reason would wait
// seconds for its 503, holding its connection. (It is for a refusal that ends
// nothing recorded: a request already recorded has its end written by Record.)
func (a *Writer) RecordRefusal(ctx context.Context, kind store.Kind, who identity.Caller, detail any) error {
	if a.Down() {
		if a.Log != nil {
			a.Log.Warn("refusal not audited: the audit log cannot be written", "kind", kind, "uid", who.UID, "detail", detail)
		}
		return ErrDown
	}
	return a.Record(ctx, kind, who, "", detail)
}

// Down reports whether the log is known not to be writable: the last append, or the
// last check given to Checked, failed.
func (a *Writer) Down() bool { return a.down.Load() }

// Checked is told the outcome of an append, or of a check of the log outside one
// (store.Store.Writable, which the daemon runs while the log is Down): it sets Down
// and tells Healthy.
func (a *Writer) Checked(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down.Store(err != nil)
	if a.Healthy != nil {
		a.Healthy(err)
	}
}

// Events returns audit records (see store.Store.Events); never nil.
func (a *Writer) Events(ctx context.Context, after int64, runID string, limit int) (any, error) {
	evs, err := a.Store.Events(ctx, after, runID, limit)
	if evs == nil {
		evs = []store.Event{}
	}
	return evs, err
}

// RunFinished is the detail of a run.finished record.
type RunFinished struct {
	Reason          protocol.Reason `json:"reason"`
	ExitCode        int             `json:"exit_code"`
	ElapsedMS       float64         `json:"elapsed_ms"`
	StdoutBytes     int             `json:"stdout_bytes"`
	StderrBytes     int             `json:"stderr_bytes"`
	StdoutTruncated bool            `json:"stdout_truncated"`
	StderrTruncated bool            `json:"stderr_truncated"`
	Diagnostics     []string        `json:"diagnostics"`
	// Layers are the enforcement layers that were in force (the contract).
	Layers []string `json:"layers,omitempty"`
}

// Prune removes the records older than retention and records that it did (the
// chain stays verifiable: see store.Store.Prune).
func (a *Writer) Prune(ctx context.Context, retention time.Duration) error {
	n, through, err := a.Store.Prune(ctx, time.Now().Add(-retention))
	if err != nil || n == 0 {
		return err
	}
	return a.Record(ctx, store.AuditPruned, identity.Daemon(), "", map[string]any{"records": n, "through_seq": through,
		"retention": retention.String()})
}

// PruneEvery prunes at once and then every interval until ctx ends.
func (a *Writer) PruneEvery(ctx context.Context, interval, retention time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := a.Prune(ctx, retention); err != nil && ctx.Err() == nil && a.Log != nil {
			a.Log.Warn("audit retention: prune failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
