// Package runs is the daemon's run manager: it admits runs into a bounded pool
// of concurrent workers and a bounded queue (fair among callers, at most
// Options.MaxPerCaller each), owns each run's lifecycle (queued, running, done),
// measures its workspace against the quota as it goes, and keeps results for a
// while within a byte budget. It also runs the jobs that are not runs (a SQL
// statement's worker: JobSQL). Hooks hear of each run's end before it is visible
// (the audit record: AuditTo; the metrics). It is driven by the API
// (supervisor/api) and assembled by the daemon (supervisor/daemon); it never
// imports either, nor sessions or approvals.
package runs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/oklog/ulid/v2"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/audit"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// Errors of admission and lookup, mapped by the API to stable codes.
var (
	ErrQueueFull = errors.New("supervisor: every worker is busy and the queue is full")
	// ErrCallerLimit: the caller already has Options.MaxPerCaller runs running or
	// queued; other callers' runs are still admitted.
	ErrCallerLimit = errors.New("supervisor: this caller has as many runs running or queued as one caller may")
	ErrStopping    = errors.New("supervisor: shutting down")
	ErrNotFound    = errors.New("supervisor: no such run")
)

// Runner executes one request, passing the output to observe as it is produced;
// *sandbox.Spawner is the real one.
type Runner interface {
	RunStreaming(ctx context.Context, req protocol.Request, observe sandbox.Observer) (protocol.Result, error)
}

var _ Runner = (*sandbox.Spawner)(nil)

// Manager admits and runs requests. Create it with New.
type Manager struct {
	runner    Runner
	workDir   string // private workspaces of runs that name none
	retention time.Duration
	workers   int // how many runs may run at once
	maxQueued int
	perCaller int // most runs (running plus queued) of one caller; 0: no bound
	quota     workspace.Quota

	wedgeSlack  time.Duration
	maxRetained int64        // bytes kept for finished runs at most (their output and records)
	retained    int64        // bytes kept for finished runs now (under mu)
	inflight    atomic.Int64 // bytes kept for runs not yet finished (their output so far and records)
	finishedIDs []string     // finished runs, oldest first (under mu)

	onFinish []func(*Run, wire.View) // called once per run, after its final state

	mu       sync.Mutex
	runs     map[string]*Run
	running  int                        // runs holding a worker
	queued   int                        // runs waiting for one
	callers  map[identity.Caller]*share // callers with runs running or queued
	stopping bool
	wg       sync.WaitGroup
}

// share is one caller's part of the workers and the queue (under Manager.mu).
type share struct {
	running int
	waiting []*Run // queued, oldest first
}

// Options configure a Manager.
type Options struct {
	// Concurrency is how many workers run at once (at least 1).
	Concurrency int
	// QueueLength is how many runs may wait for a worker.
	QueueLength int
	// Retention is how long a finished run stays readable.
	Retention time.Duration
	// WorkDir holds the private workspace of each run (created and removed per run).
	// Whatever it holds at start is left from a daemon that died, and is removed.
	WorkDir string
	// MaxRetainedOutputBytes bounds what the manager keeps for callers: the stdout,
	// stderr and event records of finished runs and of runs still going. Past it the
	// oldest finished results lose their output (they keep the rest); what running
	// runs hold is bounded by their own output limits. 0 means 256 MiB.
	MaxRetainedOutputBytes int64
	// WedgeSlack is how long past its wall-clock limit a run may take to end (the
	// kill, the reaping, the result) before Wedged reports it; 0 means 30 s.
	WedgeSlack time.Duration
	// MaxPerCaller bounds the runs one caller has running plus queued (0: no
	// bound); past it Start fails with ErrCallerLimit. Whatever it is, a free worker
	// goes to the queued run of the caller with the fewest runs running (the oldest
	// such run), so one caller's queue never keeps another's run waiting behind it.
	MaxPerCaller int
	// WorkspaceQuota bounds what each run's workspace (named, or private) may hold
	// while the run goes: no file larger than its bytes (RLIMIT_FSIZE), and the
	// workspace measured as the run goes (see workspace.Workspace.Watch); past it the run ends
	// quota_exceeded. Zero: no bound.
	WorkspaceQuota workspace.Quota
}

// New returns a manager running requests with runner.
func New(runner Runner, o Options) (*Manager, error) {
	if o.Concurrency < 1 {
		return nil, fmt.Errorf("supervisor: concurrency %d", o.Concurrency)
	}
	// Private workspaces left by a daemon that died in the middle of runs. One that
	// cannot be removed is moved aside (and tried again at the next start): a
	// workspace a run made hard to delete must not keep the daemon from starting.
	stale, _ := filepath.Glob(o.WorkDir + ".stale-*")
	for _, p := range stale {
		workspace.RemoveTree(p)
	}
	if err := workspace.RemoveTree(o.WorkDir); err != nil {
		if err := os.Rename(o.WorkDir, fmt.Sprintf("%s.stale-%d", o.WorkDir, time.Now().UnixNano())); err != nil {
			return nil, fmt.Errorf("supervisor: %w", err)
		}
	}
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	if o.MaxRetainedOutputBytes <= 0 {
		o.MaxRetainedOutputBytes = 256 << 20
	}
	if o.WedgeSlack <= 0 {
		o.WedgeSlack = 30 * time.Second
	}
	return &Manager{runner: runner, workDir: o.WorkDir, retention: o.Retention, maxRetained: o.MaxRetainedOutputBytes,
		wedgeSlack: o.WedgeSlack, workers: o.Concurrency, maxQueued: o.QueueLength, perCaller: max(o.MaxPerCaller, 0),
		quota: o.WorkspaceQuota, runs: map[string]*Run{}, callers: map[identity.Caller]*share{}}, nil
}

// AuditTo records run.finished in w for every run m ends (a statement's worker is
// not a run: see JobSQL).
func (m *Manager) AuditTo(w *audit.Writer) {
	m.OnFinish(func(r *Run, v wire.View) {
		if r.Job != JobRun {
			return
		}
		var d audit.RunFinished
		if res := v.Result; res != nil {
			stdout, stderr := res.Streams()
			d = audit.RunFinished{Reason: res.Reason, ExitCode: res.ExitCode, ElapsedMS: res.ElapsedMS,
				StdoutBytes: stdout.Len(), StderrBytes: stderr.Len(), StdoutTruncated: res.StdoutTruncated,
				StderrTruncated: res.StderrTruncated, Diagnostics: res.Diagnostics}
			if res.Enforcement != nil {
				d.Layers = res.Enforcement.ActiveLayers()
			}
		}
		w.Record(context.Background(), store.RunFinished, r.Caller, r.ID, d)
	})
}

// JobKind is what a worker does for its caller.
type JobKind string

// The job kinds.
const (
	// JobRun is a caller's program: a run, audited and kept as one (Start).
	JobRun JobKind = "run"
	// JobSQL is the SQL tool's program for one statement: answered once and
	// forgotten (Do), audited as sql.* by the API, never a run.
	JobSQL JobKind = "sql"
)

// Run is one job's record (a run's, mostly: see JobKind). Its methods are safe for
// concurrent use.
type Run struct {
	ID      string
	Created time.Time
	// Caller started the run.
	Caller identity.Caller
	// Job is what the worker does.
	Job JobKind

	cancel  context.CancelFunc
	done    chan struct{}
	granted chan struct{} // closed when a worker is the run's (under Manager.mu)
	ended   func()        // Start's; called by finish before the end is visible, then nil
	tools   sandbox.Tools // answers the guest's tool calls (nil: none are offered)

	mu        sync.Mutex
	finishing bool // finish has begun: the final state is being recorded
	state     wire.State
	result    protocol.Result
	err       error
	finished  time.Time
	deadline  time.Time // while running: when its worker must have been reaped

	// The output as it was produced, held once: while the run is going, live holds
	// each stream's bytes so far (the runner keeps no copy), in pieces that are
	// never moved or copied to grow (protocol.Output); once done, the result's
	// StdoutPieces and StderrPieces are those same pieces, and live is dropped.
	// chunks index into them, in the order written: a write of the stream the last
	// chunk is of, while no reader has been given that chunk, extends it (within
	// its piece), so records grow with reads, with switches between the streams and
	// with pieces, not with the number of writes.
	live    [2]*protocol.Output // stdout, stderr
	chunks  []chunkRef
	read    int           // chunks before this index have been given to a reader
	held    int64         // bytes counted in Manager.inflight for this run
	counter *atomic.Int64 // Manager.inflight
	changed chan struct{} // closed (and replaced) when chunks grow or the run ends
}

// chunkRef is a chunk: bytes off to end of a piece of a stream (a piece is at most
// a few MiB).
type chunkRef struct {
	piece, off, end int32
	stderr          bool
}

// chunkRecordBytes is what one chunk record costs, counted with the output.
const chunkRecordBytes = int64(unsafe.Sizeof(chunkRef{}))

// outputBytes is the memory a result's output holds (capacity, not length: room
// left in its pieces is held too).
func outputBytes(res *protocol.Result) int64 {
	stdout, stderr := res.Streams()
	return int64(stdout.Cap() + stderr.Cap())
}

// Chunk is a piece of a run's output, in the order it was produced.
type Chunk struct {
	// Stream is "stdout" or "stderr".
	Stream string
	Data   []byte
}

// observe appends output (called by the runner's reading goroutines).
func (r *Run) observe(stream string, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == wire.Done {
		return
	}
	stderr := stream == "stderr"
	out := r.live[0]
	if stderr {
		out = r.live[1]
	}
	before := int64(out.Cap())
	var delta int64
	for len(b) > 0 {
		piece, off, n := out.Extend(b)
		b = b[n:]
		if last := len(r.chunks) - 1; last >= r.read && r.chunks[last].stderr == stderr &&
			int(r.chunks[last].piece) == piece && int(r.chunks[last].end) == off {
			r.chunks[last].end = int32(off + n)
		} else {
			r.chunks = append(r.chunks, chunkRef{int32(piece), int32(off), int32(off + n), stderr})
			delta += chunkRecordBytes
		}
	}
	delta += int64(out.Cap()) - before
	r.held += delta
	r.counter.Add(delta)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Output returns the chunks from index from on, the index after them, whether the
// run had ended when they were taken (so there will be no more), and a channel
// closed when there is more to read. A run whose output was discarded (see
// Options.MaxRetainedOutputBytes) has no chunks.
func (r *Run) Output(from int) (chunks []Chunk, next int, done bool, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	src := r.live
	if r.state == wire.Done {
		src[0], src[1] = r.result.StdoutPieces, r.result.StderrPieces
	}
	for i := max(from, 0); i < len(r.chunks); i++ {
		c := r.chunks[i]
		stream, out := "stdout", src[0]
		if c.stderr {
			stream, out = "stderr", src[1]
		}
		if int(c.piece) < out.NumPieces() && int(c.end) <= len(out.Piece(int(c.piece))) {
			chunks = append(chunks, Chunk{Stream: stream, Data: out.Piece(int(c.piece))[c.off:c.end]})
		}
	}
	r.read = max(r.read, len(r.chunks))
	return chunks, max(from, len(r.chunks)), r.state == wire.Done, r.changed
}

// View returns the run's current state.
func (r *Run) View() wire.View {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := wire.View{ID: r.ID, State: r.state, CreatedAt: r.Created}
	if r.state == wire.Done {
		res := r.result
		f := r.finished
		v.Result, v.FinishedAt = &res, &f
	}
	return v
}

// Done is closed when the run has its final state.
func (r *Run) Done() <-chan struct{} { return r.done }

// Err is the error that kept a finished run from starting a worker (a bad request),
// or nil.
func (r *Run) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Start admits req: it returns at once with the run queued or running, or fails with
// ErrQueueFull or ErrStopping. A request without a workspace gets a private one,
// removed when the run ends. ended, if not nil, is called once when the run no
// longer uses its worker or workspace, before its end is visible (Done, View): a
// caller who saw the run end never finds what ended holds still held. tools, if not
// nil, gives the run (by its ID) what answers its guest's tool calls.
func (m *Manager) Start(req protocol.Request, caller identity.Caller, ended func(), tools func(runID string) sandbox.Tools) (*Run, error) {
	return m.start(JobRun, req, caller, ended, tools)
}

// Do runs req as a job of kind for caller and returns its result once it ends: it
// shares the pool, the queue, the callers' shares and the shutdown of runs, is
// cancelled when ctx ends, and is forgotten when it returns (its result is the
// caller's answer, kept nowhere). Errors are Start's, or the job's own (Run.Err).
func (m *Manager) Do(ctx context.Context, kind JobKind, req protocol.Request, caller identity.Caller) (protocol.Result, error) {
	r, err := m.start(kind, req, caller, nil, nil)
	if err != nil {
		return protocol.Result{}, err
	}
	select {
	case <-r.Done():
	case <-ctx.Done():
		r.cancel()
		<-r.Done()
	}
	defer m.drop(r.ID)
	if err := r.Err(); err != nil {
		return protocol.Result{}, err
	}
	// The job's caller reads its output whole (a statement's answer is decoded as
	// one document): in one slice each, bounded by the job's own output cap.
	return r.View().Result.Joined(), nil
}

func (m *Manager) start(kind JobKind, req protocol.Request, caller identity.Caller, ended func(), tools func(runID string) sandbox.Tools) (*Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping {
		return nil, ErrStopping
	}
	// Admitted while a worker is free or the queue has room.
	if m.running+m.queued >= m.workers+m.maxQueued {
		return nil, ErrQueueFull
	}
	sh := m.callers[caller]
	if sh == nil {
		sh = &share{}
	}
	if m.perCaller > 0 && sh.running+len(sh.waiting) >= m.perCaller {
		return nil, fmt.Errorf("%w (%d)", ErrCallerLimit, m.perCaller)
	}
	m.callers[caller] = sh
	m.sweep()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Run{ID: ulid.MustNew(ulid.Now(), rand.Reader).String(), Created: time.Now().UTC(), Caller: caller, Job: kind,
		cancel: cancel, done: make(chan struct{}), granted: make(chan struct{}), state: wire.Queued, ended: ended,
		live:    [2]*protocol.Output{protocol.NewOutput(req.Limits.MaxStdoutBytes), protocol.NewOutput(req.Limits.MaxStderrBytes)},
		counter: &m.inflight, changed: make(chan struct{})}
	if tools != nil {
		r.tools = tools(r.ID)
	}
	m.runs[r.ID] = r
	m.queued++
	sh.waiting = append(sh.waiting, r)
	m.dispatch()
	m.wg.Add(1)
	go m.execute(ctx, r, req)
	return r, nil
}

// dispatch gives free workers to queued runs, each to the oldest queued run of the
// caller with the fewest runs running; m.mu is held.
func (m *Manager) dispatch() {
	for m.running < m.workers && m.queued > 0 {
		var next *share
		for _, sh := range m.callers {
			if len(sh.waiting) == 0 {
				continue
			}
			if next == nil || sh.running < next.running ||
				(sh.running == next.running && sh.waiting[0].Created.Before(next.waiting[0].Created)) {
				next = sh
			}
		}
		r := next.waiting[0]
		next.waiting = next.waiting[1:]
		next.running++
		m.queued--
		m.running++
		close(r.granted)
	}
}

// dequeue removes r, not yet given a worker, from the queue; m.mu is held.
func (m *Manager) dequeue(r *Run) {
	sh := m.callers[r.Caller]
	for i, q := range sh.waiting {
		if q == r {
			sh.waiting = append(sh.waiting[:i], sh.waiting[i+1:]...)
			m.queued--
			break
		}
	}
	m.forget(r.Caller, sh)
}

// release gives r's worker back and hands it to the next queued run.
func (m *Manager) release(r *Run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sh := m.callers[r.Caller]
	sh.running--
	m.running--
	m.forget(r.Caller, sh)
	m.dispatch()
}

// forget drops a caller's share once it has nothing running or queued; m.mu is held.
func (m *Manager) forget(c identity.Caller, sh *share) {
	if sh.running == 0 && len(sh.waiting) == 0 {
		delete(m.callers, c)
	}
}

func (m *Manager) execute(ctx context.Context, r *Run, req protocol.Request) {
	defer m.wg.Done()
	defer r.cancel()
	select {
	case <-r.granted:
	case <-ctx.Done():
		m.mu.Lock()
		select {
		case <-r.granted:
			// Given a worker as it was cancelled: give it back.
			m.mu.Unlock()
			m.release(r)
		default:
			m.dequeue(r)
			m.mu.Unlock()
		}
		m.finish(r, protocol.Result{ExitCode: -1, Reason: protocol.Cancelled,
			Diagnostics: []string{"cancelled before a worker was free"}}, nil)
		return
	}
	m.mu.Lock()
	stopping := m.stopping
	m.mu.Unlock()
	if stopping {
		// Queued when the daemon began to stop: it would only be cancelled at the
		// end of the grace period, so it never starts.
		m.release(r)
		m.finish(r, protocol.Result{ExitCode: -1, Reason: protocol.Cancelled,
			Diagnostics: []string{"the daemon is stopping; the run did not start"}}, nil)
		return
	}
	r.mu.Lock()
	r.state = wire.Running
	r.deadline = time.Now().Add(time.Duration(req.Limits.TimeoutMS)*time.Millisecond + m.wedgeSlack)
	r.mu.Unlock()
	res, err := m.work(ctx, r, req)
	// The worker is free before the final state is visible, so a caller who saw the
	// run end never sees its worker still counted busy.
	m.release(r)
	if err != nil {
		reason := protocol.InternalError
		if errors.Is(err, sandbox.ErrBadRequest) {
			reason = protocol.Rejected
		}
		res = protocol.Result{ExitCode: -1, Reason: reason, Diagnostics: []string{err.Error()}}
	}
	m.finish(r, res, err)
}

// work runs req in a worker, in a private workspace (removed afterwards) when the
// request names none.
func (m *Manager) work(ctx context.Context, r *Run, req protocol.Request) (protocol.Result, error) {
	if req.Workspace == "" {
		ws, err := os.MkdirTemp(m.workDir, r.ID+"-")
		if err != nil {
			return protocol.Result{}, fmt.Errorf("cannot create the run's workspace: %w", err)
		}
		defer workspace.RemoveTree(ws)
		req.Workspace = ws
	}
	if m.quota.Bytes > 0 && m.quota.Files > 0 {
		req.Hardening.Rlimits.FSIZE = min(req.Hardening.Rlimits.FSIZE, uint64(m.quota.Bytes))
		req.WorkspaceQuota = m.quota.Bytes // the guest's /tmp counts against it too
		w, err := workspace.Directory(req.Workspace, m.quota)
		if err != nil {
			return protocol.Result{}, err
		}
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		var pid atomic.Int64
		ctx = sandbox.WithWorker(ctx, func(p int) { pid.Store(int64(p)) })
		go w.Watch(ctx, req.Workspace, &pid, m.quota, func(detail string) {
			stop(&sandbox.Stop{Reason: protocol.QuotaExceeded, Detail: detail})
		})
	}
	if r.tools != nil {
		ctx = sandbox.WithTools(ctx, r.tools)
	}
	return m.runner.RunStreaming(ctx, req, r.observe)
}

// finish records the final state once. What the run held is given back (ended)
// and the hooks (the audit record, the metrics) run before the final state is
// visible (View, the event stream) and Done is closed: whoever sees the run end,
// by waiting, polling or following it, finds its workspace free and its
// run.finished record written.
func (m *Manager) finish(r *Run, res protocol.Result, err error) {
	r.mu.Lock()
	if r.state == wire.Done || r.finishing {
		r.mu.Unlock()
		return
	}
	r.finishing = true
	ended := r.ended
	r.ended = nil
	if res.Stdout == nil && res.Stderr == nil && res.StdoutPieces == nil && res.StderrPieces == nil {
		// The runner gave the output to observe and kept none itself: the result
		// holds the pieces observe gathered, not a copy.
		res.StdoutPieces, res.StderrPieces = r.live[0], r.live[1]
	}
	finished := time.Now().UTC()
	final := res
	v := wire.View{ID: r.ID, State: wire.Done, CreatedAt: r.Created, Result: &final, FinishedAt: &finished}
	r.mu.Unlock()
	if ended != nil {
		ended()
	}
	for _, f := range m.onFinish {
		f(r, v)
	}
	r.mu.Lock()
	r.state, r.result, r.err, r.finished = wire.Done, res, err, finished
	r.live = [2]*protocol.Output{}
	r.counter.Add(-r.held)
	r.held = 0
	kept := r.keptLocked()
	close(r.changed)
	r.mu.Unlock()
	if r.Job == JobRun {
		// Only runs are kept. A job of Do's is its caller's answer, held until Do
		// returns (bounded by the workers and the job's own output cap), and must
		// not push other callers' results out of the budget.
		m.retain(r, kept)
	}
	close(r.done)
}

// retain accounts for what finished run r keeps (n bytes) and drops the output of
// the oldest finished runs while everything kept, running runs' output included,
// is over the budget: the daemon's memory stays bounded however large the outputs,
// however many results are kept, and however many tiny writes made them.
func (m *Manager) retain(r *Run, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.retained += n
	m.finishedIDs = append(m.finishedIDs, r.ID)
	for len(m.finishedIDs) > 0 && m.retained+m.inflight.Load() > m.maxRetained {
		old, ok := m.runs[m.finishedIDs[0]]
		m.finishedIDs = m.finishedIDs[1:]
		if ok {
			m.retained -= old.dropOutput()
		}
	}
}

// keptLocked is what a finished run holds: its output and its chunk records; r.mu
// is held.
func (r *Run) keptLocked() int64 {
	return outputBytes(&r.result) + int64(cap(r.chunks))*chunkRecordBytes
}

// dropOutput forgets the run's stdout and stderr (and so its chunks) and returns
// how many bytes they held.
func (r *Run) dropOutput() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.keptLocked()
	if n > 0 {
		r.result.Stdout, r.result.Stderr, r.chunks = nil, nil, nil
		r.result.StdoutPieces, r.result.StderrPieces = nil, nil
		r.result.Diagnostics = append(r.result.Diagnostics,
			"output discarded: the daemon keeps a bounded amount of output of finished runs")
	}
	return n
}

// OnFinish adds f to the functions called once per run after its final state (before
// the first Start).
func (m *Manager) OnFinish(f func(*Run, wire.View)) { m.onFinish = append(m.onFinish, f) }

// Get returns the run with id, or ErrNotFound.
func (m *Manager) Get(id string) (*Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.runs[id]
	if !ok || r.Job != JobRun {
		return nil, ErrNotFound
	}
	return r, nil
}

// drop drops finished job id and its output at once (Do's: the result was the
// caller's answer). A job that has not finished, or is unknown, is left as it is.
func (m *Manager) drop(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.runs[id]
	if !ok {
		return
	}
	r.mu.Lock()
	done := r.state == wire.Done
	size := r.keptLocked()
	r.mu.Unlock()
	if done {
		if r.Job == JobRun {
			m.retained -= size
		}
		delete(m.runs, id)
	}
}

// Cancel asks run id to stop: a queued run ends cancelled at once, a running one when
// its worker has been killed (the parent kills it on cancel). Cancelling a finished
// run changes nothing. It returns the run, or ErrNotFound.
func (m *Manager) Cancel(id string) (*Run, error) {
	r, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	r.cancel()
	return r, nil
}

// Wedged returns an error when the manager is not making progress: a run still
// running well past its wall-clock limit, which means its worker was neither killed
// nor reaped. The daemon stops its watchdog pings then, so systemd restarts it.
func (m *Manager) Wedged() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for _, r := range m.runs {
		r.mu.Lock()
		late := r.state == wire.Running && now.After(r.deadline)
		over := now.Sub(r.deadline)
		r.mu.Unlock()
		if late {
			return fmt.Errorf("run %s is %s past its deadline and has not ended", r.ID, over.Round(time.Second))
		}
	}
	return nil
}

// Kept returns the bytes the manager holds for callers: for finished runs (their
// output and chunk records, at most max, the oldest dropped first) and for runs not
// yet finished (their output so far, bounded by each run's output limits).
func (m *Manager) Kept() (finished, running, max int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.retained, m.inflight.Load(), m.maxRetained
}

// Busy returns the number of running and queued runs.
func (m *Manager) Busy() (running, queued int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.running, m.queued
}

// sweep forgets finished runs older than the retention; m.mu is held.
func (m *Manager) sweep() {
	cut := time.Now().Add(-m.retention)
	for id, r := range m.runs {
		r.mu.Lock()
		old := r.state == wire.Done && r.finished.Before(cut)
		size := r.keptLocked()
		r.mu.Unlock()
		if old && r.Job == JobRun { // (a job of Do's is Do's to drop, and never counted)
			m.retained -= size
			delete(m.runs, id)
		}
	}
	kept := m.finishedIDs[:0]
	for _, id := range m.finishedIDs {
		if _, ok := m.runs[id]; ok {
			kept = append(kept, id)
		}
	}
	m.finishedIDs = kept
}

// Shutdown stops admitting runs, waits up to grace for those in progress, then
// cancels the rest (their workers are killed) and waits for them to end.
func (m *Manager) Shutdown(grace time.Duration) {
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	m.mu.Lock()
	for _, r := range m.runs {
		r.cancel()
	}
	m.mu.Unlock()
	<-done
}

// WorkDir is where private workspaces are created.
func (m *Manager) WorkDir() string { return filepath.Clean(m.workDir) }
