package supervisor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// Errors of Sessions.
var (
	// ErrSessionNotFound: no such session, or another caller's (the same to them).
	ErrSessionNotFound = errors.New("supervisor: no such session")
	// ErrSessionBusy: a cell of the session is running.
	ErrSessionBusy = errors.New("supervisor: a cell of this session is running")
	// ErrSessionLimit: the caller, or the daemon, has as many sessions as it may.
	ErrSessionLimit = errors.New("supervisor: as many sessions are open as may be")
	// ErrSessionLost: the session's interpreter state is gone (a cell that could
	// not be rolled back, a worker that died); its answers said so.
	ErrSessionLost = errors.New("supervisor: the session's interpreter state is lost")
)

// SessionOpener starts a session's worker; *sandbox.Spawner is the real one.
type SessionOpener interface {
	OpenSession(ctx context.Context, req protocol.Request) (*sandbox.Session, error)
}

var _ SessionOpener = (*sandbox.Spawner)(nil)

// SessionOptions configure Sessions.
type SessionOptions struct {
	// Max bounds the live sessions in all, MaxPerCaller those of one caller: each
	// holds a worker process and its interpreter's memory while it lives.
	Max, MaxPerCaller int
	// IdleTimeout ends a session that has run no cell for that long.
	IdleTimeout time.Duration
	// WorkDir holds the private workspaces of sessions that name none.
	WorkDir string
	// Quota bounds a session's workspace as it bounds a run's (see
	// Options.WorkspaceQuota); zero: no bound.
	Quota workspace.Quota
	// Running bounds the cells running at once, in all sessions (more wait for a
	// place, within their request); 0: Max. The daemon gives the number of runs
	// that may run at once: cells and runs each have that many places.
	Running int
}

// MaxSessionMemoryBytes bounds a session's memory limit (1 GiB): its worker holds
// the interpreter's memory and a checkpoint of it, up to twice the limit, for as
// long as the session lives.
const MaxSessionMemoryBytes = 1 << 30

// MaxCellOutputBytes bounds each stream of a cell, whatever the session's limits
// (16 MiB): the daemon holds a running cell's output until it answers; a program
// with more to say writes it to a file of the workspace.
const MaxCellOutputBytes = 16 << 20

// Sessions keeps the live sessions of the daemon: each is one hardened worker for
// one caller and one workspace (see sandbox.Session), ended by Close, by its idle
// timeout, or by Shutdown; one whose state was lost (said in its answers) stays,
// answering ErrSessionLost, until one of those ends it.
type Sessions struct {
	opener SessionOpener
	o      SessionOptions

	mu       sync.Mutex
	live     map[string]*Session
	stopping bool
	stop     chan struct{}
	running  chan struct{} // a place per cell running (see SessionOptions.Running)
}

// Session is one live session.
type Session struct {
	ID        string
	Caller    Caller
	Workspace string // the named workspace's id, or "" for a private one
	Created   time.Time
	// Limits are the session's: MemoryBytes and Fuel for its whole life, the rest
	// each cell's defaults.
	Limits protocol.Limits

	ss      *sandbox.Session
	workDir string           // the workspace's directory
	private string           // the private workspace's directory, removed at the end
	onEnd   func(why string) // called once: with why the session ended, or "" when it never opened
	busy    atomic.Bool
	mu      sync.Mutex
	cells   int
	used    time.Time
	lost    string
	closed  bool
}

// NewSessions returns a keeper of sessions opened with opener.
func NewSessions(opener SessionOpener, o SessionOptions) (*Sessions, error) {
	if o.Max < 1 || o.MaxPerCaller < 1 || o.IdleTimeout <= 0 {
		return nil, fmt.Errorf("supervisor: session options %+v", o)
	}
	if o.WorkDir != "" {
		workspace.RemoveTree(o.WorkDir) // left by a daemon that died
		if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
			return nil, fmt.Errorf("supervisor: %w", err)
		}
	}
	if o.Running <= 0 {
		o.Running = o.Max
	}
	m := &Sessions{opener: opener, o: o, live: map[string]*Session{}, stop: make(chan struct{}),
		running: make(chan struct{}, o.Running)}
	go m.reap()
	return m, nil
}

// Open starts a session for caller with req (a run's request without a program;
// an empty req.Workspace gets a private workspace, removed when the session ends),
// naming the named workspace wsID ("" for none); onEnd (not nil) is called once
// with why the session ended ("closed by its caller", "idle for 10m0s", "the daemon
// stopped"), or with "" at once when it does not open. Errors: ErrSessionLimit,
// ErrStopping, or why the worker could not open it (sandbox.ErrBadRequest wrapped
// for a request no worker can serve).
func (m *Sessions) Open(ctx context.Context, req protocol.Request, caller Caller, wsID string, onEnd func(why string)) (*Session, error) {
	m.mu.Lock()
	if m.stopping {
		m.mu.Unlock()
		onEnd("")
		return nil, ErrStopping
	}
	mine := 0
	for _, s := range m.live {
		if s.Caller == caller {
			mine++
		}
	}
	if len(m.live) >= m.o.Max || mine >= m.o.MaxPerCaller {
		m.mu.Unlock()
		onEnd("")
		return nil, fmt.Errorf("%w (%d per caller, %d in all)", ErrSessionLimit, m.o.MaxPerCaller, m.o.Max)
	}
	s := &Session{ID: ulid.MustNew(ulid.Now(), rand.Reader).String(), Caller: caller, Workspace: wsID,
		Created: time.Now().UTC(), Limits: req.Limits, onEnd: onEnd}
	s.used = s.Created
	s.busy.Store(true) // opening: no cell, no close, until it is open
	m.live[s.ID] = s   // reserves its place
	m.mu.Unlock()

	forget := func() {
		m.mu.Lock()
		delete(m.live, s.ID)
		m.mu.Unlock()
		if s.private != "" {
			workspace.RemoveTree(s.private)
		}
		onEnd("")
	}
	if req.Workspace == "" {
		dir, err := os.MkdirTemp(m.o.WorkDir, s.ID+"-")
		if err != nil {
			forget()
			return nil, fmt.Errorf("cannot create the session's workspace: %w", err)
		}
		s.private, req.Workspace = dir, dir
	}
	if m.o.Quota.Bytes > 0 {
		req.Hardening.Rlimits.FSIZE = min(req.Hardening.Rlimits.FSIZE, uint64(m.o.Quota.Bytes))
	}
	ss, err := m.opener.OpenSession(ctx, req)
	if err != nil {
		forget()
		return nil, err
	}
	s.ss = ss
	s.workDir = req.Workspace
	s.busy.Store(false)
	return s, nil
}

// Get returns caller's session id, or ErrSessionNotFound.
func (m *Sessions) Get(id string, caller Caller) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.live[id]
	if !ok || s.Caller != caller || s.ss == nil {
		return nil, ErrSessionNotFound
	}
	return s, nil
}

// List returns caller's sessions, oldest first.
func (m *Sessions) List(caller Caller) []*Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Session
	for _, s := range m.live {
		if s.Caller == caller && s.ss != nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Count is how many sessions are live.
func (m *Sessions) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

// View is s as the API shows it.
func (s *Session) View() wire.SessionView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := wire.SessionView{ID: s.ID, Workspace: s.Workspace, CreatedAt: s.Created, LastUsed: s.used, Cells: s.cells,
		State: "ready", Lost: s.lost, Enforcement: s.ss.Enforcement()}
	switch {
	case s.lost != "":
		v.State = "lost"
	case s.busy.Load():
		v.State = "busy"
	}
	return v
}

// Cell runs one cell in caller's session id (see sandbox.Session.Run for what cell
// carries), measuring its workspace against the quota as a run's, and says what
// became of the state. Errors: ErrSessionNotFound, ErrSessionBusy, ErrSessionLost
// (the state was lost before this cell), the cell's own bad input
// (sandbox.ErrBadRequest wrapped), or admitted's error. admitted is called once the
// cell holds the session, before it runs (the audit record that must precede it).
func (m *Sessions) Cell(ctx context.Context, id string, caller Caller, cell protocol.Request, admitted func() error) (protocol.Result, wire.SessionState, error) {
	s, err := m.Get(id, caller)
	if err != nil {
		return protocol.Result{}, "", err
	}
	if !s.busy.CompareAndSwap(false, true) {
		return protocol.Result{}, "", ErrSessionBusy
	}
	defer s.busy.Store(false)
	s.mu.Lock()
	lost, closed := s.lost, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return protocol.Result{}, "", ErrSessionNotFound
	case lost != "":
		return protocol.Result{}, "", fmt.Errorf("%w: %s", ErrSessionLost, lost)
	}
	var w *workspace.Workspace
	if m.o.Quota.Bytes > 0 && m.o.Quota.Files > 0 {
		if w, err = workspace.Directory(s.workDir, m.o.Quota); err != nil {
			return protocol.Result{}, "", err
		}
		// A workspace already past its quota would end the cell at once.
		if over, u, err := w.OverQuota(); err != nil || over {
			if err == nil {
				err = fmt.Errorf("%w: the session's workspace holds %d bytes in %d names, over its quota of %d bytes and %d names: remove files first",
					workspace.ErrQuota, u.Bytes, u.Files, m.o.Quota.Bytes, m.o.Quota.Files)
			}
			return protocol.Result{}, "", err
		}
	}
	cell.Limits.MaxStdoutBytes = min(cell.Limits.MaxStdoutBytes, MaxCellOutputBytes)
	cell.Limits.MaxStderrBytes = min(cell.Limits.MaxStderrBytes, MaxCellOutputBytes)
	select {
	case m.running <- struct{}{}:
		defer func() { <-m.running }()
	case <-ctx.Done():
		return protocol.Result{}, "", ctx.Err()
	}
	if err := admitted(); err != nil {
		return protocol.Result{}, "", err
	}
	if w != nil {
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		var pid atomic.Int64
		pid.Store(int64(s.ss.PID()))
		go watchQuota(ctx, w, s.workDir, &pid, m.o.Quota, stop)
	}
	res, rolledBack, err := s.ss.Run(ctx, cell)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used = time.Now().UTC()
	if errors.Is(err, sandbox.ErrSessionLost) {
		s.lose(err.Error())
		return protocol.Result{}, "", fmt.Errorf("%w: %s", ErrSessionLost, s.lost)
	}
	if err != nil {
		return protocol.Result{}, "", err
	}
	s.cells++
	switch {
	case rolledBack:
		return res, wire.SessionRolledBack, nil
	case res.Reason != protocol.Exited:
		s.lose(fmt.Sprintf("cell %d ended %s and the state could not be restored", s.cells, res.Reason))
		return res, wire.SessionLost, nil
	}
	return res, wire.SessionPreserved, nil
}

// lose records why s's state is gone and ends its worker; s.mu is held.
func (s *Session) lose(why string) {
	if s.lost == "" {
		s.lost = why
		go s.ss.Close()
	}
}

// Close ends caller's session id: its worker and its private workspace. Errors:
// ErrSessionNotFound, ErrSessionBusy (a cell is running: cancel it by ending its
// request, or wait).
func (m *Sessions) Close(id string, caller Caller) error {
	s, err := m.Get(id, caller)
	if err != nil {
		return err
	}
	if !s.busy.CompareAndSwap(false, true) {
		return ErrSessionBusy
	}
	m.end(s, "closed by its caller")
	return nil
}

// end removes s (held busy by the caller, or being shut down) and ends it, for why.
func (m *Sessions) end(s *Session, why string) {
	m.mu.Lock()
	delete(m.live, s.ID)
	m.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.ss.Close()
	if s.private != "" {
		workspace.RemoveTree(s.private)
	}
	s.onEnd(why)
}

// reap ends the sessions idle past IdleTimeout, every tenth of it. A lost session
// stays until then too, so that whoever asks of it is told it was lost.
func (m *Sessions) reap() {
	t := time.NewTicker(max(m.o.IdleTimeout/10, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		var idle []*Session
		for _, s := range m.live {
			s.mu.Lock()
			if s.ss != nil && time.Since(s.used) > m.o.IdleTimeout && s.busy.CompareAndSwap(false, true) {
				idle = append(idle, s)
			}
			s.mu.Unlock()
		}
		m.mu.Unlock()
		for _, s := range idle {
			m.end(s, fmt.Sprintf("idle for %s", m.o.IdleTimeout))
		}
	}
}

// Shutdown ends every session (a running cell is killed with its worker) and
// refuses new ones.
func (m *Sessions) Shutdown() {
	m.mu.Lock()
	if m.stopping {
		m.mu.Unlock()
		return
	}
	m.stopping = true
	close(m.stop)
	all := make([]*Session, 0, len(m.live))
	for _, s := range m.live {
		if s.ss != nil {
			all = append(all, s)
		}
	}
	m.mu.Unlock()
	for _, s := range all {
		m.end(s, "the daemon stopped")
	}
}
