package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// racer finishes after a random few microseconds, or reports cancellation, as the
// real spawner does.
type racer struct{}

func (racer) RunStreaming(ctx context.Context, req protocol.Request, _ sandbox.Observer) (protocol.Result, error) {
	select {
	case <-time.After(time.Duration(rand.IntN(200)) * time.Microsecond):
		return protocol.Result{Reason: protocol.Exited}, nil
	case <-ctx.Done():
		return protocol.Result{ExitCode: -1, Reason: protocol.Cancelled}, nil
	}
}

// Cancel racing completion: every run ends with exactly one final state, once.
func TestCancelRacesCompletion(t *testing.T) {
	m, err := New(racer{}, Options{Concurrency: 8, QueueLength: 2000, Retention: time.Minute, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// The hooks (the audit record) run before the end is visible, as the holds'
	// release does.
	m.OnFinish(func(r *Run, v wire.View) {
		if r.View().State == wire.Done || v.State != wire.Done || v.Result == nil {
			t.Errorf("run %s: its end was visible before its hooks ran (or they got no result)", r.ID)
		}
	})
	var wg sync.WaitGroup
	counts := map[protocol.Reason]int{}
	var mu sync.Mutex
	for i := 0; i < 1000; i++ {
		// What the run's caller holds for it (a workspace) is given back once, before
		// the end is visible.
		started, ended := make(chan *Run, 1), new(atomic.Int32)
		r, err := m.Start(protocol.Request{Code: "1"}, identity.Caller{}, func() {
			if r := <-started; r.View().State == wire.Done {
				t.Errorf("run %s: its end was visible before its hold was given back", r.ID)
			}
			ended.Add(1)
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		started <- r
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			m.Cancel(r.ID)
			m.Cancel(r.ID)
			<-r.Done()
			if n := ended.Load(); n != 1 {
				t.Errorf("run %s: its hold was given back %d times", r.ID, n)
			}
			v := r.View()
			if v.State != wire.Done || v.Result == nil || v.FinishedAt == nil {
				t.Errorf("run %s: %+v", r.ID, v)
				return
			}
			mu.Lock()
			counts[v.Result.Reason]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	m.Shutdown(time.Second)
	if counts[protocol.Exited]+counts[protocol.Cancelled] != 1000 {
		t.Fatalf("final states: %v", counts)
	}
	t.Logf("final states of 1000 cancel/complete races: %v", counts)
	if _, err := m.Start(protocol.Request{Code: "1"}, identity.Caller{}, nil, nil); err != ErrStopping {
		t.Fatalf("after shutdown: %v", err)
	}
}

// big returns 1 MiB of stdout per run.
type big struct{}

func (big) RunStreaming(ctx context.Context, req protocol.Request, _ sandbox.Observer) (protocol.Result, error) {
	return protocol.Result{Reason: protocol.Exited, Stdout: make([]byte, 1<<20)}, nil
}

// The output kept over all finished runs stays within the budget; the oldest
// results lose their output first.
func TestRetainedOutputBounded(t *testing.T) {
	m, err := New(big{}, Options{Concurrency: 2, QueueLength: 100, Retention: time.Hour,
		WorkDir: t.TempDir(), MaxRetainedOutputBytes: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var runs []*Run
	for i := 0; i < 20; i++ {
		r, err := m.Start(protocol.Request{Code: "1"}, identity.Caller{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		<-r.Done()
		runs = append(runs, r)
	}
	m.mu.Lock()
	kept := m.retained
	m.mu.Unlock()
	if kept > 5<<20 {
		t.Fatalf("%d bytes kept", kept)
	}
	if v := runs[0].View(); len(v.Result.Stdout) != 0 || len(v.Result.Diagnostics) == 0 {
		t.Fatalf("oldest kept its output: %d bytes", len(v.Result.Stdout))
	}
	if v := runs[19].View(); len(v.Result.Stdout) != 1<<20 {
		t.Fatalf("newest lost its output")
	}
}

// A job of Do's is not kept: its output never pushes a run's out of the budget, it
// is gone once Do returns, and no one can Get or Cancel it.
func TestJobsAreNotKept(t *testing.T) {
	m, err := New(big{}, Options{Concurrency: 2, QueueLength: 100, Retention: time.Hour,
		WorkDir: t.TempDir(), MaxRetainedOutputBytes: 3 << 20 / 2})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Start(protocol.Request{Code: "1"}, identity.Caller{UID: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	for i := 0; i < 5; i++ {
		res, err := m.Do(context.Background(), JobSQL, protocol.Request{Code: "1"}, identity.Caller{UID: 2})
		if err != nil || len(res.Stdout) != 1<<20 {
			t.Fatalf("job: %d bytes, %v", len(res.Stdout), err)
		}
	}
	if v := r.View(); len(v.Result.Stdout) != 1<<20 {
		t.Fatalf("the run lost its output to jobs: %v", v.Result.Diagnostics)
	}
	m.mu.Lock()
	n, kept := len(m.runs), m.retained
	m.mu.Unlock()
	if n != 1 || kept != r.keptLocked() {
		t.Fatalf("%d kept, %d bytes", n, kept)
	}
}

// streamer gives its output to observe as a worker's reads would: writes of random
// sizes to both streams, the same for every run (seeded), and keeps none itself.
type streamer struct{ bytes int }

func (s streamer) RunStreaming(ctx context.Context, req protocol.Request, observe sandbox.Observer) (protocol.Result, error) {
	stdout, stderr := s.output()
	rng := rand.New(rand.NewPCG(1, 1))
	for len(stdout)+len(stderr) > 0 {
		stream, b := "stdout", &stdout
		if rng.IntN(4) == 0 && len(stderr) > 0 || len(stdout) == 0 {
			stream, b = "stderr", &stderr
		}
		n := min(len(*b), 1+rng.IntN(48<<10))
		observe(stream, (*b)[:n])
		*b = (*b)[n:]
		if rng.IntN(64) == 0 {
			time.Sleep(time.Millisecond) // let a reader in
		}
	}
	return protocol.Result{Reason: protocol.Exited}, nil
}

// output is what a run of s writes: s.bytes of text on stdout, a quarter of that on
// stderr.
func (s streamer) output() (stdout, stderr []byte) {
	line := []byte("é<&>\"\t\x01 ✓ output line\n")
	stdout = bytes.Repeat(line, s.bytes/len(line)+1)[:s.bytes]
	stderr = bytes.Repeat([]byte("e"), s.bytes/4)
	return stdout, stderr
}

// A run's output is held once, in pieces: a reader following it gets every byte of
// each stream in order, the result holds those same pieces (no copy), what is kept
// is counted, and a job of Do's gets its output in one slice.
func TestOutputInPieces(t *testing.T) {
	s := streamer{bytes: 3<<20 + 7}
	m, err := New(s, Options{Concurrency: 2, QueueLength: 10, Retention: time.Hour, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	wantOut, wantErr := s.output()
	r, err := m.Start(protocol.Request{Code: "1", Limits: protocol.Limits{MaxStdoutBytes: int64(len(wantOut)),
		MaxStderrBytes: 64 << 20}}, identity.Caller{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for next, done := 0, false; !done; {
		var chunks []Chunk
		var changed <-chan struct{}
		chunks, next, done, changed = r.Output(next)
		for _, c := range chunks {
			got[c.Stream] = append(got[c.Stream], c.Data...)
		}
		if !done {
			select {
			case <-changed:
			case <-time.After(10 * time.Second):
				t.Fatal("no output")
			}
		}
	}
	if !bytes.Equal(got["stdout"], wantOut) || !bytes.Equal(got["stderr"], wantErr) {
		t.Fatalf("read %d and %d bytes, want %d and %d", len(got["stdout"]), len(got["stderr"]), len(wantOut), len(wantErr))
	}
	v := r.View()
	res := v.Result
	if res.Stdout != nil || res.StdoutPieces.NumPieces() < 2 || !bytes.Equal(res.StdoutPieces.Bytes(), wantOut) ||
		!bytes.Equal(res.StderrPieces.Bytes(), wantErr) {
		t.Fatalf("result: %d bytes in one slice, %d pieces", len(res.Stdout), res.StdoutPieces.NumPieces())
	}
	if chunks, _, _, _ := r.Output(0); len(chunks) == 0 || &chunks[0].Data[0] != &res.StdoutPieces.Piece(0)[0] &&
		&chunks[0].Data[0] != &res.StderrPieces.Piece(0)[0] {
		t.Fatal("the chunks are not the result's pieces")
	}
	// At its cap, stdout is held to within the bytes pieces leave rather than cut a
	// rune; stderr within an eighth.
	if c := res.StdoutPieces.Cap(); c > len(wantOut)+3*res.StdoutPieces.NumPieces() {
		t.Errorf("%d bytes of stdout at its cap held in %d", len(wantOut), c)
	}
	if c := res.StderrPieces.Cap(); c > len(wantErr)*9/8 {
		t.Errorf("%d bytes of stderr held in %d", len(wantErr), c)
	}
	finished, running, _ := m.Kept()
	if running != 0 || finished != r.keptLocked() || finished < int64(len(wantOut)+len(wantErr)) {
		t.Fatalf("kept %d finished, %d running", finished, running)
	}
	var buf bytes.Buffer
	if err := v.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back wire.View
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || !bytes.Equal(back.Result.Stdout, wantOut) {
		t.Fatalf("the answer: %v", err)
	}
	res2, err := m.Do(context.Background(), JobSQL, protocol.Request{Code: "1"}, identity.Caller{})
	if err != nil || res2.StdoutPieces != nil || !bytes.Equal(res2.Stdout, wantOut) || !bytes.Equal(res2.Stderr, wantErr) {
		t.Fatalf("job: %d bytes, %v", len(res2.Stdout), err)
	}
	m.Shutdown(time.Second)
}

// No test leaves a goroutine behind (a run's executor, a cancel waiter).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stuck ignores cancellation until released: a worker that is never reaped.
type stuck struct{ release chan struct{} }

func (s stuck) RunStreaming(ctx context.Context, req protocol.Request, _ sandbox.Observer) (protocol.Result, error) {
	<-s.release
	return protocol.Result{Reason: protocol.Exited}, nil
}

// A run that outlives its deadline by the slack makes the manager wedged (the
// watchdog then stops), and it recovers when the run ends.
func TestWedged(t *testing.T) {
	s := stuck{release: make(chan struct{})}
	m, err := New(s, Options{Concurrency: 1, Retention: time.Minute, WorkDir: t.TempDir(), WedgeSlack: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Start(protocol.Request{Code: "1", Limits: protocol.Limits{TimeoutMS: 50}}, identity.Caller{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Wedged(); err != nil {
		t.Fatalf("at once: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	m.Cancel(r.ID)
	if err := m.Wedged(); err == nil || !strings.Contains(err.Error(), r.ID) {
		t.Fatalf("after the deadline: %v", err)
	}
	close(s.release)
	<-r.Done()
	if err := m.Wedged(); err != nil {
		t.Fatalf("after it ended: %v", err)
	}
	m.Shutdown(time.Second)
}

// Runs still queued when the daemon begins to stop never start: they end cancelled
// at once, while the running one finishes within the grace period.
func TestShutdownCancelsQueued(t *testing.T) {
	s := stuck{release: make(chan struct{})}
	m, err := New(s, Options{Concurrency: 1, QueueLength: 4, Retention: time.Minute, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	running, _ := m.Start(protocol.Request{Code: "1", Limits: protocol.Limits{TimeoutMS: 60_000}}, identity.Caller{}, nil, nil)
	for running.View().State != wire.Running {
		time.Sleep(time.Millisecond)
	}
	queued, _ := m.Start(protocol.Request{Code: "2", Limits: protocol.Limits{TimeoutMS: 60_000}}, identity.Caller{}, nil, nil)
	done := make(chan struct{})
	go func() { m.Shutdown(time.Minute); close(done) }()
	time.Sleep(20 * time.Millisecond)
	close(s.release) // the running run ends; its slot goes to the queued one
	select {
	case <-queued.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the queued run waited for the grace period")
	}
	if v := queued.View(); v.Result == nil || v.Result.Reason != protocol.Cancelled || !strings.Contains(strings.Join(v.Result.Diagnostics, " "), "stopping") {
		t.Fatalf("queued run: %+v", v.Result)
	}
	<-running.Done() // its slot is given back before its final state is visible
	if v := running.View(); v.Result == nil || v.Result.Reason != protocol.Exited {
		t.Fatalf("running run: %+v", v.Result)
	}
	<-done
}

// One caller holds at most MaxPerCaller runs, running plus queued; another caller is
// still admitted, and a freed worker goes to the caller with the fewest runs running
// before the first caller's older queued runs.
func TestFairShare(t *testing.T) {
	s := stuck{release: make(chan struct{})}
	m, err := New(s, Options{Concurrency: 2, QueueLength: 8, MaxPerCaller: 4, Retention: time.Minute, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a, b := identity.Caller{UID: -1, Token: "a"}, identity.Caller{UID: -1, Token: "b"}
	var mine []*Run
	for i := 0; i < 4; i++ {
		r, err := m.Start(protocol.Request{Code: "a", Limits: protocol.Limits{TimeoutMS: 60_000}}, a, nil, nil)
		if err != nil {
			t.Fatalf("a's run %d: %v", i, err)
		}
		mine = append(mine, r)
	}
	if _, err := m.Start(protocol.Request{Code: "a"}, a, nil, nil); !errors.Is(err, ErrCallerLimit) {
		t.Fatalf("a's fifth run: %v", err)
	}
	if running, queued := m.Busy(); running != 2 || queued != 2 {
		t.Fatalf("busy: %d running, %d queued", running, queued)
	}
	// (A run given a worker says running once its executor has started it.)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		n := 0
		for _, r := range mine {
			if r.View().State == wire.Running {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of a's runs running, want 2", n)
		}
	}
	theirs, err := m.Start(protocol.Request{Code: "b", Limits: protocol.Limits{TimeoutMS: 60_000}}, b, nil, nil)
	if err != nil {
		t.Fatalf("b's run: %v", err)
	}
	// One worker frees: b's run (b has none running) goes before a's queued ones.
	s.release <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for theirs.View().State != wire.Running {
		if time.Now().After(deadline) {
			t.Fatal("b's run did not get the free worker")
		}
		time.Sleep(time.Millisecond)
	}
	queuedA := 0
	for _, r := range mine {
		if r.View().State == wire.Queued {
			queuedA++
		}
	}
	if queuedA != 2 {
		t.Fatalf("%d of a's runs queued, want 2", queuedA)
	}
	close(s.release)
	for _, r := range append(mine, theirs) {
		<-r.Done()
	}
	m.mu.Lock()
	left := len(m.callers)
	m.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d callers' shares kept after their runs ended", left)
	}
	m.Shutdown(time.Second)
}
