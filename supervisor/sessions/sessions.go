// Package sessions keeps the daemon's interpreter sessions: a worker whose
// interpreter lives across cells, bounded in number (in all and per caller), in
// memory and in idle time. Its life:
//
//	          Open                      Cell (one at a time)
//	caller ─────────▶ live ◀──────────────────────────────┐
//	                  │  │  cell: preserved | rolled_back   │
//	   Fork (a copy,  │  │  (the worker's checkpoint)       │
//	   its workspace  │  └──────────────────────────────────┘
//	   copied too) ◀──┤
//	                  │ pause (idle, over the memory budget, the daemon's stop):
//	                  │ the state to STATE/sessions/ID/checkpoint, the worker ends
//	                  ▼
//	                paused ──── Cell, or the next daemon's start ───▶ live
//	                  │         (resumed: the cell says restored)
//	                  ▼
//	   lost (a cell that could not be rolled back, a checkpoint that could not be
//	   resumed: every later cell is ErrLost, saying why), closed (its caller, its
//	   idle timeout): its worker, checkpoint and fork's workspace are removed.
//
// Each path reads top to bottom in its own file: sessions.go the life around the
// others (open, a worker attached and detached, close, the idle reaper, the
// memory budget, shutdown); cell.go a cell (resuming a paused session first);
// pause.go pause and resume (the checkpoint file, the records that survive a
// restart, a failed pause held off); fork.go a fork (its workspace copied). A native session (a process, not a snapshot) is
// never paused or forked. It is driven by the API and assembled by the daemon;
// it never imports runs, approvals or the API.
package sessions

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// Errors of a Manager.
var (
	// ErrStopping: the daemon is stopping; no session is opened, resumed or forked,
	// and no cell runs.
	ErrStopping = errors.New("supervisor: shutting down")
	// ErrNotFound: no such session, or another caller's (the same to them).
	ErrNotFound = errors.New("supervisor: no such session")
	// ErrBusy: a cell of the session is running.
	ErrBusy = errors.New("supervisor: a cell of this session is running")
	// ErrLimit: the caller, or the daemon, has as many sessions as it may.
	ErrLimit = errors.New("supervisor: as many sessions are open as may be")
	// ErrLost: the session's interpreter state is gone (a cell that could
	// not be rolled back, a worker that died); its answers said so.
	ErrLost = errors.New("supervisor: the session's interpreter state is lost")
)

// Opener starts a session's worker, afresh or from a checkpoint file;
// *sandbox.Spawner is the real one.
type Opener interface {
	OpenSession(ctx context.Context, req protocol.Request) (*sandbox.Session, error)
	ResumeSession(ctx context.Context, req protocol.Request, from io.Reader) (*sandbox.Session, error)
}

var _ Opener = (*sandbox.Spawner)(nil)

// Options configure Manager.
type Options struct {
	// Max bounds the sessions in all, live or paused, MaxPerCaller those of one
	// caller: each holds a worker and its interpreter's memory, or a checkpoint on
	// disk.
	Max, MaxPerCaller int
	// IdleTimeout ends a session that has run no cell for that long, paused or not.
	IdleTimeout time.Duration
	// PauseAfter pauses a live session that has run no cell for that long: its
	// state goes to a checkpoint file and its worker ends; its next cell resumes it.
	// 0: sessions are paused only past MemoryBudget and when the daemon stops.
	PauseAfter time.Duration
	// MemoryBudget bounds the interpreter memory of the live sessions together, in
	// bytes (each as its cells have grown it; its worker holds about twice that
	// with its checkpoint): past it the least recently used idle ones are paused. 0:
	// no bound.
	MemoryBudget int64
	// MaxPausedBytesPerCaller bounds the checkpoint files of one caller's paused
	// sessions, in bytes; a session that would pass it stays live. 0: no bound.
	MaxPausedBytesPerCaller int64
	// WorkDir holds a directory per session: its record, its checkpoint while it is
	// paused, its private workspace. Sessions found there when the daemon starts are
	// taken back (see Start). Empty: no session is ever paused, and each private
	// workspace is a temporary directory (the local MCP server).
	WorkDir string
	// Quota bounds a session's workspace as it bounds a run's (see
	// Options.WorkspaceQuota); zero: no bound.
	Quota workspace.Quota
	// Running bounds the cells running at once, in all sessions (more wait for a
	// place, within their request); 0: Max. The daemon gives the number of runs
	// that may run at once: cells and runs each have that many places.
	Running int
	// Interpreter names the interpreter sessions run (its build: see
	// bundle.CheckpointKey). A checkpoint is one interpreter's memory: a session paused
	// under another (the daemon was upgraded with a new one) is lost, and says so.
	Interpreter string
	// Prepare gives a session being resumed the module, library and hardening the
	// daemon runs with now (its limits, environment and workspace stay its own).
	// Required with WorkDir.
	Prepare func(req *protocol.Request) error
	// Log hears of each pause that failed (the session stays live; see pauseDue);
	// nil discards it.
	Log *slog.Logger
}

// Hooks connect Manager to the rest of the daemon (see Start).
type Hooks struct {
	// Acquire marks named workspace id in use by a session's worker while it lives
	// (not while it is paused), and returns how to give it back. Nil: nothing is
	// marked.
	Acquire func(id string) (release func(), err error)
	// Event is told what became of a session: Paused, Resumed,
	// Lost or Closed, with details. Nil: nothing is told.
	Event func(s *Session, event Event, detail map[string]any)
}

// Event is a session's change of life that Hooks.Event hears of.
type Event string

// The session events.
const (
	// Paused: its state went to its checkpoint file, its worker ended
	// (detail: why, bytes, ms).
	Paused Event = "paused"
	// Resumed: a worker took it back from its checkpoint (detail: ms).
	Resumed Event = "resumed"
	// Lost: its state is gone, outside any cell (detail: why).
	Lost Event = "lost"
	// Closed: it ended (detail: why: its caller, its idle timeout).
	Closed Event = "closed"
)

// MaxMemoryBytes bounds a session's memory limit (1 GiB): its worker holds
// the interpreter's memory and a checkpoint of it, up to twice the limit, for as
// long as the session lives.
const MaxMemoryBytes = 1 << 30

// MaxCellOutputBytes bounds each stream of a cell, whatever the session's limits
// (16 MiB): the daemon holds a running cell's output until it answers; a program
// with more to say writes it to a file of the workspace.
const MaxCellOutputBytes = 16 << 20

// Manager keeps the daemon's sessions: each is one hardened worker for one caller
// and one workspace (see sandbox.Session) while it is live, or a checkpoint file
// while it is paused; it ends by Close or by its idle timeout. One whose state was
// lost (said in its answers) stays, answering ErrLost, until one of those
// ends it.
type Manager struct {
	opener Opener
	o      Options
	hooks  Hooks

	mu       sync.Mutex
	live     map[string]*Session             // every session, live or not
	pausing  map[identity.Caller]*sync.Mutex // one pause at a time per caller (see pause)
	stopping bool
	stopped  atomic.Bool    // stopping, read without mu
	closing  sync.WaitGroup // workers being ended in the background (see detach)
	stop     chan struct{}
	running  chan struct{} // a place per cell running (see Options.Running)
	// failed counts the pauses that failed, by reason (see PauseFailures).
	failed [len(pauseReasons)]atomic.Int64
}

// Session is one session of Manager.
type Session struct {
	ID        string
	Caller    identity.Caller
	Workspace string // the named workspace's id, or "" for a private one
	Created   time.Time
	// Limits are the session's: MemoryBytes and Fuel for its whole life, the rest
	// each cell's defaults.
	Limits protocol.Limits
	// ForkedFrom is the session this one was forked from, if it was.
	ForkedFrom string

	req     protocol.Request // what its worker is opened with
	dir     string           // its directory under WorkDir; "" without one
	private string           // its private workspace, removed with it
	busy    atomic.Bool
	mu      sync.Mutex
	ss      *sandbox.Session // nil while paused
	release func()           // gives its named workspace back; nil when not held
	closing *sync.WaitGroup  // its Manager's: a worker ended in the background is counted
	running bool             // a cell is running in its worker
	cells   int
	used    time.Time
	lost    string
	closed  bool
	paused  bool      // its state is in its checkpoint file
	saved   int64     // the checkpoint file's bytes, while paused
	memory  int64     // its interpreter's memory, as its cells grew it
	resumed time.Time // when a worker last took it back from its checkpoint
	// restored says the next answer is the first since resumed: it says restored.
	restored bool
	// reseed says its state is its source's as forked, random sources and all: a
	// worker that takes it up reseeds them at the next cell (protocol.Request.Fork),
	// until a cell keeps its state.
	reseed bool
	// failed is why its last pause failed, while it is live; nil when it has not
	// failed since it was last paused. It holds off the next pause (see pauseDue).
	failed *wire.PauseFailure
}

// WorkspaceDir is the host directory the session's cells get as /ws: its named
// workspace's, or its private one.
func (s *Session) WorkspaceDir() string { return s.req.Workspace }

// Env is the environment the session was opened with (every cell's).
func (s *Session) Env() map[string]string { return maps.Clone(s.req.Env) }

// New returns a keeper of sessions opened with opener; Start it.
func New(opener Opener, o Options) (*Manager, error) {
	if o.Max < 1 || o.MaxPerCaller < 1 || o.IdleTimeout <= 0 || o.PauseAfter < 0 || o.MemoryBudget < 0 ||
		o.MaxPausedBytesPerCaller < 0 || (o.WorkDir != "" && o.Prepare == nil) {
		return nil, fmt.Errorf("supervisor: session options %+v", o)
	}
	if o.WorkDir != "" {
		if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
			return nil, fmt.Errorf("supervisor: %w", err)
		}
	}
	if o.Running <= 0 {
		o.Running = o.Max
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{opener: opener, o: o, live: map[string]*Session{}, pausing: map[identity.Caller]*sync.Mutex{},
		stop: make(chan struct{}), running: make(chan struct{}, o.Running)}, nil
}

// Start takes back the sessions WorkDir holds (those the daemon paused when it
// last stopped come back paused; one it did not pause, because it was killed,
// comes back lost, and says so) and starts expiring and pausing idle sessions.
// hooks are every session's, those taken back included. Call it once, before any
// other method.
func (m *Manager) Start(hooks Hooks) {
	m.hooks = hooks
	if m.o.WorkDir != "" {
		m.load()
	}
	go m.reap()
}

// event tells hooks.Event of s's change.
func (m *Manager) event(s *Session, e Event, detail map[string]any) {
	if m.hooks.Event != nil {
		m.hooks.Event(s, e, detail)
	}
}

// Open starts a session for caller with req (a run's request without a program;
// an empty req.Workspace gets a private workspace, removed when the session ends),
// naming the named workspace wsID ("" for none), which it marks in use (see
// Hooks.Acquire) while its worker lives. Errors: ErrLimit,
// ErrStopping, the hook's, or why the worker could not open it
// (sandbox.ErrBadRequest wrapped for a request no worker can serve).
func (m *Manager) Open(ctx context.Context, req protocol.Request, caller identity.Caller, wsID string) (*Session, error) {
	s, err := m.reserve(caller, req, wsID)
	if err != nil {
		return nil, err
	}
	if err := m.give(s, req.Workspace == "", nil); err != nil {
		m.forget(s)
		return nil, err
	}
	if err := m.attach(ctx, s, func(req protocol.Request) (*sandbox.Session, error) { return m.opener.OpenSession(ctx, req) }); err != nil {
		m.forget(s)
		return nil, err
	}
	m.ready(s)
	return s, nil
}

// ready ends the opening of s (a new session or a fork): persisted, its idle time
// counted from now (not from when it was reserved: a worker slow to start on a
// loaded machine must not make it due for a pause before its answer), open to
// cells.
func (m *Manager) ready(s *Session) {
	s.mu.Lock()
	s.used = time.Now().UTC()
	s.mu.Unlock()
	m.persist(s)
	s.busy.Store(false)
}

// reserve makes caller's new session s, held busy, counted within the bounds.
func (m *Manager) reserve(caller identity.Caller, req protocol.Request, wsID string) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping {
		return nil, ErrStopping
	}
	mine := 0
	for _, s := range m.live {
		if s.Caller == caller {
			mine++
		}
	}
	if len(m.live) >= m.o.Max || mine >= m.o.MaxPerCaller {
		return nil, fmt.Errorf("%w (%d per caller, %d in all)", ErrLimit, m.o.MaxPerCaller, m.o.Max)
	}
	s := &Session{ID: ulid.MustNew(ulid.Now(), rand.Reader).String(), Caller: caller, Workspace: wsID,
		Created: time.Now().UTC(), Limits: req.Limits, req: req, closing: &m.closing}
	s.used = s.Created
	s.busy.Store(true) // opening: no cell, no close, until it is open
	m.live[s.ID] = s   // reserves its place
	return s, nil
}

// give makes s's directory and, when private, its private workspace: empty, or a
// copy of the directory from (a fork's).
func (m *Manager) give(s *Session, private bool, from *string) error {
	if m.o.WorkDir != "" {
		s.dir = filepath.Join(m.o.WorkDir, s.ID)
		if err := os.Mkdir(s.dir, 0o700); err != nil {
			return fmt.Errorf("cannot create the session's directory: %w", err)
		}
	}
	if !private {
		return nil
	}
	var err error
	if s.dir != "" {
		s.private = filepath.Join(s.dir, "ws")
		err = os.Mkdir(s.private, 0o700)
	} else {
		s.private, err = os.MkdirTemp("", "sandcell-session-")
	}
	if err != nil {
		return fmt.Errorf("cannot create the session's workspace: %w", err)
	}
	s.req.Workspace = s.private
	if from != nil {
		return copyWorkspace(s.private, *from, m.o.Quota)
	}
	return nil
}

// forget drops s, which never opened, with what it holds on disk.
func (m *Manager) forget(s *Session) {
	m.mu.Lock()
	delete(m.live, s.ID)
	m.mu.Unlock()
	m.remove(s)
}

// remove deletes s's directory (its record, checkpoint and private workspace).
func (m *Manager) remove(s *Session) {
	if s.dir != "" {
		workspace.RemoveTree(s.dir)
	} else if s.private != "" {
		workspace.RemoveTree(s.private)
	}
}

// attach gives s (held busy) a worker by start, with its named workspace held for
// it, and the quota's file-size bound.
func (m *Manager) attach(ctx context.Context, s *Session, start func(protocol.Request) (*sandbox.Session, error)) error {
	var release func()
	if s.Workspace != "" && m.hooks.Acquire != nil {
		var err error
		if release, err = m.hooks.Acquire(s.Workspace); err != nil {
			return err
		}
	}
	req := s.req
	if m.o.Quota.Bytes > 0 {
		req.Hardening.Rlimits.FSIZE = min(req.Hardening.Rlimits.FSIZE, uint64(m.o.Quota.Bytes))
	}
	if m.o.Quota.Bytes > 0 && m.o.Quota.Files > 0 {
		req.WorkspaceQuota = m.o.Quota.Bytes // as a run's (see runs.Manager.work); its cells are measured the same way
	}
	ss, err := start(req)
	if err != nil {
		if release != nil {
			release()
		}
		return err
	}
	s.mu.Lock()
	s.ss, s.release = ss, release
	s.mu.Unlock()
	return nil
}

// detach ends s's worker and gives its workspace back once the worker has exited
// (in the background: its exit may take a moment, unmapping its memory); s.mu is
// held. Not before: approved code may take the workspace alone as soon as it is
// given back, and a dying worker must not write to it then.
func (s *Session) detach() {
	ss, release := s.ss, s.release
	s.ss, s.release = nil, nil
	switch {
	case ss != nil:
		s.closing.Add(1)
		go func() {
			defer s.closing.Done()
			ss.Close()
			if release != nil {
				release()
			}
		}()
	case release != nil:
		release()
	}
}

// Get returns caller's session id, or ErrNotFound.
func (m *Manager) Get(id string, caller identity.Caller) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.live[id]
	if !ok || s.Caller != caller || s.opening() {
		return nil, ErrNotFound
	}
	return s, nil
}

// opening says s has not opened yet (nor been taken back).
func (s *Session) opening() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ss == nil && !s.paused && s.lost == "" && !s.closed
}

// List returns caller's sessions, oldest first.
func (m *Manager) List(caller identity.Caller) []*Session {
	m.mu.Lock()
	var out []*Session
	for _, s := range m.live {
		if s.Caller == caller {
			out = append(out, s)
		}
	}
	m.mu.Unlock()
	out = slices.DeleteFunc(out, (*Session).opening)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Count is how many sessions there are, live or paused.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

// View is s as the API shows it.
func (s *Session) View() wire.SessionView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := wire.SessionView{ID: s.ID, Workspace: s.Workspace, CreatedAt: s.Created, LastUsed: s.used, Cells: s.cells,
		State: "ready", Lost: s.lost, ForkedFrom: s.ForkedFrom, MemoryBytes: s.memory}
	if !s.resumed.IsZero() {
		at := s.resumed
		v.RestoredAt = &at
	}
	if s.ss != nil {
		v.Enforcement = s.ss.Enforcement()
		if f := s.failed; f != nil && s.lost == "" {
			c := *f
			if c.NextTryAt != nil {
				at := *c.NextTryAt
				c.NextTryAt = &at
			}
			v.PauseFailed = &c
		}
	}
	switch {
	case s.lost != "":
		v.State = "lost"
	case s.busy.Load():
		v.State = "busy"
	case s.paused:
		v.State, v.CheckpointBytes = "paused", s.saved
	}
	return v
}

// lose records why s's state is gone and ends its worker; s.mu is held.
func (s *Session) lose(why string) {
	if s.lost == "" {
		s.lost = why
		s.detach()
	}
}

// Close ends caller's session id: its worker, its checkpoint and its private
// workspace. Errors: ErrNotFound, ErrBusy (a cell is running: cancel
// it by ending its request, or wait).
func (m *Manager) Close(id string, caller identity.Caller) error {
	s, err := m.Get(id, caller)
	if err != nil {
		return err
	}
	if !s.busy.CompareAndSwap(false, true) {
		return ErrBusy
	}
	m.end(s, "closed by its caller")
	return nil
}

// end removes s (held busy by the caller) and ends it, for why.
func (m *Manager) end(s *Session, why string) {
	m.mu.Lock()
	delete(m.live, s.ID)
	m.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	ss, release := s.ss, s.release
	s.ss, s.release = nil, nil
	s.mu.Unlock()
	if ss != nil {
		ss.Close() // the worker has exited: nothing of it can write to the workspace now
	}
	if release != nil {
		release()
	}
	m.remove(s)
	m.event(s, Closed, map[string]any{"why": why})
}

// reap, every tenth of the shorter of IdleTimeout and PauseAfter, ends the
// sessions idle past IdleTimeout (a lost one stays until then too, so that whoever
// asks of it is told it was lost) and pauses the live ones idle past PauseAfter
// (those whose last pause failed when their next is due: see pauseDue).
func (m *Manager) reap() {
	every := m.o.IdleTimeout
	pausing := m.o.PauseAfter > 0 && m.o.WorkDir != ""
	if pausing {
		every = min(every, m.o.PauseAfter)
	}
	t := time.NewTicker(max(every/10, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		var idle, pause []*Session
		for _, s := range m.all() {
			s.mu.Lock()
			since, live := time.Since(s.used), s.ss != nil
			s.mu.Unlock()
			switch {
			case since > m.o.IdleTimeout && s.busy.CompareAndSwap(false, true):
				idle = append(idle, s)
			case live && pausing && since > m.o.PauseAfter && m.pauseDue(s) && s.busy.CompareAndSwap(false, true):
				pause = append(pause, s)
			}
		}
		for _, s := range idle {
			m.end(s, fmt.Sprintf("idle for %s", m.o.IdleTimeout))
		}
		for _, s := range pause {
			m.pause(s, fmt.Sprintf("idle for %s", m.o.PauseAfter))
			s.busy.Store(false)
		}
	}
}

// all returns every session.
func (m *Manager) all() []*Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Session, 0, len(m.live))
	for _, s := range m.live {
		out = append(out, s)
	}
	return out
}

// budget pauses the least recently used idle live sessions while the live ones'
// memory is past MemoryBudget.
func (m *Manager) budget() {
	if m.o.MemoryBudget <= 0 || m.o.WorkDir == "" {
		return
	}
	type held struct {
		s      *Session
		used   time.Time
		memory int64
	}
	var live []held
	var total int64
	for _, s := range m.all() {
		s.mu.Lock()
		if s.ss != nil {
			live = append(live, held{s, s.used, s.memory})
			total += s.memory
		}
		s.mu.Unlock()
	}
	sort.Slice(live, func(i, j int) bool { return live[i].used.Before(live[j].used) })
	for _, h := range live {
		if total <= m.o.MemoryBudget {
			return
		}
		if !m.pauseDue(h.s) || !h.s.busy.CompareAndSwap(false, true) {
			continue
		}
		if m.pause(h.s, fmt.Sprintf("the live sessions' memory passed its budget of %d bytes", m.o.MemoryBudget)) == nil {
			total -= h.memory
		}
		h.s.busy.Store(false)
	}
}

// shutdownWait bounds how long Shutdown waits for a session held for anything but
// a running cell (opening, resuming, pausing, forking) to be let go.
const shutdownWait = 10 * time.Second

// Shutdown refuses new sessions and cells, and pauses the live sessions (with no
// WorkDir they end). A session whose cell is running is ended with its worker
// (the cell's answer says the state is lost); one held for anything else is
// waited for, within shutdownWait, and then paused, or ended with its worker
// (lost, and said). Every worker has ended when it returns.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	if m.stopping {
		m.mu.Unlock()
		return
	}
	m.stopping = true
	m.stopped.Store(true)
	close(m.stop)
	m.mu.Unlock()
	deadline := time.Now().Add(shutdownWait)
	var wg sync.WaitGroup
	handled := map[*Session]bool{}
	// Until every session has been seen: one that was opening (or being forked)
	// when the stop began is in the next pass (no new one opens from now on).
	for {
		var todo []*Session
		for _, s := range m.all() {
			if !handled[s] {
				todo = append(todo, s)
				handled[s] = true
			}
		}
		if len(todo) == 0 {
			break
		}
		m.shutdownEach(todo, deadline, &wg)
	}
	wg.Wait()
	m.closing.Wait()
}

// shutdownEach is Shutdown's work on sessions, within deadline; pauses are added to
// wg.
func (m *Manager) shutdownEach(sessions []*Session, deadline time.Time, wg *sync.WaitGroup) {
	// Running cells first, all at once: they end with their workers (their answers
	// say the state is lost), and the cells queued behind them hear the stop.
	for _, s := range sessions {
		s.mu.Lock()
		if s.running && s.ss != nil {
			s.lost = cmp.Or(s.lost, "the daemon stopped while a cell ran")
			ss := s.ss
			m.closing.Add(1)
			go func() { defer m.closing.Done(); ss.Close() }()
		}
		s.mu.Unlock()
	}
	for _, s := range sessions {
		held := false
		for !held && time.Now().Before(deadline) {
			if held = s.busy.CompareAndSwap(false, true); !held {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if !held {
			// Held past the deadline (a resume, a fork that does not end): its worker
			// ends with the daemon, and it says so.
			s.mu.Lock()
			if ss := s.ss; ss != nil {
				s.lost = cmp.Or(s.lost, "the daemon stopped while it was busy")
				m.closing.Add(1)
				go func() { defer m.closing.Done(); ss.Close() }()
			}
			s.mu.Unlock()
			m.persist(s)
			continue
		}
		s.mu.Lock()
		live := s.ss != nil && s.lost == ""
		s.mu.Unlock()
		switch {
		case m.o.WorkDir == "":
			s.mu.Lock()
			s.detach()
			s.mu.Unlock()
			m.remove(s)
		case live:
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := m.pause(s, "the daemon stopped"); err != nil {
					s.mu.Lock()
					s.lose("the daemon stopped and could not pause it: " + err.Error())
					s.mu.Unlock()
					m.persist(s)
					m.event(s, Lost, map[string]any{"why": s.lost})
				}
			}()
		default:
			// Paused already, or lost: its record says so. It stays held: nothing
			// more happens to it in this daemon.
			s.mu.Lock()
			s.detach()
			s.mu.Unlock()
			m.persist(s)
		}
	}
}
