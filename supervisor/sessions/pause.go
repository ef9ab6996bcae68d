package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// A session's directory under Options.WorkDir holds:
//
//	session.json  its record (sessionRecord), rewritten as it changes
//	checkpoint    its interpreter's state while it is paused (sandbox's checkpoint
//	              file), removed as soon as a worker takes it back: a daemon killed
//	              after that finds no stale state to resume, and says the session
//	              was lost
//	ws/           its private workspace, when it has one

const (
	recordName     = "session.json"
	checkpointName = "checkpoint"
)

// sessionRecord is what session.json holds.
type sessionRecord struct {
	ID          string           `json:"id"`
	Caller      identity.Caller  `json:"caller"`
	Workspace   string           `json:"workspace,omitempty"`
	ForkedFrom  string           `json:"forked_from,omitempty"`
	Created     time.Time        `json:"created"`
	Used        time.Time        `json:"used"`
	Cells       int              `json:"cells"`
	Memory      int64            `json:"memory_bytes"`
	Request     protocol.Request `json:"request"` // the worker's: limits, environment, workspace directory
	Interpreter string           `json:"interpreter"`
	// Paused says checkpoint holds the state (Saved bytes); Lost why it is gone.
	Paused bool   `json:"paused"`
	Saved  int64  `json:"saved_bytes,omitempty"`
	Lost   string `json:"lost,omitempty"`
	// Reseed: a fork whose random sources are still its source's (Session.reseed).
	Reseed bool `json:"reseed,omitempty"`
}

// persist writes s's record (atomically, renameio: a daemon killed meanwhile finds
// the old one or the new one). Without a directory it does nothing.
func (m *Manager) persist(s *Session) {
	if s.dir == "" {
		return
	}
	s.mu.Lock()
	r := sessionRecord{ID: s.ID, Caller: s.Caller, Workspace: s.Workspace, ForkedFrom: s.ForkedFrom, Created: s.Created,
		Used: s.used, Cells: s.cells, Memory: s.memory, Request: s.req, Interpreter: m.o.Interpreter,
		Paused: s.paused, Saved: s.saved, Lost: s.lost, Reseed: s.reseed}
	s.mu.Unlock()
	r.Request.Code, r.Request.Stdin = "", nil
	b, err := json.Marshal(r)
	if err == nil {
		err = renameio.WriteFile(filepath.Join(s.dir, recordName), b, 0o600)
	}
	_ = err // a record not written leaves the old one: at worst the session comes back lost
}

// load takes back the sessions of WorkDir (see Start): a directory without a
// readable record is removed; a session idle past IdleTimeout ends.
func (m *Manager) load() {
	entries, _ := os.ReadDir(m.o.WorkDir)
	for _, e := range entries {
		dir := filepath.Join(m.o.WorkDir, e.Name())
		var r sessionRecord
		b, err := os.ReadFile(filepath.Join(dir, recordName))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || r.ID != e.Name() || !e.IsDir() {
			workspace.RemoveTree(dir) // not a session's, or one that never opened
			continue
		}
		s := &Session{ID: r.ID, Caller: r.Caller, Workspace: r.Workspace, ForkedFrom: r.ForkedFrom, Created: r.Created,
			Limits: r.Request.Limits, req: r.Request, dir: dir, cells: r.Cells, used: r.Used, memory: r.Memory,
			lost: r.Lost, paused: r.Paused, saved: r.Saved, reseed: r.Reseed, closing: &m.closing}
		if r.Workspace == "" {
			s.private = filepath.Join(dir, "ws")
		}
		if time.Since(s.used) > m.o.IdleTimeout {
			m.remove(s)
			m.event(s, Closed, map[string]any{"why": fmt.Sprintf("idle for %s", m.o.IdleTimeout)})
			continue
		}
		_, err = os.Stat(filepath.Join(dir, checkpointName))
		switch {
		case s.lost != "":
		case !s.paused || err != nil:
			s.paused = false
			s.lost = "the daemon ended without pausing it (it was killed, or the machine stopped): its state was in its worker's memory only"
		case r.Interpreter != m.o.Interpreter:
			s.paused = false
			s.lost = "the daemon now runs another interpreter than the one the session was paused with (an upgrade): a checkpoint of one interpreter's memory cannot run in another"
		}
		if s.lost != "" && r.Lost == "" {
			os.Remove(filepath.Join(dir, checkpointName))
			m.persist(s)
			m.event(s, Lost, map[string]any{"why": s.lost})
		}
		m.live[s.ID] = s
	}
}

// pause saves s (held busy, live) to its checkpoint file and ends its worker, for
// why. It fails, leaving s live, when s has no directory, when the checkpoint
// would pass its caller's MaxPausedBytesPerCaller, or when it cannot be written
// (each failure is counted, logged, and shown in s's view: see pauseFailed); a
// worker that cannot give its checkpoint loses s.
func (m *Manager) pause(s *Session, why string) error {
	s.mu.Lock()
	ss := s.ss
	s.mu.Unlock()
	if s.dir == "" || ss == nil {
		return errors.New("the session cannot be paused here")
	}
	if s.req.Backend == protocol.BackendNative {
		// Not a failure to count or retry: a native session stays live until it
		// ends (idle_timeout, close), and the daemon's stop loses it, saying why.
		return sandbox.ErrNoCheckpoint
	}
	// One pause at a time per caller when its paused sessions are bounded (the
	// daemon's stop pauses all at once): each then counts what the others really
	// wrote.
	if m.o.MaxPausedBytesPerCaller > 0 {
		m.mu.Lock()
		one := m.pausing[s.Caller]
		if one == nil {
			one = &sync.Mutex{}
			m.pausing[s.Caller] = one
		}
		m.mu.Unlock()
		one.Lock()
		defer one.Unlock()
	}
	room := m.room(s)
	began := time.Now()
	path := filepath.Join(s.dir, checkpointName)
	f, err := os.OpenFile(path+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		m.pauseFailed(s, wire.PauseWriteFailed, err, 0)
		return err
	}
	w := &boundedWriter{f: f, room: room}
	n, err := ss.Save(w)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err != nil {
		os.Remove(path + ".tmp")
		switch {
		case errors.Is(err, sandbox.ErrSessionLost):
			m.pauseFailed(s, pauseLost, err, 0)
			s.mu.Lock()
			s.lose(err.Error())
			s.mu.Unlock()
			m.persist(s)
			m.event(s, Lost, map[string]any{"why": err.Error()})
		case errors.Is(err, errPauseRoom):
			m.pauseFailed(s, wire.PauseOverBound, err, w.need)
		default:
			m.pauseFailed(s, wire.PauseWriteFailed, err, 0)
		}
		return err
	}
	s.mu.Lock()
	s.detach()
	s.paused, s.saved, s.restored, s.failed = true, n, false, nil
	s.mu.Unlock()
	m.persist(s)
	m.event(s, Paused, map[string]any{"why": why, "bytes": n, "ms": time.Since(began).Milliseconds()})
	return nil
}

// room is what s's checkpoint may take: its caller's MaxPausedBytesPerCaller less
// the checkpoints of the caller's other paused sessions (MaxInt64: no bound).
func (m *Manager) room(s *Session) int64 {
	if m.o.MaxPausedBytesPerCaller <= 0 {
		return math.MaxInt64
	}
	room := m.o.MaxPausedBytesPerCaller
	for _, o := range m.all() {
		if o != s && o.Caller == s.Caller {
			o.mu.Lock()
			if o.paused {
				room -= o.saved
			}
			o.mu.Unlock()
		}
	}
	return max(room, 0)
}

// pauseLost is the reason PauseFailures counts a pause that lost its session (its
// worker could not give its checkpoint).
const pauseLost = "lost"

// pauseReasons are the reasons a pause fails, as PauseFailures counts them.
var pauseReasons = [...]string{wire.PauseOverBound, wire.PauseWriteFailed, pauseLost}

// PauseFailureReasons are the reasons PauseFailures takes: wire.PauseOverBound,
// wire.PauseWriteFailed, and "lost" (the session's worker could not give its
// checkpoint: the session is lost, and says so).
func PauseFailureReasons() []string { return pauseReasons[:] }

// PauseFailures is how many pauses have failed for reason since Start (the
// daemon's stop's included).
func (m *Manager) PauseFailures(reason string) int64 {
	for i, r := range pauseReasons {
		if r == reason {
			return m.failed[i].Load()
		}
	}
	return 0
}

// The backoff of a session whose checkpoint could not be written: it is tried
// again pauseBackoff after the first failure, then after twice as long each time,
// at most maxPauseBackoff apart. (A full state file system is not emptied by
// trying again at every tick of reap; each try reads the worker's whole memory.)
const (
	pauseBackoff    = time.Minute
	maxPauseBackoff = time.Hour
)

// pauseFailed counts, logs and records in s (its view shows it) that a pause of s
// failed for reason with err; need is, for wire.PauseOverBound, the bytes the
// checkpoint needs at least. The record holds off the next pause (see pauseDue).
func (m *Manager) pauseFailed(s *Session, reason string, err error, need int64) {
	for i, r := range pauseReasons {
		if r == reason {
			m.failed[i].Add(1)
		}
	}
	now := time.Now().UTC()
	f := &wire.PauseFailure{Reason: reason, Error: err.Error(), At: now, Failures: 1, NeedBytes: need}
	s.mu.Lock()
	if p := s.failed; p != nil && p.Reason == reason {
		f.Failures = p.Failures + 1
	}
	var then string
	switch {
	case m.stopped.Load():
		then = "the daemon is stopping: the session is lost"
	case reason == pauseLost:
		then = "the session is lost"
	case reason == wire.PauseOverBound:
		then = "the session stays live; it is not tried again before it runs another cell or its caller's paused sessions leave it the room"
	default:
		wait := pauseBackoff
		for i := 1; i < f.Failures && wait < maxPauseBackoff; i++ {
			wait *= 2
		}
		next := now.Add(min(wait, maxPauseBackoff))
		f.NextTryAt = &next
		then = "the session stays live; it is tried again at " + next.Format(time.RFC3339)
	}
	if reason != pauseLost {
		s.failed = f
	}
	s.mu.Unlock()
	attrs := []any{"session", s.ID, "uid", s.Caller.UID, "reason", reason, "error", err.Error(), "failures", f.Failures, "then", then}
	if s.Caller.Token != "" {
		attrs = append(attrs, "token", s.Caller.Token)
	}
	if reason == wire.PauseOverBound {
		attrs = append(attrs, "need_bytes", need, "max_paused_bytes_per_caller", m.o.MaxPausedBytesPerCaller)
	}
	m.o.Log.Warn("a session could not be paused", attrs...)
}

// pauseDue says s may be paused now, as far as its last failed pause goes: after
// a wire.PauseOverBound, when its caller's other paused sessions leave it what it
// needed (a cell run since forgets the failure: see Cell); after a
// wire.PauseWriteFailed, when its backoff has passed. Nothing else changes what a
// pause would find, so nothing else tries again.
func (m *Manager) pauseDue(s *Session) bool {
	s.mu.Lock()
	f := s.failed
	s.mu.Unlock()
	switch {
	case f == nil:
		return true
	case f.Reason == wire.PauseOverBound:
		return m.room(s) >= f.NeedBytes
	default:
		return f.NextTryAt == nil || !time.Now().Before(*f.NextTryAt)
	}
}

// errPauseRoom is boundedWriter's: the checkpoint would pass its caller's bound.
var errPauseRoom = errors.New("supervisor: the caller's paused sessions would pass sessions.max_paused_bytes_per_caller")

// boundedWriter writes to f at most room bytes; past them, need is what the
// checkpoint needs at least (what was written and the write refused).
type boundedWriter struct {
	f    *os.File
	room int64
	need int64
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > b.room {
		b.need += int64(len(p))
		return 0, errPauseRoom
	}
	b.room -= int64(len(p))
	b.need += int64(len(p))
	return b.f.Write(p)
}

// resume gives s (held busy) a worker again from its checkpoint file when it is
// paused; nothing when it is live. A checkpoint that cannot be restored loses s
// (ErrLost); another failure (its workspace busy, the worker refused)
// leaves it paused.
func (m *Manager) resume(ctx context.Context, s *Session) error {
	s.mu.Lock()
	paused := s.paused
	s.mu.Unlock()
	if !paused {
		return nil
	}
	began := time.Now()
	path := filepath.Join(s.dir, checkpointName)
	req := s.req
	if err := m.o.Prepare(&req); err != nil {
		return err
	}
	s.mu.Lock()
	s.req = req
	s.mu.Unlock()
	var err error
	gone := false // what the session needs is gone: it cannot come back
	if _, serr := os.Stat(s.req.Workspace); errors.Is(serr, fs.ErrNotExist) {
		// A named workspace is not held while its session is paused: deleted since.
		err, gone = fmt.Errorf("its workspace %s was deleted while it was paused", s.Workspace), true
	} else {
		err = m.attach(ctx, s, func(req protocol.Request) (*sandbox.Session, error) {
			f, err := os.Open(path)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", sandbox.ErrCheckpoint, err)
			}
			defer f.Close()
			s.mu.Lock()
			req.Fork = s.reseed
			s.mu.Unlock()
			return m.opener.ResumeSession(ctx, req, f)
		})
	}
	if gone || errors.Is(err, sandbox.ErrCheckpoint) {
		why := "it could not be resumed: " + err.Error()
		s.mu.Lock()
		s.paused = false
		s.lose(why)
		s.mu.Unlock()
		os.Remove(path)
		m.persist(s)
		m.event(s, Lost, map[string]any{"why": why})
		return fmt.Errorf("%w: %s", ErrLost, why)
	}
	if err != nil {
		return err
	}
	// From here the state is the worker's: a daemon killed now must not find the
	// checkpoint and resume a state older than the cells that follow.
	os.Remove(path)
	s.mu.Lock()
	s.paused, s.saved, s.resumed, s.restored = false, 0, time.Now().UTC(), true
	s.mu.Unlock()
	m.persist(s)
	m.event(s, Resumed, map[string]any{"ms": time.Since(began).Milliseconds()})
	return nil
}
