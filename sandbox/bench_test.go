package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// BenchmarkColdRun times whole cold runs of print(6*7) (spawn, harden, load, run,
// reap) without hardening, with each layer alone, and with every layer, and reports
// the median as ms/median (run with -benchtime 20x for a median of 20).
func BenchmarkColdRun(b *testing.B) {
	limits := policy.Default().Default
	bare := struct {
		name string
		make func(protocol.Limits) protocol.Hardening
	}{"bare", func(protocol.Limits) protocol.Hardening { return protocol.Hardening{} }}
	// bare: nothing; base: rlimits, no capabilities, no_new_privs; then each layer
	// over base, and all.
	for _, c := range append([]struct {
		name string
		make func(protocol.Limits) protocol.Hardening
	}{bare}, configurations...) {
		c := c
		b.Run(c.name, func(b *testing.B) {
			req := protocol.Request{Code: "print(6*7)", Workspace: b.TempDir(), Limits: limits,
				ModulePath: bundletest.Module(b, false), LibDir: bundletest.LibDir(b), Hardening: c.make(limits)}
			// One spawner, as the daemon has: the sealed copy of the module is made
			// once (the CLI makes it on every run).
			sp := sandbox.NewSpawner()
			times := make([]time.Duration, 0, b.N)
			cpu := childrenCPU()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				res, err := sp.Run(context.Background(), req)
				times = append(times, time.Since(start))
				if err != nil || res.Reason != protocol.Exited || string(res.Stdout) != "42\n" {
					b.Fatalf("%v %s %q %v", err, res.Reason, res.Stdout, res.Diagnostics)
				}
			}
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/median")
			b.ReportMetric(float64((childrenCPU()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/run")
		})
	}
}

// BenchmarkWarmRun times runs of print(6*7) served by warm workers with every layer
// (the claim: narrowing, the program, the run, the result), each waiting first for
// a ready worker, so refilling is not timed; it reports the median as ms/median.
func BenchmarkWarmRun(b *testing.B) {
	limits := policy.Default().Default
	req := protocol.Request{Code: "print(6*7)", Workspace: b.TempDir(), Limits: limits,
		ModulePath: bundletest.Module(b, false), LibDir: bundletest.LibDir(b), Hardening: policy.Default().Hardening(limits)}
	root, _ := filepath.EvalSymlinks(os.TempDir())
	sp := sandbox.NewSpawner()
	if err := sp.Warm(sandbox.PoolOptions{Template: req, Roots: []string{root}, Size: 1}); err != nil {
		b.Fatal(err)
	}
	defer sp.Warm(sandbox.PoolOptions{})
	times := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		for sp.PoolStats().Idle == 0 {
			time.Sleep(time.Millisecond)
		}
		start := time.Now()
		res, err := sp.Run(context.Background(), req)
		times = append(times, time.Since(start))
		if err != nil || res.Reason != protocol.Exited || string(res.Stdout) != "42\n" {
			b.Fatalf("%v %s %q %v", err, res.Reason, res.Stdout, res.Diagnostics)
		}
	}
	b.ReportMetric(float64(sp.PoolStats().Hits)/float64(b.N), "warm/run")
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/median")
}

// childrenCPU is the user and system CPU time of the reaped workers (getrusage(2),
// RUSAGE_CHILDREN).
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSessionCell times a cell's round trip in a live session with every layer
// (`print(x)`, x defined by an earlier cell: the frame, the call on the same
// instance, the output up to its end marker, the report), each after a pause
// (untimed: an agent's time to read the answer, in which the worker takes its
// checkpoint), and reports the median as ms/median; next to BenchmarkWarmRun's
// fresh instance per run.
func BenchmarkSessionCell(b *testing.B) {
	limits := policy.Default().Default
	req := protocol.Request{Workspace: b.TempDir(), Limits: limits, Hardening: policy.Default().Hardening(limits),
		ModulePath: bundletest.Module(b, false), LibDir: bundletest.LibDir(b)}
	ss, err := sandbox.NewSpawner().OpenSession(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	defer ss.Close()
	if _, err := ss.Run(context.Background(), protocol.Request{Code: "x = 42", Limits: limits}); err != nil {
		b.Fatal(err)
	}
	medianCell(b, ss, limits)
}

// medianCell times b.N cells `print(x)` in ss (x is 42), each after a pause
// (untimed), and reports their median as ms/median.
func medianCell(b *testing.B, ss *sandbox.Session, limits protocol.Limits) {
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		time.Sleep(50 * time.Millisecond)
		b.StartTimer()
		start := time.Now()
		res, err := ss.Run(context.Background(), protocol.Request{Code: "print(x)", Limits: limits})
		times = append(times, time.Since(start))
		if err != nil || res.Reason != protocol.Exited || string(res.Stdout) != "42\n" {
			b.Fatalf("%v %s %q %v", err, res.Reason, res.Stdout, res.Diagnostics)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/median")
}

// BenchmarkSessionCheckpoint times `pass` cells back to back in a session whose
// interpreter holds 50 MiB and 500 MiB: each cell that ends by itself is followed by
// a checkpoint of the whole linear memory (a copy), which the next cell waits for,
// so this is what a checkpoint costs at that size, with a cell's own round trip
// (BenchmarkSessionCell) included; it reports the median.
func BenchmarkSessionCheckpoint(b *testing.B) {
	for _, mib := range []int{50, 500} {
		b.Run(strconv.Itoa(mib)+"MiB", func(b *testing.B) {
			ss, limits, _ := heldSession(b, sandbox.NewSpawner(), mib)
			defer ss.Close()
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				res, err := ss.Run(context.Background(), protocol.Request{Code: "pass", Limits: limits})
				times = append(times, time.Since(start))
				if err != nil || res.Reason != protocol.Exited {
					b.Fatalf("%v %s", err, res.Reason)
				}
			}
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/median")
		})
	}
}

// heldSession opens a session of sp (every layer, a 1 GiB memory limit) whose
// interpreter holds mib MiB of random bytes as `held`, and returns it with its
// limits and request.
func heldSession(b *testing.B, sp *sandbox.Spawner, mib int) (*sandbox.Session, protocol.Limits, protocol.Request) {
	b.Helper()
	limits := policy.Default().Default
	limits.MemoryBytes = 1 << 30
	req := protocol.Request{Workspace: b.TempDir(), Limits: limits, Hardening: policy.Default().Hardening(limits),
		ModulePath: bundletest.Module(b, false), LibDir: bundletest.LibDir(b)}
	ss, err := sp.OpenSession(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	fill := protocol.Request{Code: "import os\nheld = bytearray(os.urandom(1 << 20)) * " + strconv.Itoa(mib), Limits: limits}
	if res, err := ss.Run(context.Background(), fill); err != nil || res.Reason != protocol.Exited {
		ss.Close()
		b.Fatalf("%v %s %s", err, res.Reason, res.Stderr)
	}
	return ss, limits, req
}

// BenchmarkSessionResume times a session's trip through disk with 50 MiB and 500
// MiB in its interpreter: Save to a checkpoint file (synced, as the daemon pauses
// it), then ResumeSession from that file in a fresh worker and its first cell
// (`len(held)`), which is what the next cell of a paused session waits for. It
// reports each half's median and the file's size.
func BenchmarkSessionResume(b *testing.B) {
	for _, mib := range []int{50, 500} {
		b.Run(strconv.Itoa(mib)+"MiB", func(b *testing.B) {
			sp := sandbox.NewSpawner()
			ss, limits, req := heldSession(b, sp, mib)
			path := filepath.Join(b.TempDir(), "checkpoint")
			var saves, resumes []time.Duration
			var size int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				f, err := os.Create(path)
				if err != nil {
					b.Fatal(err)
				}
				if size, err = ss.Save(f); err == nil {
					err = f.Sync()
				}
				f.Close()
				if err != nil {
					b.Fatal(err)
				}
				ss.Close()
				saves = append(saves, time.Since(start))
				start = time.Now()
				f, _ = os.Open(path)
				ss, err = sp.ResumeSession(context.Background(), req, f)
				f.Close()
				if err != nil {
					b.Fatal(err)
				}
				res, err := ss.Run(context.Background(), protocol.Request{Code: "len(held)", Limits: limits})
				resumes = append(resumes, time.Since(start))
				if err != nil || res.Value != strconv.Itoa(mib<<20) {
					b.Fatalf("%v %q %q", err, res.Value, res.Stderr)
				}
			}
			ss.Close()
			median := func(d []time.Duration) float64 {
				sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
				return float64(d[len(d)/2].Microseconds()) / 1000
			}
			b.ReportMetric(median(saves), "ms/pause")
			b.ReportMetric(median(resumes), "ms/resume")
			b.ReportMetric(float64(size)/(1<<20), "MiB/file")
		})
	}
}

// BenchmarkNativeSessionCell times a cell's round trip in a native session (as
// BenchmarkSessionCell), whose interpreter holds pandas and a DataFrame of 0 or 200
// MiB: each cell forks the interpreter's checkpoint first (copy-on-write: its page
// tables are copied, so the cost grows with the interpreter's memory) and the
// daemon checks that the checkpoint stopped; it reports the median.
func BenchmarkNativeSessionCell(b *testing.B) {
	for _, mib := range []int{0, 200} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			pol := policy.Default()
			limits, err := pol.Resolve(protocol.Limits{MemoryBytes: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			req := protocol.Request{Backend: protocol.BackendNative, RootDir: nativeRoot(b), Workspace: b.TempDir(),
				Limits: limits, Hardening: pol.NativeHardening(limits)}
			ss, err := sandbox.NewSpawner().OpenSession(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			defer ss.Close()
			setup := fmt.Sprintf("import pandas as pd, numpy as np\ndf = pd.DataFrame({'a': np.ones(%d)})\nx = 42", mib<<20/8)
			if c, err := ss.Run(context.Background(), protocol.Request{Code: setup, Limits: limits}); err != nil || c.ExitCode != 0 {
				b.Fatalf("%v %s", err, c.Stderr)
			}
			medianCell(b, ss, limits)
		})
	}
}
