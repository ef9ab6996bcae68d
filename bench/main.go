// Command bench is the side-by-side harness of `make bench`: from one run, one table
// of `print(6*7)` latency (p50/p90/p99 over sequential calls), throughput at
// concurrency 1, 2 and 8, CPU-seconds per run and peak memory, for Sandcell through
// the API (two daemons it starts: with a warm pool, and with a cold worker per run)
// and through the CLI, the MCP tool run_python over stdio and over /mcp, native
// python3 with no sandbox,
// and python3 under bubblewrap --unshare-all; each figure also as a ratio to native
// python3. Then a CPU-bound program, native against the sandbox.
//
// Then (python.go) the guest's speed: benchmark bodies of the standard library's
// kinds timed inside CPython 3.13 with no sandbox and inside each backend, as ratios.
//
// Then a second table (native.go): the native backend, on start-up, `import pandas`,
// a groupby, a merge, pd.read_csv of a 100 MB file and a matplotlib figure, under the
// native root's own python3 with no sandbox (chrooted, as root), Sandcell's native
// backend through the CLI and through the warm daemon's API, and the wasm backend
// for start-up; wall time p50 as a ratio to the unsandboxed python3, where the time
// goes, and whether the native backend's goal (a native run of a small pandas program cheaper
// than plain python3) is met.
//
// Then (toolcall.go) the round trip of a guest's tool call (code mode): the reference
// "everything" MCP server's echo called from a program on each backend, against the
// same server called directly, and Sandcell's own cost of a call, the difference.
//
// The numbers are from a shared, noisy machine: compare the rows of one run, not runs.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/bench/harness"
	"github.com/sandcell/sandcell/supervisor/wire"
)

const program = "print(6*7)"

// system is one way to run the program: run performs one run and returns the peak
// RSS of the process it started, when it started one (0 otherwise). (The first
// result is unused: CPU is measured around the call.)
type system struct {
	name    string
	run     func() (cpu time.Duration, rssKiB int64, err error)
	prepare func()  // before each sequential run, not timed; or nil
	daemon  *daemon // the daemon serving the runs, or nil
	// also is another long-lived process whose CPU counts (`sandcell mcp`), or nil.
	also *exec.Cmd
	// wait, if set, is called after the row's runs, before its CPU is read (until
	// the work its runs left in the background is done).
	wait   func()
	native bool // runs on the native backend (the note gives its warm workers)
}

type row struct {
	name          string
	p50, p90, p99 time.Duration
	rps           [3]float64 // concurrency 1, 2, 8
	cpu           time.Duration
	rssKiB        int64
	note          string
}

var concurrencies = [3]int{1, 2, 8}

func main() {
	n := flag.Int("n", 50, "sequential runs per system (latency)")
	dur := flag.Duration("duration", 3*time.Second, "time per concurrency level (throughput)")
	bin := flag.String("sandcell", "bin/sandcell", "the sandcell binary")
	python := flag.String("python", "/usr/bin/python3", "native python3")
	bundleDir := flag.String("bundle-dir", "", "the bundle, for the native root (default: $SANDCELL_BUNDLE_DIR, else build/bundle beside the binary's bin/)")
	mainTable := flag.Bool("main", true, "measure the first table (print(6*7) by system) and the CPU-bound program")
	nativeOn := flag.Bool("native", true, "measure the native backend's table")
	toolsOn := flag.Bool("tools", true, "measure a guest's tool call's round trip (code mode)")
	pythonOn := flag.Bool("guest", true, "measure the guest's speed table (bench/python's bodies against CPython 3.13)")
	pythonRounds := flag.Int("guest-rounds", 2, "runs per column of each body of the guest's speed table")
	pythonRepeats := flag.Int("guest-repeats", 5, "timed calls of a body's bench() in each run (the least is kept)")
	pythonOnly := flag.String("guest-only", "", "the bodies of the guest's speed table to run (comma-separated names; default all)")
	nativeN := flag.Int("native-n", 5, "runs per system of each heavy program of the native table (all but start-up)")
	nativeStartupN := flag.Int("native-startup-n", 20, "runs per system of the native table's start-up program")
	flag.Parse()
	o := options{n: *n, dur: *dur, bin: *bin, python: *python, bundleDir: *bundleDir, main: *mainTable, tools: *toolsOn,
		native: *nativeOn, nativeN: *nativeN, nativeStartupN: *nativeStartupN,
		guest: *pythonOn, guestRounds: *pythonRounds, guestRepeats: *pythonRepeats, guestOnly: *pythonOnly}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func execSystem(name string, argv ...string) system {
	return system{name: name, run: func() (time.Duration, int64, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		out, err := cmd.Output()
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %v", name, err)
		}
		if strings.TrimSpace(string(out)) != "42" {
			return 0, 0, fmt.Errorf("%s printed %q", name, out)
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		return 0, ru.Maxrss, nil
	}}
}

// options are the command's flags.
type options struct {
	n                       int
	dur                     time.Duration
	bin, python, bundleDir  string
	main, native, tools     bool
	nativeN, nativeStartupN int
	// The guest's speed table (python.go).
	guest                     bool
	guestRounds, guestRepeats int
	guestOnly                 string
}

// defaultBundleDir is where `sandcell` finds its bundle when run from bin/ of a
// checkout: $SANDCELL_BUNDLE_DIR, else ../build/bundle beside the binary.
func defaultBundleDir(bin string) string {
	if d := os.Getenv("SANDCELL_BUNDLE_DIR"); d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(filepath.Dir(bin)), "build", "bundle")
}

func run(o options) error {
	n, dur, python := o.n, o.dur, o.python
	bin, _ := filepath.Abs(o.bin)
	if o.bundleDir == "" {
		o.bundleDir = defaultBundleDir(bin)
	}
	systems := []system{execSystem("python3 (native)", python, "-c", program)}
	if bw, err := exec.LookPath("bwrap"); err == nil {
		systems = append(systems, execSystem("python3 under bwrap --unshare-all", bw, "--unshare-all", "--die-with-parent",
			"--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
			"--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", python, "-c", program))
	}
	systems = append(systems, execSystem("sandcell run (CLI, cold worker)", bin, "run", "-c", program))

	// Two daemons, with and without the warm pool: their CPU and memory are read from
	// /proc around their rows.
	dir, err := os.MkdirTemp("", "sandcell-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	daemons := map[string]*daemon{}
	for _, d := range []struct{ name, pool string }{{"cold", "0"}, {"warm", strconv.Itoa(poolSize)}} {
		// The bundle named, as `make bench` exports it: without it a daemon looks in
		// /usr/lib/sandcell, not beside bin/.
		// The cold daemon keeps no warm native worker either (native.warm 0).
		dm, err := startDaemon(bin, filepath.Join(dir, d.name), "SANDCELL_POOL_SIZE="+d.pool, "SANDCELL_BUNDLE_DIR="+o.bundleDir,
			"SANDCELL_NATIVE_WARM="+map[string]string{"cold": "0", "warm": "2"}[d.name])
		if err != nil {
			return err
		}
		defer dm.stop()
		daemons[d.name] = dm
	}
	warm, cold := daemons["warm"], daemons["cold"]
	systems = append(systems,
		system{name: fmt.Sprintf("sandcell API, warm pool of %d", poolSize), run: warm.run, daemon: warm,
			// Latency is of a warm pool: each sequential run waits until the pool is
			// full again (not timed); the throughput rows do not wait.
			prepare: warm.waitFull},
		system{name: "sandcell API, cold worker per run", run: cold.run, daemon: cold})
	if o.main {
		if err := mainTable(systems, warm, cold, o.bundleDir, n, dur, bin, python); err != nil {
			return err
		}
	}
	if o.guest {
		if err := pythonTable(o.bundleDir, warm, dir, o.guestRounds, o.guestRepeats, o.guestOnly); err != nil {
			return err
		}
	}
	if o.tools {
		if err := toolCallTable(bin, o.bundleDir, dir); err != nil {
			return err
		}
	}
	if o.native {
		return nativeTable(bin, o.bundleDir, warm, cold, dir, o.nativeN, o.nativeStartupN)
	}
	return nil
}

// mainTable measures and prints the first table (systems, then the MCP tool against
// the warm daemon, then the native backend through both daemons), then the CPU-bound
// program.
func mainTable(systems []system, warm, cold *daemon, bundleDir string, n int, dur time.Duration, bin, python string) error {
	// The MCP tool run_python against the warm daemon, as an agent host calls it:
	// over `sandcell mcp` (stdio) and over the daemon's /mcp (streamable HTTP).
	for _, transport := range []string{"stdio", "http"} {
		m, err := connectMCP(bin, warm, transport)
		if err != nil {
			return err
		}
		defer m.close()
		systems = append(systems, system{name: "MCP run_python over " + transport + ", warm pool", run: m.run,
			daemon: warm, prepare: warm.waitFull, also: m.cmd})
	}

	// Last, so that the warm native workers they leave (prepared in the background
	// after each native run) spend no CPU in the rows of the wasm backend.
	native, err := nativeSystems(bundleDir, warm, cold)
	if err != nil {
		return err
	}
	systems = append(systems, native...)

	var rows []row
	for _, s := range systems {
		fmt.Fprintf(os.Stderr, "bench: %s\n", s.name)
		var before time.Duration
		if s.daemon != nil {
			before = treeCPU(s.daemon.Pid())
		}
		if s.also != nil {
			before += procCPU(s.also.Process.Pid)
		}
		r, err := measure(s, n, dur)
		if err != nil {
			return err
		}
		if s.daemon != nil {
			// Daemon and its workers, over the sequential runs and the throughput
			// runs: the reaped ones (cutime/cstime) and those alive at either end (the
			// idle warm workers, whose start counts in the row that made them).
			pid := s.daemon.Pid()
			if s.wait != nil {
				s.wait()
			}
			after := treeCPU(pid)
			if s.also != nil {
				after += procCPU(s.also.Process.Pid)
			}
			r.row.cpu = (after - before) / time.Duration(max(r.runs, 1))
			rss, pss := smapsRollup(pid)
			r.row.note = fmt.Sprintf("daemon RSS %d MiB, PSS %d MiB", rss>>10, pss>>10)
			if s.daemon == warm && !s.native { // (a native row's idle workers are of both kinds)
				s.daemon.waitFull()
				st, _ := s.daemon.Pool()
				wrss, wpss, nw := children(pid)
				if nw > 0 {
					r.row.note += fmt.Sprintf("; idle worker RSS %d MiB, PSS %d MiB (%d idle)", wrss/int64(nw)>>10, wpss/int64(nw)>>10, nw)
				}
				r.row.note += fmt.Sprintf("; %d warm, %d cold (pool empty)", st.Hits, st.Misses)
			}
			if s.native {
				w, _ := s.daemon.NativeWarm()
				r.row.note += fmt.Sprintf("; native: %d warm, %d cold", w.Hits, w.Misses)
			}
		}
		rows = append(rows, r.row)
	}
	print(rows)
	return cpuBound(bin, python)
}

// nativeSystems are the native backend's rows: print(6*7) with "backend": "native"
// in a workspace of each daemon, the warm one keeping warm native workers
// (native.warm 2, each with numpy, pandas and matplotlib imported before its run),
// the cold one none. None when the bundle has no native root.
func nativeSystems(bundleDir string, warm, cold *daemon) ([]system, error) {
	if _, ok := nativeRoot(bundleDir); !ok {
		fmt.Fprintf(os.Stderr, "bench: no native rows (no native root in %s: run make bundle)\n", bundleDir)
		return nil, nil
	}
	var out []system
	for _, d := range []*daemon{warm, cold} {
		w, err := d.Client.CreateWorkspace(context.Background())
		if err != nil {
			return nil, fmt.Errorf("create a workspace: %w", err)
		}
		s := system{name: "sandcell API native, cold worker per run", daemon: d, native: true,
			run: d.runOf(wire.RunRequest{Code: program, Backend: "native", Workspace: w.ID})}
		if d == warm {
			// Latency is of a warm native worker: each sequential run waits, untimed,
			// until the one its previous run left is ready; the throughput rows do
			// not wait. Its CPU includes preparing the workers left at the end.
			s.name, s.prepare, s.wait = "sandcell API native, warm worker", d.waitNativeWarm, d.waitNativeWarm
		}
		out = append(out, s)
	}
	return out, nil
}

// mcpClient is an MCP session (the official Go SDK's client) with a daemon.
type mcpClient struct {
	cs  *mcp.ClientSession
	cmd *exec.Cmd // `sandcell mcp`, over stdio; nil over HTTP
}

func connectMCP(bin string, d *daemon, transport string) (*mcpClient, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	m := &mcpClient{}
	var t mcp.Transport = &mcp.StreamableClientTransport{Endpoint: "http://sandcell/mcp", HTTPClient: d.HTTP}
	if transport == "stdio" {
		m.cmd = exec.Command(bin, "mcp", "--socket", d.Sock)
		t = &mcp.CommandTransport{Command: m.cmd}
	}
	cs, err := c.Connect(context.Background(), t, nil)
	if err != nil {
		return nil, fmt.Errorf("MCP over %s: %w", transport, err)
	}
	m.cs = cs
	return m, nil
}

func (m *mcpClient) run() (time.Duration, int64, error) {
	res, err := m.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": program}})
	if err != nil {
		return 0, 0, err
	}
	if res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "\n42\n") {
		return 0, 0, fmt.Errorf("MCP run_python: %+v", res.Content)
	}
	return 0, 0, nil
}

func (m *mcpClient) close() { m.cs.Close() }

// poolSize is the warm daemon's pool.
const poolSize = 4

// daemon is a `sandcell serve` the harness started.
type daemon struct{ *harness.Daemon }

func startDaemon(bin, dir string, env ...string) (*daemon, error) {
	// The first hash secret of a new state directory is compiled in the background at
	// start (about 30 s of CPU): off, so that it competes with no measurement.
	d, err := harness.Start(bin, dir, "", append([]string{"SANDCELL_RUNS_QUEUE_LENGTH=256", "SANDCELL_BUNDLE_HASH_SECRET_ROTATION=0"}, env...)...)
	return &daemon{d}, err
}

func (d *daemon) stop() { d.Stop() }

func (d *daemon) run() (time.Duration, int64, error) {
	return d.runOf(wire.RunRequest{Code: program})()
}

// runOf is a system's run of req (print(6*7)) through the daemon's API.
func (d *daemon) runOf(req wire.RunRequest) func() (time.Duration, int64, error) {
	return func() (time.Duration, int64, error) {
		v, err := d.Client.Run(context.Background(), req)
		if err != nil {
			return 0, 0, err
		}
		if v.Result == nil || string(v.Result.Stdout) != "42\n" {
			return 0, 0, fmt.Errorf("API run (%s backend): %+v", cmp.Or(req.Backend, "wasm"), v.Result)
		}
		return 0, 0, nil
	}
}

// waitFull waits (up to 10 s) until every worker of the pool is idle.
func (d *daemon) waitFull() { d.WaitPoolFull(10 * time.Second) }

// waitNativeWarm waits until the daemon holds a warm native worker; after 60 s the
// bench ends with the daemon's last error (a row would otherwise wait a minute
// before each of its runs). Its daemons end with it (harness.Start: Pdeathsig).
func (d *daemon) waitNativeWarm() {
	if err := d.WaitNativeWarm(60 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// children sums the RSS and PSS (KiB) of pid's child processes (the idle workers).
func children(pid int) (rss, pss int64, n int) {
	for _, child := range harness.Children(pid) {
		r, p := smapsRollup(child)
		rss, pss, n = rss+r, pss+p, n+1
	}
	return rss, pss, n
}

type result struct {
	row  row
	runs int
}

func measure(s system, n int, dur time.Duration) (result, error) {
	// Warm the page cache and the daemon.
	for i := 0; i < 3; i++ {
		if _, _, err := s.run(); err != nil {
			return result{}, err
		}
	}
	lat := make([]time.Duration, 0, n)
	var cpu time.Duration
	var rss int64
	for i := 0; i < n; i++ {
		// CPU of everything the run forked and reaped (a process tree: bwrap's, the
		// CLI's worker), from this process's RUSAGE_CHILDREN; runs are sequential here.
		if s.prepare != nil {
			s.prepare()
		}
		before := childrenCPU()
		t := time.Now()
		_, r, err := s.run()
		if err != nil {
			return result{}, err
		}
		lat = append(lat, time.Since(t))
		cpu += childrenCPU() - before
		rss = max(rss, r)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	out := result{row: row{name: s.name, p50: q(0.50), p90: q(0.90), p99: q(0.99), cpu: cpu / time.Duration(n), rssKiB: rss}, runs: n + 3}
	for i, conc := range concurrencies {
		var done atomic.Int64
		var firstErr atomic.Value
		deadline := time.Now().Add(dur)
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					if _, _, err := s.run(); err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
					done.Add(1)
				}
			}()
		}
		wg.Wait()
		if err, ok := firstErr.Load().(error); ok {
			return result{}, err
		}
		out.row.rps[i] = float64(done.Load()) / time.Since(start).Seconds()
		out.runs += int(done.Load())
	}
	return out, nil
}

func print(rows []row) {
	native := rows[0]
	ratio := func(a, b float64) string {
		if b == 0 || a == 0 {
			return ""
		}
		return fmt.Sprintf(" (%.1fx)", a/b)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "print(6*7)\tp50 ms\tp90 ms\tp99 ms\truns/s c=1\tc=2\tc=8\tCPU ms/run\tpeak RSS MiB\t")
	for _, r := range rows {
		rss := ""
		if r.rssKiB > 0 {
			rss = strconv.FormatInt(r.rssKiB>>10, 10)
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%.1f%s\t%.1f\t%.1f%s\t%s%s\t%s\t%s\n", r.name,
			ms(r.p50), ratio(float64(r.p50), float64(native.p50)), ms(r.p90), ms(r.p99),
			r.rps[0], ratio(r.rps[0], native.rps[0]), r.rps[1], r.rps[2], ratio(r.rps[2], native.rps[2]),
			ms(r.cpu), ratio(float64(r.cpu), float64(native.cpu)), rss, r.note)
	}
	tw.Flush()
	fmt.Println("(ratios are to native python3; CPU per run of the API and MCP rows is the daemon's and its workers', and `sandcell mcp`'s over stdio)")
}

// cpuBound times a CPU-bound program natively and in the sandbox (wall clock, the
// median of 3). The engine's own benchmark (make bench, BenchmarkInterruption) gives
// the interpreter alone with epoch interruption on and off.
func cpuBound(bin, python string) error {
	const code = "sum(i*i for i in range(3_000_000))"
	median := func(argv ...string) (time.Duration, error) {
		var ds []time.Duration
		for i := 0; i < 3; i++ {
			t := time.Now()
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("%v: %v %s", argv, err, out)
			}
			ds = append(ds, time.Since(t))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[1], nil
	}
	nat, err := median(python, "-c", code)
	if err != nil {
		return err
	}
	sc, err := median(bin, "run", "-c", code)
	if err != nil {
		return err
	}
	fmt.Printf("\n%s: native python3 %.0f ms, sandcell run %.0f ms (%.1fx; the engine without epoch interruption, as every run)\n",
		code, float64(nat.Milliseconds()), float64(sc.Milliseconds()), float64(sc)/float64(nat))
	return nil
}

func childrenCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// treeCPU is the CPU time of pid, its reaped children and, recursively, its living
// ones (procCPU of each). A child reaped between the read of its parent and the
// listing of the children counts in neither: a row may miss one worker's CPU.
func treeCPU(pid int) time.Duration {
	t := procCPU(pid)
	for _, c := range harness.Children(pid) {
		t += treeCPU(c)
	}
	return t
}

// procCPU is the CPU time of pid and its reaped children (proc(5), /proc/PID/stat
// fields 14-17, in clock ticks of 1/100 s).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime, after the state field
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// smapsRollup returns the RSS and PSS of pid in KiB (proc(5), smaps_rollup).
func smapsRollup(pid int) (rss, pss int64) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Rss:":
				rss = v
			case "Pss:":
				pss = v
			}
		}
	}
	return rss, pss
}
