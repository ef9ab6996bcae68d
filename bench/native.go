package main

// The native backend's table: data-stack programs (pandas, numpy, matplotlib) under
// the root's own python3 with no sandbox, chrooted into the native root (the same
// Debian files the sandbox runs), and under Sandcell's native backend through the CLI
// and through the API of the warm daemon; start-up also on the wasm backend. Wall
// time p50, as a ratio to the unsandboxed python3, and where the time goes.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// nativeGoal is the program of the native backend's speed goal: a run of it should
// cost less wall time than the same program under plain python3.
const nativeGoal = `import pandas as pd; print(pd.DataFrame({"a": [1, 2]}).sum())`

// nativeMemoryMiB is the native runs' memory limit (CLI --memory, API memory_mib).
const nativeMemoryMiB = 2048

// csvName is the generated CSV, in every system's workspace (/ws/data.csv).
const csvName = "data.csv"

// nprog is one program of the table.
type nprog struct {
	name  string
	code  string
	want  string // the whole stdout it must print ("\x00ROWS" is replaced by the CSV's row count)
	heavy bool   // runs -native-n times (else -native-startup-n)
	cold  bool   // the first to load its files: one untimed run first (on python3 alone when heavy)
	wasm  bool   // runs on the wasm backend too (no pandas, numpy or matplotlib there)
}

func nativePrograms() []nprog {
	return []nprog{
		{name: "start-up: print(6*7)", code: "print(6*7)", want: "42\n", wasm: true, cold: true},
		{name: "import pandas", code: "import pandas", want: "", heavy: true, cold: true},
		{name: "the goal's program (below)", code: nativeGoal, want: "a    3\ndtype: int64\n", heavy: true},
		{name: "groupby: 1M rows, 100 groups, sum+mean", heavy: true, want: "100 0.1038\n", code: `import numpy as np, pandas as pd
rng = np.random.default_rng(42)
n = 1_000_000
df = pd.DataFrame({"k": rng.integers(0, 100, n), "v": rng.standard_normal(n)})
r = df.groupby("k")["v"].agg(["sum", "mean"])
print(len(r), round(r["mean"].sum(), 4))`},
		{name: "merge: 500k x 100k rows on a key", heavy: true, want: "500000\n", code: `import numpy as np, pandas as pd
rng = np.random.default_rng(42)
a = pd.DataFrame({"key": rng.integers(0, 100_000, 500_000), "x": rng.random(500_000)})
b = pd.DataFrame({"key": rng.permutation(100_000), "y": rng.random(100_000)})
m = a.merge(b, on="key")
print(len(m))`},
		{name: "pd.read_csv of a 100 MB CSV", heavy: true, want: "\x00ROWS\n", code: `import pandas as pd
df = pd.read_csv("/ws/` + csvName + `")
print(len(df))`},
		{name: "matplotlib: plot, savefig PNG", heavy: true, cold: true, want: "True\n", code: `import os
import matplotlib.pyplot as plt
plt.plot(range(1000))
plt.savefig("/ws/figure.png")
print(os.path.getsize("/ws/figure.png") > 0)`},
	}
}

// nsys is one way to run the table's programs.
type nsys struct {
	name string
	// run runs p once and returns its stdout and, for a sandbox, the run's own
	// elapsed time as its result gives it (worker start to exit; 0 otherwise).
	run func(p nprog) (stdout string, elapsed time.Duration, err error)
	// prepare runs before each timed run, untimed; or nil.
	prepare func()
	wasm    bool   // the wasm backend: runs only the programs marked wasm
	skip    string // why the column has no figures, or ""
}

// ncell is one program's figures on one system.
type ncell struct {
	wall, elapsed []time.Duration
	note          string // instead of figures
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// nativeRoot is the bundle's native root and whether it holds its python3.13 (it
// does once `make bundle` has built it).
func nativeRoot(bundleDir string) (string, bool) {
	rootfs := filepath.Join(bundleDir, bundle.NativeDir, bundle.NativeRootDir)
	_, err := os.Stat(filepath.Join(rootfs, "usr/bin/python3.13"))
	return rootfs, err == nil
}

// nativeTable measures and prints the native backend's table. warm is the daemon
// (warm pool) whose API the sandbox rows use; dir a scratch directory.
func nativeTable(bin, bundleDir string, warm, cold *daemon, dir string, n, startupN int) error {
	began, loadBefore := time.Now(), loadavg()
	n, startupN = max(n, 1), max(startupN, 1)
	rootfs, ok := nativeRoot(bundleDir)
	if !ok {
		fmt.Printf("\nThe native backend: skipped (no native root in %s: run make bundle)\n", bundleDir)
		return nil
	}
	fmt.Fprintln(os.Stderr, "bench: the native backend")
	progs := nativePrograms()

	// The workspace: the CSV, generated once before any timing, the same file for
	// every system (bound at /ws for the chroot, --workspace for the CLI, uploaded
	// to a workspace of the daemon for the API).
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	rows, err := writeCSV(filepath.Join(ws, csvName), 100_000_000)
	if err != nil {
		return err
	}
	for i := range progs {
		progs[i].want = strings.ReplaceAll(progs[i].want, "\x00ROWS", strconv.Itoa(rows))
	}
	csv, err := os.ReadFile(filepath.Join(ws, csvName))
	if err != nil {
		return err
	}
	ctx := context.Background()
	wsIDs := map[*daemon]string{}
	for _, d := range []*daemon{warm, cold} {
		w, err := d.Client.CreateWorkspace(ctx)
		if err != nil {
			return fmt.Errorf("create a workspace: %w", err)
		}
		if err := d.Client.WriteFile(ctx, w.ID, csvName, csv); err != nil {
			return fmt.Errorf("upload the CSV: %w", err)
		}
		wsIDs[d] = w.ID
	}
	csv = nil

	// python3 in the native root, chrooted, no sandbox: in a mount namespace of one
	// locked thread of this process, so that nothing is left mounted if the bench dies.
	py := nsys{name: "python3 (chroot)"}
	var j *jail
	if os.Geteuid() != 0 {
		py.skip = "skipped: not root (chroot(2) and mount(2) need root)"
	} else if j, err = newJail(rootfs, filepath.Join(dir, "root"), ws); err != nil {
		py.skip = "skipped: " + err.Error()
	} else {
		defer j.close()
		py.run = j.python
	}
	// The same python3, command and workspace under gVisor (runsc), no Sandcell: the
	// cost of a gVisor layer (see gvisor.go). Last, so that the columns before it
	// keep their places in the table of where the time goes.
	gv := nsys{name: "python3 (runsc)"}
	g, why := newGVisor(rootfs, ws, filepath.Join(dir, "gvisor"))
	if g != nil {
		gv.run = g.python
	} else {
		gv.skip = why
	}
	cli := func(wasm bool, extra ...string) func(p nprog) (string, time.Duration, error) {
		return func(p nprog) (string, time.Duration, error) {
			args := []string{"run", "--json", "--workspace", ws, "--timeout", "180s"}
			if !wasm {
				args = append(args, "--backend", "native", "--memory", strconv.Itoa(nativeMemoryMiB))
			}
			args = append(args, extra...)
			cmd := exec.Command(bin, append(args, "-c", p.code)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			var res struct {
				Stdout, Stderr, Reason string
				ExitCode               int     `json:"exit_code"`
				ElapsedMS              float64 `json:"elapsed_ms"`
			}
			if jerr := json.Unmarshal(out, &res); jerr != nil {
				return "", 0, fmt.Errorf("sandcell run: %v %v: %s", err, jerr, stderr.Bytes())
			}
			if res.Reason != "exited" || res.ExitCode != 0 {
				return "", 0, fmt.Errorf("sandcell run: %s, exit %d: %s", res.Reason, res.ExitCode, res.Stderr)
			}
			return res.Stdout, time.Duration(res.ElapsedMS * float64(time.Millisecond)), nil
		}
	}
	api := func(d *daemon, wasm bool) func(p nprog) (string, time.Duration, error) {
		return func(p nprog) (string, time.Duration, error) {
			req := wire.RunRequest{Code: p.code, Workspace: wsIDs[d], Limits: wire.RunLimits{TimeoutMS: 180_000}}
			if !wasm {
				req.Backend, req.Limits.MemoryMiB = "native", nativeMemoryMiB
			}
			v, err := d.Client.Run(ctx, req)
			if err != nil {
				return "", 0, err
			}
			if v.Result == nil || v.Result.Reason != "exited" || v.Result.ExitCode != 0 {
				if v.Result == nil {
					return "", 0, fmt.Errorf("API run: no result")
				}
				return "", 0, fmt.Errorf("API run: %s, exit %d: %s", v.Result.Reason, v.Result.ExitCode, v.Result.Stderr)
			}
			return string(v.Result.Stdout), time.Duration(v.Result.ElapsedMS * float64(time.Millisecond)), nil
		}
	}
	systems := []nsys{
		py,
		{name: "CLI native", run: cli(false)},
		{name: "API native (cold)", run: api(cold, false)},
		// A warm native worker for the workspace: each run waits, untimed, until
		// the one its previous run left is ready (the imports done), as an agent's
		// next run would after its model's turn.
		{name: "API native (warm)", run: api(warm, false), prepare: warm.waitNativeWarm},
		{name: "CLI wasm", run: cli(true), wasm: true},
		// The pool is of wasm workers: each run waits, untimed, until it is full
		// again, as the first table's warm row does.
		{name: "API wasm (warm)", run: api(warm, true), wasm: true, prepare: warm.waitFull},
		// The native backend's gvisor layer: the CLI's run, through runsc.
		{name: "CLI native (gVisor)", run: cli(false, "--require", gvisorRequire), skip: gv.skip},
		gv,
	}

	cells := make([][]ncell, len(progs))
	for pi, p := range progs {
		cells[pi] = make([]ncell, len(systems))
		fmt.Fprintf(os.Stderr, "bench: native: %s\n", p.name)
		active := []int{}
		for si, s := range systems {
			switch {
			case s.skip != "":
				cells[pi][si].note = s.skip
			case s.wasm && !p.wasm:
				cells[pi][si].note = "n/a (no pandas on wasm)"
			default:
				active = append(active, si)
			}
		}
		// Warm the page cache (the root's files are the same for every system): one
		// untimed run on each system for start-up, on the first for the first program
		// to load pandas and matplotlib (the others load what those loaded; the CSV
		// was just written).
		var warmup []int
		switch {
		case p.cold && !p.heavy:
			warmup = active
		case p.cold && len(active) > 0:
			warmup = active[:1]
		}
		for _, si := range warmup {
			if _, _, err := systems[si].run(p); err != nil {
				return fmt.Errorf("%s, %s: %w", systems[si].name, p.name, err)
			}
		}
		runs := startupN
		if p.heavy {
			runs = n
		}
		// Round robin, so that a busy moment of the machine falls on every system.
		for i := 0; i < runs; i++ {
			for _, si := range active {
				s := systems[si]
				if s.prepare != nil {
					s.prepare()
				}
				t := time.Now()
				out, el, err := s.run(p)
				d := time.Since(t)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", s.name, p.name, err)
				}
				if out != p.want {
					return fmt.Errorf("%s, %s: printed %q, want %q", s.name, p.name, out, p.want)
				}
				c := &cells[pi][si]
				c.wall = append(c.wall, d)
				if el > 0 {
					c.elapsed = append(c.elapsed, el)
				}
			}
		}
	}

	// The CLI's own check of the root before each native run (bundle.OpenNativeStamped:
	// lstat of every entry against the VERIFIED record), in this process.
	var stamp []time.Duration
	for i := 0; i < 5; i++ {
		t := time.Now()
		if _, err := bundle.OpenNativeStamped(bundleDir); err != nil {
			return err
		}
		stamp = append(stamp, time.Since(t))
	}
	root, _ := bundle.OpenNativeStamped(bundleDir)

	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }
	fmt.Printf("\nThe native backend: wall time p50 in ms (ratio to python3 (chroot)), %d runs per cell (start-up: %d), round robin across the columns\n", n, startupN)
	fmt.Printf("  python3 (chroot): the native root's own /usr/bin/python3.13 -I -c CODE, chrooted into it (read-only), no sandbox\n")
	fmt.Printf("  CLI native: sandcell run --backend native --workspace DIR --memory %d --json -c CODE; CLI wasm: sandcell run --workspace DIR --json -c CODE\n", nativeMemoryMiB)
	fmt.Printf("  API native: POST /v1/runs {\"backend\":\"native\", limits.memory_mib %d}: (cold) to a daemon with native.warm 0, each run a worker of its own;\n"+
		"    (warm) to one with native.warm 2, a warm native worker for the workspace ready (numpy, pandas, matplotlib.pyplot imported) before each run;\n"+
		"    API wasm: the warm daemon, its pool of %d full before each run\n", nativeMemoryMiB, poolSize)
	if g != nil {
		fmt.Printf("  python3 (runsc): python3 (chroot)'s command, environment and workspace in a container of %s (gVisor: --rootless --network=none\n"+
			"    --platform=%s; the root read-only, /ws bound, /tmp a tmpfs), no Sandcell: what a gVisor layer would add to a native run\n", g.version, gvisorPlatform)
	}
	if g != nil {
		fmt.Printf("  CLI native (gVisor): CLI native with --require %s: the gvisor layer, each run in a runsc container of its own\n", gvisorRequire)
	}
	fmt.Printf("  the same 100 MB CSV (%d rows) in every workspace; the goal's program: %s\n", rows, nativeGoal)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "program\t")
	for _, s := range systems {
		fmt.Fprintf(tw, "%s\t", s.name)
	}
	fmt.Fprintln(tw)
	for pi, p := range progs {
		fmt.Fprintf(tw, "%s\t", p.name)
		base := p50(cells[pi][0].wall)
		for si := range systems {
			c := cells[pi][si]
			switch {
			case c.note != "":
				fmt.Fprintf(tw, "%s\t", c.note)
			case base > 0:
				fmt.Fprintf(tw, "%s (%.1fx)\t", ms(p50(c.wall)), float64(p50(c.wall))/float64(base))
			default:
				fmt.Fprintf(tw, "%s\t", ms(p50(c.wall)))
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()

	// Where the time goes: python3's own wall time, the sandboxed run's elapsed time
	// as its result reports it (worker start to exit: fork with namespaces, the
	// hardening, the exec of the root's python3 and the program), and what the CLI
	// and the daemon add around it.
	fmt.Printf("\nWhere a native run's time goes, p50 ms: \"run\" is the result's elapsed_ms (the worker's start to its exit: namespaces, hardening,\n" +
		"the exec of python3, the program); \"around\" is wall - run (the CLI: its start, the check of the root, the spawner; the API: HTTP, audit, workspace)\n")
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "program\tpython3\tAPI cold run\taround\tAPI warm run\taround\tCLI run\taround\tAPI cold run - python3\t")
	for pi, p := range progs {
		py, cl, ap, aw := cells[pi][0], cells[pi][1], cells[pi][2], cells[pi][3]
		around := func(c ncell) string { return ms(p50(c.wall) - p50(c.elapsed)) }
		base, cost := "-", "-"
		if len(py.wall) > 0 {
			base = ms(p50(py.wall))
			cost = fmt.Sprintf("%+.0f", float64((p50(ap.elapsed)-p50(py.wall)).Microseconds())/1000)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.name, base,
			ms(p50(ap.elapsed)), around(ap), ms(p50(aw.elapsed)), around(aw), ms(p50(cl.elapsed)), around(cl), cost)
	}
	tw.Flush()
	entries := 0
	if root != nil {
		entries = root.Entries
	}
	fmt.Printf("the CLI's check of the native root before each run (bundle.OpenNativeStamped: lstat of its %d entries against the VERIFIED record), in process: %s ms p50 of 5\n", entries, ms(p50(stamp)))

	if j != nil {
		// A native guest's /tmp is a fresh tmpfs, so matplotlib builds its font cache
		// (MPLCONFIGDIR=/tmp/.matplotlib) in every run; python3's here lasts the bench.
		var fc []time.Duration
		for i := 0; i < 3; i++ {
			out, _, err := j.python(nprog{code: "import time\nfrom matplotlib import font_manager as f\n" +
				"t = time.perf_counter()\nf._load_fontmanager(try_read_cache=False)\nprint(int((time.perf_counter() - t) * 1e6))"})
			us, perr := strconv.Atoi(strings.TrimSpace(out))
			if err != nil || perr != nil {
				fc = nil
				break
			}
			fc = append(fc, time.Duration(us)*time.Microsecond)
		}
		if len(fc) > 0 {
			fmt.Printf("matplotlib's font cache, built again (what every native run that imports pyplot pays: its /tmp is new), in python3 (chroot): %s ms p50 of 3\n", ms(p50(fc)))
		}
	}

	// The speed goal.
	gi := slices.IndexFunc(progs, func(p nprog) bool { return p.code == nativeGoal })
	goal := "goal: a native-backend run of the goal's program in less wall time than plain python3"
	if base := p50(cells[gi][0].wall); base == 0 {
		fmt.Printf("%s: not measured (python3 (chroot) %s)\n", goal, cells[gi][0].note)
	} else {
		best, by := time.Duration(0), ""
		for si := 1; si <= 3; si++ {
			if d := p50(cells[gi][si].wall); d > 0 && (best == 0 || d < best) {
				best, by = d, systems[si].name
			}
		}
		r := float64(best) / float64(base)
		switch {
		case best >= base:
			fmt.Printf("%s: NOT MET: the best native-backend p50 (%s) is %s ms against python3's %s ms (%.2fx)\n",
				goal, by, ms(best), ms(base), r)
		case r > 0.9:
			fmt.Printf("%s: p50 below python3's (%s: %s ms against %s ms, %.2fx), by less than 10%%: within this machine's noise, not met\n",
				goal, by, ms(best), ms(base), r)
		default:
			fmt.Printf("%s: MET: %s p50 %s ms against python3's %s ms (%.2fx)\n", goal, by, ms(best), ms(base), r)
		}
	}
	fmt.Printf("(the native backend's table took %s; load average %s before, %s after, on %d CPUs)\n",
		time.Since(began).Round(time.Second), loadBefore, loadavg(), runtime.NumCPU())
	return nil
}

// writeCSV writes a CSV of at least size bytes (a fixed seed: the same file every
// time) and returns its number of data rows: four numeric columns (an id, a key of
// 100 values, a normal and a uniform float), about 28 bytes a row. (A string column
// would double pd.read_csv's time, and the bench's.)
func writeCSV(path string, size int) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	rng := rand.New(rand.NewPCG(42, 42))
	line := []byte("id,k,v,w\n")
	bw.Write(line)
	written, rows := len(line), 0
	for written < size {
		line = strconv.AppendInt(line[:0], int64(rows), 10)
		line = append(line, ',')
		line = strconv.AppendInt(line, int64(rng.IntN(100)), 10)
		line = append(line, ',')
		line = strconv.AppendFloat(line, rng.NormFloat64()*100, 'f', 4, 64)
		line = append(line, ',')
		line = strconv.AppendFloat(line, rng.Float64(), 'f', 6, 64)
		line = append(line, '\n')
		bw.Write(line)
		written += len(line)
		rows++
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	return rows, f.Close()
}

// jail runs python3 chrooted into a read-only bind mount of the native root, with a
// private tmpfs at /tmp, the workspace at /ws and the host's /dev and /proc, all
// mounted in a mount namespace of its own locked thread: the mounts exist for that
// thread and the processes it starts, and vanish with it (the bench dying included);
// the root's own directory is never written or mounted over (its VERIFIED record
// stays valid).
type jail struct {
	mnt  string
	reqs chan func()
	done chan struct{}
}

func newJail(rootfs, mnt, ws string) (*jail, error) {
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	j := &jail{mnt: mnt, reqs: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(j.done)
		// Never unlocked: the thread ends with this goroutine, and its mount
		// namespace with it. While it is locked, the runtime starts no thread from it.
		runtime.LockOSThread()
		if err := j.mount(rootfs, ws); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range j.reqs {
			f()
		}
		unix.Unmount(mnt, unix.MNT_DETACH)
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return j, nil
}

func (j *jail) mount(rootfs, ws string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare(CLONE_NEWNS): %w", err)
	}
	// Private first: no mount below propagates back to the host's namespace.
	steps := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"", "/", "", unix.MS_REC | unix.MS_PRIVATE, ""},
		{rootfs, j.mnt, "", unix.MS_BIND, ""},
		{"", j.mnt, "", unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY, ""},
		{"tmpfs", j.mnt + "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "size=1g,mode=1777"},
		{ws, j.mnt + "/ws", "", unix.MS_BIND, ""},
		{"/dev", j.mnt + "/dev", "", unix.MS_BIND, ""},
		{"/proc", j.mnt + "/proc", "", unix.MS_BIND | unix.MS_REC, ""},
	}
	for _, s := range steps {
		if err := unix.Mount(s.src, s.dst, s.fstype, s.flags, s.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", s.src, s.dst, err)
		}
	}
	return nil
}

// python runs p with the root's python3 -I, chrooted, in /ws, with the environment
// the native backend gives its guests (matplotlib draws to files, its cache in
// /tmp, which here lasts the whole bench as a user's home would).
func (j *jail) python(p nprog) (string, time.Duration, error) {
	cmd := exec.Command("/usr/bin/python3.13", "-I", "-c", p.code)
	cmd.Env = []string{"HOME=/tmp", "LANG=C.UTF-8", "MPLBACKEND=Agg", "MPLCONFIGDIR=/tmp/.matplotlib", "PATH=/usr/bin"}
	cmd.Dir = "/ws"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: j.mnt, Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Started (cloned) on the jail's thread, in its mount namespace.
	started := make(chan error)
	j.reqs <- func() { started <- cmd.Start() }
	if err := <-started; err != nil {
		return "", 0, err
	}
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", 0, fmt.Errorf("python3: %v: %s", err, stderr.Bytes())
		}
		return "", 0, err
	}
	return stdout.String(), 0, nil
}

func (j *jail) close() {
	close(j.reqs)
	<-j.done
}

// loadavg is the 1-minute load average (proc(5), /proc/loadavg), or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
