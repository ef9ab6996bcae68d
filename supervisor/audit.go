package supervisor

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"time"

	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// Audit writes the daemon's decisions to the audit log: what the API records (each
// request, admission, refusal, cancel, denied caller) and, through the manager, the
// end of every run.
type Audit struct {
	Store *store.Store
	Log   *slog.Logger
	// Healthy, if set, is told each append's outcome (nil: written), so that a
	// daemon whose audit log cannot be written is not ready (it refuses every run).
	Healthy func(error)
}

// Record appends one event; detail is encoded as JSON. An error means nothing was
// recorded (the API then refuses to start a run).
func (a *Audit) Record(ctx context.Context, kind string, uid int, runID string, detail any) error {
	b, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	// A record is written even when the caller has gone away meanwhile.
	ctx = context.WithoutCancel(ctx)
	_, err = a.Store.Append(ctx, store.Event{Kind: kind, UID: uid, RunID: runID, Detail: b})
	if a.Healthy != nil {
		a.Healthy(err)
	}
	if err != nil {
		if a.Log != nil {
			a.Log.Error("audit record lost", "kind", kind, "run", runID, "error", err)
		}
		return err
	}
	return nil
}

// Events returns audit records (see store.Store.Events); never nil.
func (a *Audit) Events(ctx context.Context, after int64, runID string, limit int) (any, error) {
	evs, err := a.Store.Events(ctx, after, runID, limit)
	if evs == nil {
		evs = []store.Event{}
	}
	return evs, err
}

// Attach records "run.finished" for every run m ends.
func (a *Audit) Attach(m *Manager) {
	m.OnFinish(func(r *Run, v wire.View) {
		d := map[string]any{}
		if res := v.Result; res != nil {
			d = map[string]any{"reason": res.Reason, "exit_code": res.ExitCode, "elapsed_ms": res.ElapsedMS,
				"stdout_bytes": len(res.Stdout), "stderr_bytes": len(res.Stderr),
				"stdout_truncated": res.StdoutTruncated, "stderr_truncated": res.StderrTruncated,
				"diagnostics": res.Diagnostics}
			if res.Enforcement != nil {
				d["layers"] = res.Enforcement.ActiveLayers()
			}
		}
		if r.Caller.Token != "" {
			d["token"] = r.Caller.Token
		}
		a.Record(context.Background(), "run.finished", r.Caller.UID, r.ID, d)
	})
}

// Prune removes the records older than retention and records that it did (the
// chain stays verifiable: see store.Store.Prune).
func (a *Audit) Prune(ctx context.Context, retention time.Duration) error {
	n, through, err := a.Store.Prune(ctx, time.Now().Add(-retention))
	if err != nil || n == 0 {
		return err
	}
	return a.Record(ctx, "audit.pruned", os.Getuid(), "", map[string]any{"records": n, "through_seq": through,
		"retention": retention.String()})
}

// PruneEvery prunes at once and then every interval until ctx ends.
func (a *Audit) PruneEvery(ctx context.Context, interval, retention time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := a.Prune(ctx, retention); err != nil && a.Log != nil {
			a.Log.Warn("audit retention: prune failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
