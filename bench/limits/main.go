// Command limits is `make limits`: how exactly a real daemon keeps each limit, over
// repeated trials at concurrency 2 (the CPU limit's one at a time). Percentiles are
// by nearest rank: of 100 trials the p99 is the 99th fastest, of 20 the slowest.
//
// For the wall clock, a sleep, a catastrophic regular expression and the
// formatting of a huge integer (each under a 1 s limit), it measures the caller's
// round trip of POST /v1/runs (waiting for the result: worker start, the run, its
// stop, the answer) and checks its p99 is within the limit plus 250 ms, every trial
// ending for the limit's reason. For CPU time (1 s) it checks the CPU time the
// run's worker used, by the same rule: on a shared machine CPU time runs slower
// than the wall clock, so a round trip would measure the contention, not the limit. For memory, a program that allocates without end
// under a 64 MiB limit must end memory_limit with its peak at most the limit; for
// output, 1 MB written to stdout, or to stderr, under a 12,345-byte cap must end
// output_limit with exactly 12,345 bytes of it. It prints one table, and exits 1 when a check fails.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/sandcell/sandcell/bench/harness"
)

// slack is what a limit may be overshot by, at the caller, at the 99th percentile.
const slack = 250 * time.Millisecond

// limit is one case: a program, the limits it runs under, and how it must end.
type limit struct {
	name   string
	code   string
	limits map[string]any
	reason string
	// bound is the limit its round trip is held to (0: not timed); check checks the
	// result otherwise.
	bound time.Duration
	check func(r result) error
	// cpu holds the CPU time the run's worker used to bound, not the round trip:
	// the daemon's reaped children's (proc(5): cutime and cstime), read around each
	// trial, so its trials run one at a time.
	cpu bool
}

// result is what the program reads of a run's answer.
type result struct {
	Reason          string
	Stdout, Stderr  string
	StdoutTruncated bool  `json:"stdout_truncated"`
	StderrTruncated bool  `json:"stderr_truncated"`
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
}

var cases = []limit{
	{name: "wall clock 1 s (busy loop)", code: "while True: pass", limits: map[string]any{"timeout_ms": 1000},
		reason: "timeout", bound: time.Second},
	{name: "CPU 1 s (busy loop)", code: "while True: pass", limits: map[string]any{"cpu_ms": 1000, "timeout_ms": 10000},
		reason: "cpu_limit", bound: time.Second, cpu: true},
	{name: "wall clock 1 s (time.sleep(100))", code: "import time\ntime.sleep(100)", limits: map[string]any{"timeout_ms": 1000},
		reason: "timeout", bound: time.Second},
	{name: "wall clock 1 s (regex (a+)+$)", code: "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')", limits: map[string]any{"timeout_ms": 1000},
		reason: "timeout", bound: time.Second},
	{name: "wall clock 1 s (str(10**10**8))", code: "import sys\nsys.set_int_max_str_digits(0)\nstr(10 ** 10 ** 8)", limits: map[string]any{"timeout_ms": 1000},
		reason: "timeout", bound: time.Second},
	{name: "memory 64 MiB", code: "b = []\nwhile True:\n    b.append(bytearray(1 << 20))", limits: map[string]any{"memory_mib": 64},
		reason: "memory_limit", check: func(r result) error {
			if r.PeakMemoryBytes > 64<<20 || r.PeakMemoryBytes < 56<<20 {
				return fmt.Errorf("peak memory %d bytes: past the 64 MiB limit, or too far below it for the program to have reached it", r.PeakMemoryBytes)
			}
			return nil
		}},
	{name: "output 12,345 bytes (stdout)", code: "import sys\nsys.stdout.write('o' * 10**6)",
		limits: map[string]any{"max_output_bytes": 12345}, reason: "output_limit", check: func(r result) error {
			if len(r.Stdout) != 12345 || !r.StdoutTruncated {
				return fmt.Errorf("stdout: %d bytes, truncated %v", len(r.Stdout), r.StdoutTruncated)
			}
			return nil
		}},
	{name: "output 12,345 bytes (stderr)", code: "import sys\nsys.stderr.write('e' * 10**6)",
		limits: map[string]any{"max_output_bytes": 12345}, reason: "output_limit", check: func(r result) error {
			if len(r.Stderr) != 12345 || !r.StderrTruncated {
				return fmt.Errorf("stderr: %d bytes, truncated %v", len(r.Stderr), r.StderrTruncated)
			}
			return nil
		}},
}

func main() {
	trials := flag.Int("trials", 100, "trials per limit")
	bin := flag.String("sandcell", "bin/sandcell", "the sandcell binary")
	flag.Parse()
	b, _ := filepath.Abs(*bin)
	ok, err := run(b, *trials)
	if err != nil {
		fmt.Fprintln(os.Stderr, "limits:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(bin string, trials int) (bool, error) {
	dir, err := os.MkdirTemp("", "sandcell-limits-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	// No background compile of a first hash secret competing with the timings.
	// No canary either (its workers would be reaped within the CPU limit's trials).
	d, err := harness.Start(bin, dir, harness.Config(os.Getuid(), "[health]\ncanary_interval = \"24h\"\n"),
		"SANDCELL_BUNDLE_HASH_SECRET_ROTATION=0")
	if err != nil {
		return false, err
	}
	defer d.Stop()
	ok := true
	var failures []string
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "limit\ttrials\tas planned\tround trip p50\tp99\tmax\tp99 over the limit\tmeasured\t\n")
	for _, c := range cases {
		var mu sync.Mutex
		var rtts []time.Duration
		planned := 0
		var peak int64
		next := make(chan int, trials)
		for i := 0; i < trials; i++ {
			next <- i
		}
		close(next)
		var wg sync.WaitGroup
		conc := 2
		if c.cpu {
			conc = 1
		}
		for g := 0; g < conc; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					body, _ := json.Marshal(map[string]any{"code": c.code, "limits": c.limits})
					cpu0, cerr := childrenCPU(d.Pid())
					t := time.Now()
					st, b, err := harness.Do(context.Background(), d.HTTP, "POST", "/v1/runs", "application/json", body)
					rtt := time.Since(t)
					if c.cpu {
						// The daemon answers, then reaps the worker: wait for its CPU
						// time to be counted (a run that ended cpu_limit used at least
						// the bound; another child reaped meanwhile, a canary, adds
						// milliseconds, and cannot end the wait early).
						cpu1, cerr1 := childrenCPU(d.Pid())
						for end := time.Now().Add(5 * time.Second); cerr1 == nil && cpu1-cpu0 < c.bound && time.Now().Before(end); {
							time.Sleep(10 * time.Millisecond)
							cpu1, cerr1 = childrenCPU(d.Pid())
						}
						if err == nil {
							err = errors.Join(cerr, cerr1)
						}
						rtt = cpu1 - cpu0 // what is held to the bound
					}
					var v struct{ Result result }
					if err == nil && st != 200 {
						err = fmt.Errorf("%d: %s", st, b)
					}
					if err == nil {
						err = json.Unmarshal(b, &v)
					}
					if err == nil && c.reason != "" && v.Result.Reason != c.reason {
						err = fmt.Errorf("ended %s, not %s", v.Result.Reason, c.reason)
					}
					if err == nil && c.check != nil {
						err = c.check(v.Result)
					}
					mu.Lock()
					rtts = append(rtts, rtt)
					peak = max(peak, v.Result.PeakMemoryBytes)
					if err == nil {
						planned++
					} else if len(failures) < 10 {
						failures = append(failures, c.name+": "+err.Error())
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		p := func(q int) time.Duration { return harness.Quantile(rtts, float64(q)/100).Round(time.Millisecond) }
		over, measured := "", ""
		if c.bound > 0 {
			over = (p(99) - c.bound).String()
			if p(99) > c.bound+slack {
				ok = false
				what := "round trip"
				if c.cpu {
					what = "CPU time"
				}
				failures = append(failures, fmt.Sprintf("%s: p99 %s %s, past the limit and %s", c.name, what, p(99), slack))
			}
		}
		switch {
		case c.limits["memory_mib"] != nil:
			measured = fmt.Sprintf("peak %.1f MiB", float64(peak)/(1<<20))
		case c.limits["max_output_bytes"] != nil:
			if planned == trials {
				measured = "12,345 bytes each time"
			}
		}
		if planned != trials {
			ok = false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", c.name, trials, planned, p(50), p(99), p(100), over, measured)
	}
	w.Flush()
	fmt.Printf("\n(round trip: the caller's POST /v1/runs, waiting for the result; for the CPU limit, the CPU time its worker used in\n"+
		"its place (one trial at a time, the daemon's reaped children's); the limit's slack at p99 is %s)\n", slack)
	for _, f := range failures {
		fmt.Println("FAIL:", f)
	}
	if ok {
		fmt.Println("limits: every check passed")
	}
	return ok, nil
}

// childrenCPU is the CPU time of pid's children that it has waited for (proc(5),
// /proc/PID/stat: cutime and cstime, in clock ticks of 1/100 s, USER_HZ on Linux).
func childrenCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[13], 10, 64)
	s, err2 := strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}
