package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// Warm native workers. A native run's interpreter spends most of a short program's
// time importing the scientific stack (`import pandas` is about 0.45 s of CPU); a
// warm native worker has done that before its run is known. It is an ordinary native
// worker, hardened and verified exactly as a cold one for the workspace of a
// previous run (every layer in force, the contract sent, then the exec), whose
// runner imports NativeWarmOptions.Preimport and then waits for the program on its
// stdin, a pipe of the parent's. It has run no code of any caller: the next native
// run in the same workspace, with the same policy, claims it, and the parent lowers
// its CPU limit to the run's (counted from the claim) before it writes the program.
// Each worker serves one run and is then gone; a new one is prepared for the
// workspace after the run, in the background. A native session opened in the
// workspace may claim it instead (openSessionWarm: the parent sets the session's
// CPU limit and the runner serves cells), and leaves one prepared in turn.

// NativeWarmOptions configure warm native workers (see Spawner.WarmNative).
type NativeWarmOptions struct {
	// Size is how many idle warm native workers are kept, at most one per workspace,
	// for the workspaces of the latest native runs; 0 turns them off. Each holds
	// its imports in memory (numpy, pandas and matplotlib: about 95 MiB resident,
	// 60 MiB of it its own).
	Size int
	// Preimport are the modules each worker imports before its run is known
	// (dotted names; one that fails to import is left for the program).
	Preimport []string
	// Idle is how long an unclaimed worker is kept before it is ended; 0 means
	// DefaultNativeIdle.
	Idle time.Duration
	// Roots, when not empty, are the directories beneath which a run's workspace
	// leaves a warm worker behind (the daemon's named workspaces, not the private
	// directory of a run that named none, which is gone after it).
	Roots []string
	// Failed, when not nil, is told why a worker could not be prepared.
	Failed func(error)
}

// DefaultNativeIdle is how long an unclaimed warm native worker is kept by default.
const DefaultNativeIdle = 2 * time.Minute

// nativeWarmCPU is a warm native worker's CPU limit until its claim, in seconds: a
// ceiling for the imports, set at the claim to the CPU time used so far plus the
// run's limit or a session's (SessionCPU). A daemon without CAP_SYS_RESOURCE may
// lower another process's hard limit, never raise it (prlimit(2)), so the ceiling
// is a session's and two minutes more for the imports (which take a second or
// two); a worker whose imports took more serves no session (it starts cold).
const nativeWarmCPU = uint64((SessionCPU + 2*time.Minute) / time.Second)

// nativeWarmReady bounds how long a warm native worker may take to send its
// contract and then, its imports done, its runner's StepReady.
const nativeWarmReady = 2 * time.Minute

// NativeWarmStats describe the warm native workers: Size and Idle as configured and
// held; Hits runs and sessions served by one, Misses native runs and sessions that
// found none for their workspace and policy (they started cold), Failures workers
// that could not be prepared, LastError the latest reason.
type NativeWarmStats struct {
	Size      int    `json:"size"`
	Idle      int    `json:"idle"`
	Hits      uint64 `json:"hits"`
	Misses    uint64 `json:"misses"`
	Failures  uint64 `json:"failures"`
	LastError string `json:"last_error,omitempty"`
}

// nativeWarm holds a Spawner's idle warm native workers.
type nativeWarm struct {
	mu        sync.Mutex
	opts      NativeWarmOptions
	idle      map[string]*nativeIdle // by workspace (as the kernel names it)
	preparing bool                   // one is being prepared (one at a time)
	anyRC     bool                   // prepare one for a workspace with a matplotlibrc too (tests)

	hits, misses, failures atomic.Uint64
	lastErr                atomic.Pointer[string]
}

// nativeIdle is a warm native worker waiting for its run.
type nativeIdle struct {
	p        *proc
	stdin    *os.File // the write end of its fd 0
	key      string   // nativeKey of the run it was prepared after
	ws       protocol.FileID
	contract protocol.Report // from its StepExec frame
	forks    *forks          // its checkpoints', if it is claimed for a session (nil: none)
	used     time.Time       // when it was made idle
	expire   *time.Timer
}

// drop ends an unclaimed warm native worker.
func (w *nativeIdle) drop() {
	if w.expire != nil {
		w.expire.Stop()
	}
	w.stdin.Close()
	w.p.drop()
}

// WarmNative sets how warm native workers are kept (Size 0: none; every idle one is
// ended) and ends those over the new size. It fails for a module name the runner
// cannot import.
func (s *Spawner) WarmNative(opts NativeWarmOptions) error {
	for _, m := range opts.Preimport {
		if !protocol.ModuleName(m) {
			return fmt.Errorf("sandbox: cannot preimport %q: not a dotted module name", m)
		}
	}
	if opts.Idle <= 0 {
		opts.Idle = DefaultNativeIdle
	}
	opts.Roots = slices.Clone(opts.Roots)
	for i, r := range opts.Roots {
		real, err := filepath.EvalSymlinks(r)
		if err != nil {
			return fmt.Errorf("sandbox: warm native root: %w", err)
		}
		opts.Roots[i] = real
	}
	nw := &s.native
	nw.mu.Lock()
	if !slices.Equal(opts.Preimport, nw.opts.Preimport) {
		nw.evict(0) // prepared with other imports
	}
	nw.opts = opts
	nw.evict(opts.Size)
	nw.mu.Unlock()
	return nil
}

// NativeWarmStats returns the warm native workers' state.
func (s *Spawner) NativeWarmStats() NativeWarmStats {
	nw := &s.native
	nw.mu.Lock()
	st := NativeWarmStats{Size: nw.opts.Size, Idle: len(nw.idle)}
	nw.mu.Unlock()
	st.Hits, st.Misses, st.Failures = nw.hits.Load(), nw.misses.Load(), nw.failures.Load()
	if e := nw.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// evict ends idle workers, the longest idle first, until at most n are left. The
// caller holds nw.mu.
func (nw *nativeWarm) evict(n int) {
	for len(nw.idle) > n {
		var oldest string
		for ws, w := range nw.idle {
			if oldest == "" || w.used.Before(nw.idle[oldest].used) {
				oldest = ws
			}
		}
		nw.idle[oldest].drop()
		delete(nw.idle, oldest)
	}
}

// nativeKey is what a native run must share with the run a warm worker was prepared
// after to be served by it: everything the worker was hardened and started with
// (the root, the memory limit, the environment, the hardening) but the CPU limit,
// which the claim sets.
func nativeKey(req *protocol.Request) string {
	h := req.Hardening
	h.Rlimits.CPU = 0
	h.HostNamespaces = nil
	h.SharedNetwork = false // the spawner's decision, from the rest
	b, _ := json.Marshal(struct {
		Root   string
		Memory int64
		Env    map[string]string
		Harden protocol.Hardening
	}{req.RootDir, req.Limits.MemoryBytes, req.Env, h})
	return string(b)
}

// serves reports whether warm workers are ever prepared for req: the pool is on,
// req is not isolated (an isolated program is the daemon's own: its workspace is
// not a caller's), and its workspace is under the pool's roots (if any); nw.mu is
// held.
func (nw *nativeWarm) serves(req *protocol.Request) bool {
	return nw.opts.Size != 0 && !req.Isolated && (len(nw.opts.Roots) == 0 || beneath(req.Workspace, nw.opts.Roots) != "")
}

// takeNative returns the idle warm worker for req's workspace (wsDir, open) if it
// can serve req, or nil. A worker that cannot is ended.
func (s *Spawner) takeNative(req *protocol.Request, wsDir *os.File) *nativeIdle {
	nw := &s.native
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if !nw.serves(req) {
		return nil // (not a miss: no worker is ever prepared for it)
	}
	w := nw.idle[req.Workspace]
	if w == nil {
		nw.misses.Add(1)
		return nil
	}
	delete(nw.idle, req.Workspace)
	select {
	case <-w.p.exited:
	default:
		if w.key == nativeKey(req) && req.WorkspaceID != nil && w.ws == *req.WorkspaceID && req.Hardening.Rlimits.CPU > 0 &&
			!hasMatplotlibrc(wsDir) {
			if w.expire != nil {
				w.expire.Stop()
			}
			return w
		}
	}
	nw.misses.Add(1)
	w.drop()
	return nil
}

// hasMatplotlibrc reports whether the workspace holds an entry named matplotlibrc
// (or cannot be looked at): matplotlib reads one from its working directory when it
// is imported, and a warm worker imported it before the run, from "/", so that no
// file of the workspace's is read (let alone evaluated: some of its values are)
// before the claim. Such a run starts cold, and its matplotlib reads the file.
func hasMatplotlibrc(wsDir *os.File) bool {
	var st unix.Stat_t
	return unix.Fstatat(int(wsDir.Fd()), "matplotlibrc", &st, unix.AT_SYMLINK_NOFOLLOW) != unix.ENOENT
}

// runNativeWarm runs req on w: it lowers the worker's CPU limit to the run's,
// counted from now, checks it, and writes the program to the worker's stdin. It
// returns false, having ended w, when w cannot take the run (it had exited); the
// caller then runs req cold.
func (s *Spawner) runNativeWarm(ctx context.Context, w *nativeIdle, req protocol.Request, observe Observer) (protocol.Result, bool) {
	prog, err := protocol.Program(&req, "")
	if err != nil {
		w.drop()
		return protocol.Result{}, false
	}
	cpu := time.Duration(req.Hardening.Rlimits.CPU) * time.Second
	if ms := req.Limits.CPUMS; ms > 0 && time.Duration(ms)*time.Millisecond < cpu {
		cpu = time.Duration(ms) * time.Millisecond // rounded up once, with what was used
	}
	limit, err := w.claimCPU(cpu)
	if err != nil {
		w.drop()
		return protocol.Result{}, false
	}
	s.native.hits.Add(1)
	rep := w.contract
	if rep.Enforcement != nil {
		enf := *rep.Enforcement
		enf.Rlimits = maps.Clone(enf.Rlimits)
		enf.Rlimits["CPU"] = limit // counted from the process's start, as the kernel counts it
		rep.Enforcement = &enf
	}
	w.p.execd, w.p.started = &rep, time.Now()
	go func() {
		w.stdin.Write(prog)
		w.stdin.Write(req.Stdin)
		w.stdin.Close()
	}()
	req.Hardening.Rlimits.CPU = limit // the backstop, as the limit in force
	return w.p.collect(ctx, nil, req, observe), true
}

// claimCPU sets the worker's RLIMIT_CPU to the CPU time it has used plus cpu,
// rounded up to the second (SIGXCPU there, SIGKILL a second later, as a cold
// worker's), reads it back, and returns the soft limit set, in seconds. The program
// gets its cpu and less than one second more; a cold one, its cpu_ms rounded up to
// the second less the interpreter's start.
func (w *nativeIdle) claimCPU(cpu time.Duration) (uint64, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if w.p.gone {
		return 0, os.ErrProcessDone
	}
	pid := w.p.cmd.Process.Pid
	used, err := ownCPU(pid)
	if err != nil {
		return 0, err
	}
	limit := uint64((used + cpu + time.Second - 1) / time.Second)
	if err := unix.Prlimit(pid, unix.RLIMIT_CPU, &unix.Rlimit{Cur: limit, Max: limit + 1}, nil); err != nil {
		return 0, fmt.Errorf("prlimit: %w", err)
	}
	var got unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_CPU, nil, &got); err != nil {
		return 0, fmt.Errorf("prlimit: %w", err)
	}
	if got.Cur != limit || got.Max != limit+1 {
		return 0, fmt.Errorf("RLIMIT_CPU is %d/%d, not %d/%d", got.Cur, got.Max, limit, limit+1)
	}
	return limit, nil
}

// warmNativeAfter prepares, in the background, a warm native worker for the next
// run like req (a native run that has ended) in req's workspace, unless one is held
// or being prepared for it, or warm native workers are off.
func (s *Spawner) warmNativeAfter(req protocol.Request) {
	nw := &s.native
	nw.mu.Lock()
	if !nw.serves(&req) || nw.idle[req.Workspace] != nil || nw.preparing ||
		req.Hardening.Rlimits.CPU == 0 || req.WorkspaceID == nil || len(req.Env) > 0 {
		// One is prepared at a time, whatever the number of native runs ending: it
		// is started outside the daemon's admission. An environment of the caller's
		// could point the imports at the workspace's files (MATPLOTLIBRC).
		nw.mu.Unlock()
		return
	}
	nw.preparing = true
	opts, anyRC := nw.opts, nw.anyRC
	nw.mu.Unlock()
	go func() {
		w, err := s.startNative(req, opts.Preimport, anyRC)
		nw.mu.Lock()
		defer nw.mu.Unlock()
		nw.preparing = false
		if w == nil && err == nil {
			return // not worth one (see startNative)
		}
		if err != nil {
			nw.failures.Add(1)
			msg := err.Error()
			nw.lastErr.Store(&msg)
			if opts.Failed != nil {
				go opts.Failed(err)
			}
			return
		}
		if nw.opts.Size == 0 || !slices.Equal(nw.opts.Preimport, opts.Preimport) {
			w.drop() // turned off or changed meanwhile
			return
		}
		if old := nw.idle[req.Workspace]; old != nil {
			old.drop()
		}
		if nw.idle == nil {
			nw.idle = map[string]*nativeIdle{}
		}
		w.used = time.Now()
		w.expire = time.AfterFunc(nw.opts.Idle, func() {
			nw.mu.Lock()
			defer nw.mu.Unlock()
			if nw.idle[req.Workspace] == w {
				delete(nw.idle, req.Workspace)
				w.drop()
			}
		})
		nw.idle[req.Workspace] = w
		nw.evict(nw.opts.Size)
	}()
}

// startNative starts a warm native worker for runs like req in its workspace and
// waits for its contract, which must hold every layer req's policy requires, and
// its runner's imports. It returns nil and no error when the workspace holds a
// matplotlibrc, unless anyRC (tests): its next run would be served cold (see
// hasMatplotlibrc).
func (s *Spawner) startNative(req protocol.Request, preimport []string, anyRC bool) (*nativeIdle, error) {
	t := req
	t.Code, t.Path, t.Filename, t.Args, t.Stdin, t.Isolated = "", "", "", nil, nil, false
	t.Preimport = preimport
	t.Hardening.Rlimits.CPU = nativeWarmCPU
	wsDir, err := s.prepare(&t) // the workspace opened and checked again
	if err != nil {
		return nil, err
	}
	defer wsDir.Close()
	if t.WorkspaceID == nil || *t.WorkspaceID != *req.WorkspaceID {
		return nil, errors.New("the workspace is no longer the directory of the run")
	}
	if !anyRC && hasMatplotlibrc(wsDir) {
		return nil, nil
	}
	frame, err := protocol.Encode(protocol.Frame{Step: protocol.StepRun, Request: &t})
	if err != nil {
		return nil, err
	}
	r, stdin, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p, err := s.launch(true, t.Hardening.SharedNetwork, wsDir, nil, r)
	r.Close()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	w := &nativeIdle{p: p, stdin: stdin, key: nativeKey(&req), ws: *t.WorkspaceID}
	late := time.AfterFunc(nativeWarmReady, p.kill)
	defer late.Stop()
	f, err := func() (protocol.Frame, error) {
		if _, err := p.ctl.Write(frame); err != nil {
			return protocol.Frame{}, err
		}
		f, listener, err := protocol.ReceiveFile(p.ctl, protocol.MaxFrame, protocol.StepReport, protocol.StepExec)
		if listener != nil {
			// Forks are refused until a session claims it (openSessionWarm).
			w.forks = superviseForks(listener, p.cmd.Process.Pid, false)
		}
		return f, err
	}()
	switch {
	case err != nil:
		err = fmt.Errorf("warm native worker: %w", err)
	case f.Step != protocol.StepExec:
		err = fmt.Errorf("warm native worker refused: %v", f.Report.Diagnostics)
	default:
		if missing := checkContract(*f.Report, t.Hardening.Require); missing != "" {
			err = errors.New("warm native worker: " + missing)
		} else if _, err = protocol.ReceiveMax(p.ctl, protocol.MaxGuestFrame, protocol.StepReady); err != nil {
			// The runner's word that the imports are done (it has run no caller's
			// code: nothing but when it comes is taken from it).
			err = fmt.Errorf("warm native worker: its imports: %w", err)
		}
	}
	if err != nil {
		w.drop()
		return nil, err
	}
	w.contract = *f.Report
	return w, nil
}

// openSessionWarm opens req's native session (opened by openSession, its workspace
// wsDir) on w: the worker's CPU limit set to the session's from now (claimCPU), its
// runner told to serve cells (protocol.SessionProgram on stdin), and its word that
// the session is open awaited, as a cold session's is. The contract is the one w
// verified when it was prepared, with the CPU limit in force. It returns nil, having
// ended w, when w cannot serve the session; the caller then opens it cold.
func (s *Spawner) openSessionWarm(ctx context.Context, w *nativeIdle, req protocol.Request, wsDir *os.File) *Session {
	limit, err := w.claimCPU(time.Duration(req.Hardening.Rlimits.CPU) * time.Second)
	if err != nil {
		w.drop()
		return nil
	}
	ws, err := dupFile(wsDir)
	if err != nil {
		w.drop()
		return nil
	}
	ss := &Session{p: w.p, memory: req.Limits.MemoryBytes, processes: req.Hardening.Processes, native: true, ws: ws,
		forks: w.forks}
	ss.serveTools()
	if ss.forks != nil {
		ss.forks.window(true) // for pid 1's fork of the interpreter
	}
	ch := ss.next()
	_, err = w.stdin.Write(protocol.SessionProgram())
	w.stdin.Close()
	var rep protocol.Report
	if err == nil {
		rep, err = ss.wait(ctx, ch, openTimeout)
	}
	if err == nil && ss.forks != nil {
		err = ss.forks.adopt(0)
	}
	if err != nil || rep.Reason != protocol.Exited || w.contract.Enforcement == nil {
		ss.Close()
		return nil
	}
	s.native.hits.Add(1)
	enf := *w.contract.Enforcement
	enf.Rlimits = maps.Clone(enf.Rlimits)
	enf.Rlimits["CPU"] = limit // counted from the process's start, as the kernel counts it
	ss.opened = enf
	return ss
}
