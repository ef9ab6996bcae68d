package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// PoolOptions configure the warm pool of a Spawner (see Warm).
type PoolOptions struct {
	// Template is the run the pool's workers are prepared for: ModulePath, LibDir,
	// Limits and Hardening. A request is served warm when it matches in all of these
	// but the timeout, the CPU limit, the output caps and the rlimits; it needs no
	// fuel, and Hardening.Namespaces must be on (a warm worker mounts its run's
	// workspace into a root of its own).
	Template protocol.Request
	// Roots are the directories whose subdirectories may be workspaces of pooled runs
	// (the daemon's workspaces and private run directories); at most 8. A request
	// whose workspace lies elsewhere runs cold. A root must hold no mount of another
	// file system beneath it (see CheckRoots): one that does is left out of the
	// workers, named in PoolStats.UnusableRoots, and runs beneath it start cold. Choose
	// directories only the caller can write, so that no other user can mount there.
	Roots []string
	// Size is how many idle workers are kept ready; 0 turns the pool off.
	Size int
	// MemoryBudget bounds the resident memory of all idle workers together, in bytes
	// (VmRSS, proc(5)); the pool refills while under it, and always keeps one. 0
	// means no bound beyond Size.
	MemoryBudget int64
	// Failed, when not nil, is told why a worker could not be prepared (the pool
	// then waits, doubling the wait up to 30 s, before it tries again).
	Failed func(error)
}

// refillDelay is how long after a warm run the pool starts refilling (see runWarm).
const refillDelay = 25 * time.Millisecond

// PoolStats describe the warm pool.
type PoolStats struct {
	Size int `json:"size"`
	Idle int `json:"idle"`
	// IdleRSSBytes is the resident memory of the idle workers, as measured when
	// each became ready.
	IdleRSSBytes int64 `json:"idle_rss_bytes"`
	// Hits counts runs served by a warm worker; Misses runs that matched the
	// template but found none ready, or whose worker had died (they ran cold);
	// Failures workers that could not be prepared (LastError says why). The counts
	// are the spawner's since it started, across pools.
	Hits      uint64 `json:"hits"`
	Misses    uint64 `json:"misses"`
	Failures  uint64 `json:"failures"`
	LastError string `json:"last_error,omitempty"`
	// UnusableRoots are the roots (PoolOptions.Roots) that warm workers cannot hold
	// (CheckRoots), as last found (when a worker was prepared, or a run beneath one
	// found none that holds it), and why: workers are prepared without them, and runs
	// beneath them start cold.
	UnusableRoots []RootProblem `json:"unusable_roots,omitempty"`
}

// RootProblem is a workspace root that warm workers cannot hold, and why.
type RootProblem struct {
	Root string `json:"root"`
	Why  string `json:"why"`
}

// pool keeps warm workers: started, in their namespaces with a root of their own,
// the snapshot's module loaded, waiting for their claim (the snapshot is instantiated
// once claimed). Each
// serves one run and is then killed; refill happens in the background, one worker at
// a time.
type pool struct {
	s     *Spawner
	opts  PoolOptions
	key   string
	roots []string // resolved

	idle chan idleWorker
	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	rss atomic.Int64
	n   *poolCounts

	// unusable is the last look at the roots (see look).
	unusable atomic.Pointer[rootLook]
}

// rootLook is which of a pool's roots were found unusable, and when.
type rootLook struct {
	at       time.Time
	problems []RootProblem
}

// poolCounts are the spawner's pool counters (they outlive a pool replaced by Warm).
type poolCounts struct {
	hits, misses, failures atomic.Uint64
	lastErr                atomic.Pointer[string]
}

type idleWorker struct {
	p     *proc
	rss   int64
	roots []string // the roots it holds: those usable when it was prepared
}

// Warm replaces the spawner's pool by one for opts (Size 0: none) and starts filling
// it in the background; the old pool's idle workers are killed. It fails for
// options a pool cannot serve.
func (s *Spawner) Warm(opts PoolOptions) error {
	var pl *pool
	if opts.Size > 0 {
		t := opts.Template
		switch {
		case !t.Hardening.Namespaces:
			return errors.New("sandbox: a warm pool needs namespaces (each worker mounts its run's workspace)")
		case t.Limits.Fuel > 0:
			return errors.New("sandbox: a warm pool serves runs without fuel")
		case len(opts.Roots) == 0 || len(opts.Roots) > 8:
			return errors.New("sandbox: a warm pool needs 1 to 8 workspace roots")
		case t.ModulePath == "" || t.LibDir == "" || t.Limits.MemoryBytes <= 0:
			return errors.New("sandbox: the pool's template needs a module, a library and limits")
		}
		pl = &pool{s: s, opts: opts, key: poolKey(&t), idle: make(chan idleWorker, opts.Size),
			wake: make(chan struct{}, 1), done: make(chan struct{}), n: &s.poolCounts}
		for _, r := range opts.Roots {
			real, err := filepath.EvalSymlinks(r)
			if err != nil {
				return fmt.Errorf("sandbox: pool root: %w", err)
			}
			pl.roots = append(pl.roots, real)
		}
		pl.look()
		pl.wg.Add(1)
		go pl.refill()
	}
	if old := s.pool.Swap(pl); old != nil {
		old.close()
	}
	return nil
}

// PoolStats returns the pool's state; zero without a pool.
func (s *Spawner) PoolStats() PoolStats {
	pl := s.pool.Load()
	if pl == nil {
		st := PoolStats{Hits: s.poolCounts.hits.Load(), Misses: s.poolCounts.misses.Load(),
			Failures: s.poolCounts.failures.Load()}
		return st
	}
	st := PoolStats{Size: pl.opts.Size, Idle: len(pl.idle), IdleRSSBytes: pl.rss.Load(),
		Hits: pl.n.hits.Load(), Misses: pl.n.misses.Load(), Failures: pl.n.failures.Load()}
	if e := pl.n.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	if l := pl.unusable.Load(); l != nil {
		st.UnusableRoots = l.problems
	}
	return st
}

// poolKey is what a request must share with the pool's template to be served warm.
func poolKey(req *protocol.Request) string {
	h := req.Hardening
	h.Rlimits = protocol.Rlimits{}
	h.HostNamespaces = nil
	h.SharedNetwork = false // the spawner's decision, from the rest
	b, _ := json.Marshal(struct {
		Module, Epochless, Lib string
		Memory, Fuel           int64
		Hardening              protocol.Hardening
	}{req.ModulePath, req.EpochlessModulePath, req.LibDir, req.Limits.MemoryBytes, int64(req.Limits.Fuel), h})
	return string(b)
}

// pooled takes a warm worker for req, or returns nil: no pool, a request unlike the
// template, a workspace outside the roots, or no worker ready that holds its root.
// It sets req.Roots.
func (s *Spawner) pooled(req *protocol.Request) *proc {
	pl := s.pool.Load()
	if pl == nil || !req.Hardening.Namespaces || req.Limits.Fuel > 0 || poolKey(req) != pl.key {
		return nil
	}
	root := beneath(req.Workspace, pl.roots)
	if root == "" {
		return nil
	}
	for {
		select {
		case w := <-pl.idle:
			pl.rss.Add(-w.rss)
			select {
			case <-w.p.exited: // died idle
				w.p.drop()
				continue
			default:
			}
			if !slices.Contains(w.roots, root) {
				// Prepared without this root (it held a mount then): the run starts
				// cold. If the root can be used now, the worker makes room for one
				// that holds it.
				pl.n.misses.Add(1)
				if slices.ContainsFunc(pl.lookAgain(), func(p RootProblem) bool { return p.Root == root }) {
					pl.putBack(w)
				} else {
					w.p.drop()
				}
				pl.signal()
				return nil
			}
			w.p.claimed.Store(true)
			req.Roots = w.roots
			return w.p
		default:
			pl.n.misses.Add(1)
			pl.signal()
			return nil
		}
	}
}

// beneath returns the root of roots that path lies strictly beneath, or "".
func beneath(path string, roots []string) string {
	for _, r := range roots {
		if path != r && within(path, r) && strings.HasPrefix(path, r+"/") {
			return r
		}
	}
	return ""
}

// putBack returns an unclaimed worker to the idle ones, or drops it if there is no
// room (refill added one meanwhile).
func (pl *pool) putBack(w idleWorker) {
	select {
	case pl.idle <- w:
		pl.rss.Add(w.rss)
	default:
		w.p.drop()
	}
}

// runWarm runs req (its claim) in the warm worker p. It returns false, having run
// nothing, when the worker is gone before it acknowledged the claim (killed while
// idle: the OOM killer picks workers first): the caller runs req cold.
func (s *Spawner) runWarm(ctx context.Context, p *proc, req protocol.Request, observe Observer) (protocol.Result, bool, error) {
	req.Hardening.Seccomp = nil // the worker has the template's (see pooled)
	frame, err := protocol.Encode(protocol.Frame{Step: protocol.StepClaim, Request: &req})
	if err != nil {
		p.drop()
		return protocol.Result{}, true, fmt.Errorf("%w: %v (code, stdin and arguments together)", ErrBadRequest, err)
	}
	p.started = time.Now()
	stuck := time.AfterFunc(time.Second, p.kill) // a stopped or hung worker goes too
	if _, err = p.ctl.Write(frame); err == nil {
		_, err = protocol.Receive(p.ctl, protocol.StepAck)
	}
	if !stuck.Stop() && err == nil {
		err = errors.New("the claim was acknowledged too late")
	}
	if err != nil {
		p.drop()
		s.poolCounts.misses.Add(1)
		if pl := s.pool.Load(); pl != nil {
			pl.signal()
		}
		return protocol.Result{}, false, nil
	}
	s.poolCounts.hits.Add(1)
	res := p.collect(ctx, nil, req, observe)
	// Refill once the run and what follows it (the caller's result, audit record and
	// answer) are over, so that starting the next worker (tens of milliseconds of
	// CPU) competes with neither.
	if pl := s.pool.Load(); pl != nil {
		time.AfterFunc(refillDelay, pl.signal)
	}
	return res, true, nil
}

func (pl *pool) signal() {
	select {
	case pl.wake <- struct{}{}:
	default:
	}
}

// refill keeps the pool full, within its memory budget; after a failure it waits,
// doubling the wait up to 30 s.
func (pl *pool) refill() {
	defer pl.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		for len(pl.idle) < pl.opts.Size {
			if b := pl.opts.MemoryBudget; b > 0 && len(pl.idle) > 0 && pl.rss.Load() >= b {
				break
			}
			w, err := pl.start()
			if err != nil {
				pl.n.failures.Add(1)
				msg := err.Error()
				pl.n.lastErr.Store(&msg)
				if pl.opts.Failed != nil {
					pl.opts.Failed(err)
				}
				select {
				case <-time.After(backoff):
					backoff = min(2*backoff, 30*time.Second)
					continue
				case <-pl.done:
					return
				}
			}
			backoff = 100 * time.Millisecond
			select {
			case pl.idle <- w:
				pl.rss.Add(w.rss)
			case <-pl.done:
				w.p.drop()
				return
			}
		}
		select {
		case <-pl.wake:
			pl.purge()
		case <-pl.done:
			return
		}
	}
}

// purge drops the idle workers that have died (each one's exit wakes refill).
func (pl *pool) purge() {
	for i := len(pl.idle); i > 0; i-- {
		select {
		case w := <-pl.idle:
			select {
			case <-w.p.exited:
				pl.rss.Add(-w.rss)
				w.p.drop()
			default:
				pl.idle <- w // room: only refill adds
			}
		default:
			return
		}
	}
}

// start launches a worker for the template, holding the roots that can be used
// now, and waits until it is ready.
func (pl *pool) start() (idleWorker, error) {
	problems := pl.look()
	roots := usable(pl.roots, problems)
	if len(roots) == 0 {
		return idleWorker{}, errors.New("no workspace root can be used: " + describe(problems))
	}
	t := pl.opts.Template
	t.Roots = roots
	t.Hardening.HostNamespaces = hostNamespaces()
	t.Hardening.SharedNetwork = pl.s.shareNetwork(t.Hardening)
	frame, err := protocol.Encode(protocol.Frame{Step: protocol.StepTemplate, Request: &t})
	if err != nil {
		return idleWorker{}, err
	}
	path, _ := t.RunModule()
	module, err := pl.s.sealedModule(path)
	if err != nil {
		return idleWorker{}, fmt.Errorf("module: %w", err)
	}
	defer module.Close()
	dir, err := os.Open(roots[0]) // fd 4, unused by a warm worker (closed in its root)
	if err != nil {
		return idleWorker{}, err
	}
	p, err := pl.s.launch(true, t.Hardening.SharedNetwork, dir, module, nil)
	dir.Close()
	if err != nil {
		return idleWorker{}, fmt.Errorf("start worker: %w", err)
	}
	slow := time.AfterFunc(30*time.Second, p.kill)
	defer slow.Stop()
	var f protocol.Frame
	if _, err = p.ctl.Write(frame); err == nil {
		// Ready, or a report of why it cannot be.
		f, err = protocol.Receive(p.ctl, protocol.StepReady, protocol.StepReport)
	}
	if err == nil && f.Step == protocol.StepReport {
		err = errors.New(strings.Join(f.Report.Diagnostics, "; "))
	}
	if err != nil {
		p.drop()
		return idleWorker{}, fmt.Errorf("warm worker: %w", err)
	}
	go func() { // an idle worker that dies is replaced
		<-p.exited
		if !p.claimed.Load() {
			pl.signal()
		}
	}()
	return idleWorker{p: p, rss: residentBytes(p.cmd.Process.Pid), roots: roots}, nil
}

// drop kills an unclaimed worker and closes the parent's ends.
func (p *proc) drop() {
	p.kill()
	p.ctl.Close()
	p.outR.Close()
	p.errR.Close()
	p.tools.Close()
}

// close stops refilling and kills the idle workers.
func (pl *pool) close() {
	close(pl.done)
	pl.wg.Wait()
	for {
		select {
		case w := <-pl.idle:
			w.p.drop()
		default:
			return
		}
	}
}

// residentBytes is VmRSS of process pid (proc(5)), 0 if unknown.
func residentBytes(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	return protocol.StatusBytes(b, "VmRSS")
}

// look checks the pool's roots (CheckRoots) and records what it found.
func (pl *pool) look() []RootProblem {
	l := &rootLook{at: time.Now(), problems: CheckRoots(pl.roots)}
	pl.unusable.Store(l)
	return l.problems
}

// lookAgain is look, at most once a second (it reads the mount table); otherwise
// the last look's problems.
func (pl *pool) lookAgain() []RootProblem {
	if l := pl.unusable.Load(); l != nil && time.Since(l.at) < time.Second {
		return l.problems
	}
	return pl.look()
}

// usable returns roots without those of problems.
func usable(roots []string, problems []RootProblem) []string {
	var out []string
	for _, r := range roots {
		if !slices.ContainsFunc(problems, func(p RootProblem) bool { return p.Root == r }) {
			out = append(out, r)
		}
	}
	return out
}

func describe(problems []RootProblem) string {
	var s []string
	for _, p := range problems {
		s = append(s, p.Root+" "+p.Why)
	}
	return strings.Join(s, "; ")
}

// CheckRoots returns the roots that a warm worker cannot hold, and why (Root as
// given). A worker holds each root as a bind mount of it made in its own
// mount namespace: a copy of the parent's, in a new user namespace, where every
// mount copied from the parent is locked to the one it is mounted on
// (mount_namespaces(7)). The kernel then refuses to clone a directory apart from a
// mount beneath it (that would reveal what the mount covers), and cloning it with
// its mounts would carry them, foreign to the pool (a chroot's /proc, a user's FUSE
// mount, a container's overlay), into the worker. So a root must hold no mount:
// one that does is named here, and its runs start cold until the mount is gone. A
// root that cannot be examined is named too.
func CheckRoots(roots []string) []RootProblem {
	mounts, err := readMounts()
	var problems []RootProblem
	for _, r := range roots {
		why := ""
		if err != nil {
			why = "cannot be checked for mounts beneath it: " + err.Error()
		} else if resolved, err := filepath.EvalSymlinks(r); err != nil {
			why = "cannot be resolved: " + err.Error()
		} else {
			why = rootProblem(resolved, mounts)
		}
		if why != "" {
			problems = append(problems, RootProblem{Root: r, Why: why})
		}
	}
	return problems
}

// mountEntry is a line of /proc/self/mountinfo (proc_pid_mountinfo(5)).
type mountEntry struct {
	parent uint64
	point  string
}

func readMounts() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		parent, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/self/mountinfo: unexpected line %q", line)
		}
		out = append(out, mountEntry{parent: parent, point: unescapeMountinfo(f[4])})
	}
	return out, nil
}

// rootProblem says why root, a resolved directory, cannot be held by a worker, or
// "": the mounts on root's own mount that lie beneath it (statx(2) STATX_MNT_ID
// names root's mount; where it cannot, any mount beneath it counts).
func rootProblem(root string, mounts []mountEntry) string {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, root, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_MNT_ID, &stx); err != nil {
		return "cannot be opened: " + err.Error()
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "is not a directory"
	}
	own := stx.Mask&unix.STATX_MNT_ID != 0
	prefix := strings.TrimSuffix(root, "/") + "/"
	var under []string
	for _, m := range mounts {
		if strings.HasPrefix(m.point, prefix) && (!own || m.parent == stx.Mnt_id) {
			under = append(under, m.point)
		}
	}
	if len(under) == 0 {
		return ""
	}
	slices.Sort(under)
	named := strings.Join(under[:min(3, len(under))], ", ")
	if len(under) > 3 {
		named += fmt.Sprintf(" and %d more", len(under)-3)
	}
	return fmt.Sprintf("has mounts beneath it (%s), which a warm worker can neither leave out (the kernel refuses) "+
		"nor be given: runs beneath it start cold until they are unmounted", named)
}
