package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// whose workspace lies elsewhere runs cold.
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
}

// poolCounts are the spawner's pool counters (they outlive a pool replaced by Warm).
type poolCounts struct {
	hits, misses, failures atomic.Uint64
	lastErr                atomic.Pointer[string]
}

type idleWorker struct {
	p   *proc
	rss int64
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
	return st
}

// poolKey is what a request must share with the pool's template to be served warm.
func poolKey(req *protocol.Request) string {
	h := req.Hardening
	h.Rlimits = protocol.Rlimits{}
	h.HostNamespaces = nil
	h.SharedNetwork = false // the spawner's decision, from the rest
	b, _ := json.Marshal(struct {
		Module, Lib  string
		Memory, Fuel int64
		Hardening    protocol.Hardening
	}{req.ModulePath, req.LibDir, req.Limits.MemoryBytes, int64(req.Limits.Fuel), h})
	return string(b)
}

// pooled takes a warm worker for req, or returns nil: no pool, a request unlike the
// template, a workspace outside the roots, or no worker ready. It sets req.Roots.
func (s *Spawner) pooled(req *protocol.Request) *proc {
	pl := s.pool.Load()
	if pl == nil || !req.Hardening.Namespaces || req.Limits.Fuel > 0 || poolKey(req) != pl.key {
		return nil
	}
	inRoot := false
	for _, r := range pl.roots {
		inRoot = inRoot || (req.Workspace != r && within(req.Workspace, r) && strings.HasPrefix(req.Workspace, r+"/"))
	}
	if !inRoot {
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
			w.p.claimed.Store(true)
			req.Roots = pl.roots
			return w.p
		default:
			pl.n.misses.Add(1)
			pl.signal()
			return nil
		}
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

// start launches a worker for the template and waits until it is ready.
func (pl *pool) start() (idleWorker, error) {
	t := pl.opts.Template
	t.Roots = pl.roots
	t.Hardening.HostNamespaces = hostNamespaces()
	t.Hardening.SharedNetwork = pl.s.shareNetwork(t.Hardening)
	frame, err := protocol.Encode(protocol.Frame{Step: protocol.StepTemplate, Request: &t})
	if err != nil {
		return idleWorker{}, err
	}
	module, err := pl.s.sealedModule(t.ModulePath)
	if err != nil {
		return idleWorker{}, fmt.Errorf("module: %w", err)
	}
	dir, err := os.Open(pl.roots[0]) // fd 4, unused by a warm worker (closed in its root)
	if err != nil {
		return idleWorker{}, err
	}
	p, err := pl.s.launch(true, t.Hardening.SharedNetwork, dir, module)
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
	return idleWorker{p: p, rss: residentBytes(p.cmd.Process.Pid)}, nil
}

// drop kills an unclaimed worker and closes the parent's ends.
func (p *proc) drop() {
	p.kill()
	p.ctl.Close()
	p.outR.Close()
	p.errR.Close()
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
