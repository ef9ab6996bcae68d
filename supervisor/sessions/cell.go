package sessions

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// Cell runs one cell in caller's session id (see sandbox.Session.Run for what cell
// carries and what it answers: the result and the value of the last expression),
// resuming it first if it is paused, measuring its workspace against the
// quota as a run's, and says what became of the state. Errors: ErrNotFound,
// ErrBusy, ErrLost (the state was lost before this cell, or its
// checkpoint could not be resumed), the cell's own bad input
// (sandbox.ErrBadRequest wrapped), a resume's other failure (the session stays
// paused), or admitted's error. admitted is called once the cell holds the session
// and its worker, before it runs (the audit record that must precede it); observe,
// when not nil, is given the output as it comes (see sandbox.Session.RunStreaming).
func (m *Manager) Cell(ctx context.Context, id string, caller identity.Caller, cell protocol.Request, observe sandbox.Observer, admitted func() error) (sandbox.Cell, wire.SessionState, error) {
	s, err := m.Get(id, caller)
	if err != nil {
		return sandbox.Cell{}, "", err
	}
	if m.stopped.Load() {
		return sandbox.Cell{}, "", ErrStopping
	}
	if !s.busy.CompareAndSwap(false, true) {
		return sandbox.Cell{}, "", ErrBusy
	}
	defer s.busy.Store(false)
	s.mu.Lock()
	lost, closed := s.lost, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return sandbox.Cell{}, "", ErrNotFound
	case lost != "":
		return sandbox.Cell{}, "", fmt.Errorf("%w: %s", ErrLost, lost)
	}
	var w *workspace.Workspace
	dir := s.req.Workspace
	if m.o.Quota.Bytes > 0 && m.o.Quota.Files > 0 {
		if w, err = workspace.Directory(dir, m.o.Quota); err != nil {
			return sandbox.Cell{}, "", err
		}
		// A workspace already past its quota would end the cell at once.
		if over, u, err := w.OverQuota(); err != nil || over {
			if err == nil {
				err = fmt.Errorf("%w: the session's workspace holds %d bytes in %d names, over its quota of %d bytes and %d names: remove files first",
					workspace.ErrQuota, u.Bytes, u.Files, m.o.Quota.Bytes, m.o.Quota.Files)
			}
			return sandbox.Cell{}, "", err
		}
	}
	cell.Limits.MaxStdoutBytes = min(cell.Limits.MaxStdoutBytes, MaxCellOutputBytes)
	cell.Limits.MaxStderrBytes = min(cell.Limits.MaxStderrBytes, MaxCellOutputBytes)
	select {
	case m.running <- struct{}{}:
		defer func() { <-m.running }()
	case <-ctx.Done():
		return sandbox.Cell{}, "", ctx.Err()
	case <-m.stop:
		return sandbox.Cell{}, "", ErrStopping
	}
	if m.stopped.Load() {
		return sandbox.Cell{}, "", ErrStopping
	}
	if err := m.resume(ctx, s); err != nil {
		return sandbox.Cell{}, "", err
	}
	// From here the cell runs, unless the daemon began to stop meanwhile: then the
	// session is left to Shutdown, which pauses it (see Shutdown).
	s.mu.Lock()
	if m.stopped.Load() {
		s.mu.Unlock()
		return sandbox.Cell{}, "", ErrStopping
	}
	s.running = true
	s.mu.Unlock()
	if err := admitted(); err != nil {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
		return sandbox.Cell{}, "", err
	}
	if w != nil {
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		var pid atomic.Int64
		pid.Store(int64(s.ss.PID()))
		go w.Watch(ctx, dir, &pid, m.o.Quota, func(detail string) {
			stop(&sandbox.Stop{Reason: protocol.QuotaExceeded, Detail: detail})
		})
	}
	c, err := s.ss.RunStreaming(ctx, cell, observe)
	res := c.Result
	defer m.budget()
	reseeded := false
	defer func() {
		if reseeded {
			m.persist(s) // (after s.mu's release)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	// No longer running: from here the stop pauses the session, or it has
	// already ended it (lost, said below) while the cell ran.
	s.running = false
	s.used = time.Now().UTC()
	if s.lost != "" && err == nil {
		s.cells++
		return c, wire.SessionLost, nil
	}
	if errors.Is(err, sandbox.ErrSessionLost) {
		s.lose(err.Error())
		return sandbox.Cell{}, "", fmt.Errorf("%w: %s", ErrLost, s.lost)
	}
	if err != nil {
		return sandbox.Cell{}, "", err
	}
	s.cells++
	s.memory = max(s.memory, res.PeakMemoryBytes)
	if s.failed != nil && s.failed.Reason == wire.PauseOverBound {
		// Its state may have changed: its next pause is tried as any.
		s.failed = nil
	}
	if !c.RolledBack && s.reseed {
		s.reseed, reseeded = false, true
	}
	switch {
	case c.RolledBack:
		s.restored = false
		return c, wire.SessionRolledBack, nil
	case res.Reason != protocol.Exited:
		s.lose(fmt.Sprintf("cell %d ended %s and the state could not be restored", s.cells, res.Reason))
		return c, wire.SessionLost, nil
	case s.restored:
		s.restored = false
		return c, wire.SessionRestored, nil
	}
	return c, wire.SessionPreserved, nil
}
