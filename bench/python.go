package main

// The guest's speed: Python benchmark bodies of the standard library's kinds
// (python/*.py: copying, pickling, JSON, logging, pathlib, regular expressions,
// arithmetic, objects, SQLite, ...), each timed inside the interpreter that runs it,
// under the native root's own CPython 3.13 (Debian's, chrooted, no sandbox: the
// same version as the guest) and in Sandcell on each backend, through the warm
// daemon's API. A body's time is the least of -guest-repeats timings of its
// bench() after one untimed call, over -guest-rounds runs per system taken round
// robin; the ratio is to CPython 3.13's, and the summary is their geometric mean.
//
// The bodies are ours: the official benchmark suite (pyperformance) is not in the
// archives this project builds from, so these are written for the same kinds of
// work, each with a comment saying what it exercises.

import (
	"context"
	"embed"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandcell/sandcell/supervisor/wire"
)

//go:embed python/*.py
var pythonBodies embed.FS

// pythonDriver follows each body: one untimed call, then the least of %d timed ones
// in nanoseconds on stdout; the body's teardown, if it has one, after the timing.
const pythonDriver = `
import time as _time
bench()
_best = None
for _ in range(%d):
    _t = _time.perf_counter_ns()
    bench()
    _t = _time.perf_counter_ns() - _t
    _best = _t if _best is None else min(_best, _t)
if "teardown" in globals():
    teardown()
print(_best)
`

// Goals of the guest's speed on the wasm backend: the geometric mean of the ratios
// to CPython 3.13, and the largest ratio of any body.
const (
	wasmGoalGeomean = 1.5
	wasmGoalMax     = 3.0
)

// pythonBody is one benchmark: its name (the file's) and its program.
type pythonBody struct {
	name, code string
}

func loadPythonBodies(repeats int) ([]pythonBody, error) {
	names, err := pythonBodies.ReadDir("python")
	if err != nil {
		return nil, err
	}
	var out []pythonBody
	for _, e := range names {
		b, err := pythonBodies.ReadFile(path.Join("python", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, pythonBody{name: strings.TrimSuffix(e.Name(), ".py"),
			code: string(b) + fmt.Sprintf(pythonDriver, repeats)})
	}
	return out, nil
}

// pythonTable measures and prints the guest's speed table.
func pythonTable(bundleDir string, warm *daemon, dir string, rounds, repeats int, only string) error {
	rounds, repeats = max(rounds, 1), max(repeats, 1)
	bodies, err := loadPythonBodies(repeats)
	if err != nil {
		return err
	}
	if only != "" {
		bodies = slices.DeleteFunc(bodies, func(b pythonBody) bool { return !slices.Contains(strings.Split(only, ","), b.name) })
	}
	rootfs, ok := nativeRoot(bundleDir)
	if !ok {
		fmt.Printf("\nThe guest's speed: skipped (no native root, whose CPython 3.13 is the reference, in %s: run make bundle)\n", bundleDir)
		return nil
	}
	if os.Geteuid() != 0 {
		fmt.Printf("\nThe guest's speed: skipped (not root: CPython 3.13 runs chrooted into the native root)\n")
		return nil
	}
	ws := filepath.Join(dir, "python-ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	j, err := newJail(rootfs, filepath.Join(dir, "python-root"), ws)
	if err != nil {
		return fmt.Errorf("the chroot of CPython 3.13: %w", err)
	}
	defer j.close()
	ctx := context.Background()
	w, err := warm.Client.CreateWorkspace(ctx)
	if err != nil {
		return fmt.Errorf("create a workspace: %w", err)
	}
	defer warm.Client.DeleteWorkspace(ctx, w.ID)
	api := func(backend string) func(p nprog) (string, time.Duration, error) {
		return func(p nprog) (string, time.Duration, error) {
			req := wire.RunRequest{Code: p.code, Workspace: w.ID, Backend: backend, Limits: wire.RunLimits{TimeoutMS: 300_000}}
			if backend == "native" {
				req.Limits.MemoryMiB = nativeMemoryMiB
			}
			v, err := warm.Client.Run(ctx, req)
			switch {
			case err != nil:
				return "", 0, err
			case v.Result == nil:
				return "", 0, fmt.Errorf("API run: no result")
			case v.Result.Reason != "exited" || v.Result.ExitCode != 0:
				return "", 0, fmt.Errorf("API run: %s, exit %d: %s", v.Result.Reason, v.Result.ExitCode, v.Result.Stderr)
			}
			return string(v.Result.Stdout), 0, nil
		}
	}
	systems := []nsys{
		{name: "CPython 3.13", run: j.python},
		{name: "wasm", run: api("wasm")},
		{name: "native", run: api("native")},
	}
	began, loadBefore := time.Now(), loadavg()
	best := make([][]time.Duration, len(bodies))
	for bi, b := range bodies {
		fmt.Fprintf(os.Stderr, "bench: python: %s\n", b.name)
		best[bi] = make([]time.Duration, len(systems))
		for range rounds {
			for si, s := range systems {
				out, _, err := s.run(nprog{name: b.name, code: b.code})
				if err != nil {
					return fmt.Errorf("%s, %s: %w", s.name, b.name, err)
				}
				ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
				if err != nil || ns <= 0 {
					return fmt.Errorf("%s, %s: printed %q, not a time in ns", s.name, b.name, out)
				}
				if d := time.Duration(ns); best[bi][si] == 0 || d < best[bi][si] {
					best[bi][si] = d
				}
			}
		}
	}

	fmt.Printf("\nThe guest's speed: each body's bench() in ms (the least of %d timings after one untimed call, over %d runs per column,\n"+
		"  round robin), as a ratio to CPython 3.13: the native root's /usr/bin/python3.13 -I, chrooted, no sandbox (Debian's build).\n"+
		"  wasm (runs: the epochless engine), native: POST /v1/runs to the warm daemon with that backend. Bodies: bench/python/*.py. Load %s before, %s after, %.0f s.\n",
		repeats, rounds, loadBefore, loadavg(), time.Since(began).Seconds())
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "body\t")
	for _, s := range systems {
		fmt.Fprintf(tw, "%s\t", s.name)
	}
	fmt.Fprintln(tw)
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) }
	logSum := make([]float64, len(systems))
	worst := make([]float64, len(systems))
	worstName := make([]string, len(systems))
	for bi, b := range bodies {
		fmt.Fprintf(tw, "%s\t", b.name)
		ref := best[bi][0]
		for si, d := range best[bi] {
			r := float64(d) / float64(ref)
			logSum[si] += math.Log(r)
			if r > worst[si] {
				worst[si], worstName[si] = r, b.name
			}
			if si == 0 {
				fmt.Fprintf(tw, "%s\t", ms(d))
			} else {
				fmt.Fprintf(tw, "%s (%.2fx)\t", ms(d), r)
			}
		}
		fmt.Fprintln(tw)
	}
	geo := make([]float64, len(systems))
	fmt.Fprint(tw, "geometric mean of the ratios\t")
	for si := range systems {
		geo[si] = math.Exp(logSum[si] / float64(len(bodies)))
		fmt.Fprintf(tw, "%.2fx\t", geo[si])
	}
	fmt.Fprintln(tw)
	fmt.Fprint(tw, "largest ratio\t")
	for si := range systems {
		fmt.Fprintf(tw, "%.2fx %s\t", worst[si], worstName[si])
	}
	fmt.Fprintln(tw)
	tw.Flush()
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	fmt.Printf("Goal (wasm): geometric mean at most %.1fx: %s (%.2fx); no body above %.0fx: %s (%.2fx, %s)\n",
		wasmGoalGeomean, met(geo[1] <= wasmGoalGeomean), geo[1], wasmGoalMax, met(worst[1] <= wasmGoalMax), worst[1], worstName[1])
	return nil
}
