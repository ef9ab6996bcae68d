package sessions

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// Fork makes a new session for caller from its session id's state: the
// interpreter as id's last cell that ended by itself left it (or as id was
// paused), and a private workspace that is a copy of id's workspace as it is now
// (so that the two diverge in their files as in their memory). The fork counts
// as any session toward the bounds; id goes on unchanged. Errors: as Get and Open,
// ErrBusy, ErrLost, and a workspace that cannot be copied (a
// symbolic link leading out of it, for one).
func (m *Manager) Fork(ctx context.Context, id string, caller identity.Caller) (*Session, error) {
	src, err := m.Get(id, caller)
	if err != nil {
		return nil, err
	}
	if m.o.WorkDir == "" {
		return nil, errors.New("supervisor: sessions cannot be forked here (no state directory)")
	}
	if m.stopped.Load() {
		return nil, ErrStopping
	}
	if !src.busy.CompareAndSwap(false, true) {
		return nil, ErrBusy
	}
	defer src.busy.Store(false)
	src.mu.Lock()
	lost, ss, paused := src.lost, src.ss, src.paused
	req := src.req
	src.mu.Unlock()
	if lost != "" {
		return nil, fmt.Errorf("%w: %s", ErrLost, lost)
	}
	if req.Backend == protocol.BackendNative {
		return nil, fmt.Errorf("%w: a native session cannot be forked: its interpreter is a process inside its own workspace's sandbox", sandbox.ErrBadRequest)
	}
	req.Workspace = ""
	s, err := m.reserve(caller, req, "")
	if err != nil {
		return nil, err
	}
	s.ForkedFrom = src.ID
	s.memory = src.memory
	s.reseed = true
	fromDir := src.req.Workspace
	if err := m.give(s, true, &fromDir); err != nil {
		m.forget(s)
		return nil, err
	}
	// The state: id's checkpoint file while it is paused, else one saved now.
	ckpt := filepath.Join(src.dir, checkpointName)
	if !paused {
		ckpt = filepath.Join(s.dir, "fork."+checkpointName)
		f, err := os.OpenFile(ckpt, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = ss.Save(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		defer os.Remove(ckpt)
		if err != nil {
			m.forget(s)
			return nil, fmt.Errorf("cannot save the session to fork it: %w", err)
		}
	}
	// The module, library and hardening of now, as for a resumed session: the
	// source's module may be an older hash secret's, since removed (the checkpoint
	// is the whole memory, the source's secret included).
	if err := m.o.Prepare(&s.req); err != nil {
		m.forget(s)
		return nil, err
	}
	err = m.attach(ctx, s, func(req protocol.Request) (*sandbox.Session, error) {
		f, err := os.Open(ckpt)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		req.Fork = true
		return m.opener.ResumeSession(ctx, req, f)
	})
	if err != nil {
		m.forget(s)
		return nil, err
	}
	// Its state came from a checkpoint, as a resumed session's: its first answer
	// says restored (the files id held open are closed in the fork).
	s.mu.Lock()
	s.resumed, s.restored = time.Now().UTC(), true
	s.mu.Unlock()
	m.ready(s)
	m.budget()
	return s, nil
}

// copyWorkspace copies the workspace directory from into to (see
// workspace.CopyTo: regular files and directories only, nothing followed), within
// q. Errors: workspace.ErrNotFound (from is gone), workspace.ErrQuota (from is past
// q: its session's cells are refused until files are removed, and a copy would be
// too), workspace.ErrUnsafe (a name that is not copied).
func copyWorkspace(to, from string, q workspace.Quota) error {
	if _, err := os.Stat(from); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: the session's workspace was deleted", workspace.ErrNotFound)
	}
	w, err := workspace.Directory(from, q)
	if err != nil {
		return err
	}
	if q.Bytes > 0 && q.Files > 0 {
		over, u, err := w.OverQuota()
		if err != nil {
			return err
		}
		if over {
			return fmt.Errorf("%w: the session's workspace holds %d bytes in %d names, over its quota of %d bytes and %d names: remove files before forking it",
				workspace.ErrQuota, u.Bytes, u.Files, q.Bytes, q.Files)
		}
	}
	if err := w.CopyTo(to); err != nil {
		return fmt.Errorf("cannot copy the session's workspace for the fork: %w", err)
	}
	return nil
}
