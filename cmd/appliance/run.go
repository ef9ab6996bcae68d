package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/seccomp"
	"github.com/sandcell/sandcell/supervisor/wire"
)

type runFlags struct {
	code      string
	workspace string
	stdin     string
	timeout   time.Duration
	cpu       time.Duration
	memoryMiB int64
	fuel      uint64
	maxOutput int64
	env       []string
	json      bool
	bundleDir string
	cacheDir  string
	require   []string
	profile   string
	socket    string
	backend   string
}

func newRunCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [-c CODE | FILE.py] [flags] [-- ARGS...]",
		Short: "Run Python in a fresh sandboxed worker",
		Long: `Run Python code (-c) or a host FILE.py in a fresh worker: python.wasm under
wasmtime, with only the workspace visible (as /ws, also the working directory), an
empty environment, no network and no processes.

The program's stdout and stderr are printed as they are, and sandcell exits with the
program's exit status. Runs that do not end by themselves exit with:
  124 timeout   125 sandcell failed (usage, bundle, internal error)   126 rejected
  130 cancelled   134 trap   137 memory_limit   152 cpu_limit   153 output_limit
(A program out of memory gets MemoryError; one that does not catch it ends as
memory_limit, exit 137.)
--json prints the whole result object on stdout instead, with the same exit status;
its "enforcement" object is the contract: the layers that were in force.

Before any code runs the worker applies, and verifies, resource limits, its own
user/network/mount/pid/IPC/UTS namespaces, an empty capability set, Landlock,
no_new_privs and a seccomp filter. A layer named in --require that it cannot verify
ends the run as rejected (exit 126) with no code run.`,
		RunE: func(cmd *cobra.Command, args []string) error { return runRun(cmd, &f, args) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.code, "code", "c", "", "Python source to run")
	fl.StringVarP(&f.workspace, "workspace", "w", "", "host directory seen as /ws (default: a private temporary one, removed afterwards)")
	fl.StringVar(&f.stdin, "stdin", "", "file to give the program as stdin, or - for this process's stdin (read in full before the run starts)")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "wall-clock limit")
	fl.DurationVar(&f.cpu, "cpu", 0, "CPU-time limit (0: only the wall clock)")
	fl.Int64Var(&f.memoryMiB, "memory", 256, "guest memory limit in MiB")
	fl.Uint64Var(&f.fuel, "fuel", 0, "fuel budget (wasm instructions, roughly); 0 turns fuel metering off")
	fl.Int64Var(&f.maxOutput, "max-output", policy.MiB, "cap on each of stdout and stderr, in bytes")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "NAME=VALUE to put in the guest's otherwise empty environment (repeatable)")
	fl.BoolVar(&f.json, "json", false, "print the result as JSON")
	fl.StringVar(&f.bundleDir, "bundle-dir", defaultBundleDir(), "directory holding python.wasm and MANIFEST ($SANDCELL_BUNDLE_DIR)")
	fl.StringVar(&f.cacheDir, "cache-dir", defaultCacheDir(), "where a rebuilt .cwasm is kept ($SANDCELL_CACHE_DIR)")
	fl.StringSliceVar(&f.require, "require", protocol.Layers(), "enforcement layers without which no code runs (comma-separated; \"none\" for none; with --backend native, \"gvisor\" without \"landlock\" runs it under gVisor's runsc)")
	fl.StringVar(&f.profile, "seccomp-profile", "", "OCI seccomp profile (JSON) to use instead of the built-in one")
	fl.StringVar(&f.backend, "backend", protocol.BackendWasm, "where the code runs: wasm, or native (Debian's CPython with numpy, pandas, matplotlib, scipy, scikit-learn; the bundle's native root, make native)")
	fl.StringVar(&f.socket, "socket", os.Getenv("SANDCELL_SOCKET"), "run through the daemon listening on this Unix socket ($SANDCELL_SOCKET) instead of a local worker")
	return cmd
}

// checkFlags refuses limits that would otherwise be rounded to zero and so silently
// replaced by the defaults, and values that overflow.
func checkFlags(f *runFlags) error {
	switch {
	case f.timeout < time.Millisecond:
		return fmt.Errorf("--timeout %v: must be at least 1ms", f.timeout)
	case f.cpu != 0 && f.cpu < time.Millisecond:
		return fmt.Errorf("--cpu %v: must be 0 (off) or at least 1ms", f.cpu)
	case f.memoryMiB < policy.MinMemoryBytes/policy.MiB || f.memoryMiB > 4096:
		return fmt.Errorf("--memory %d: must be between %d and 4096 MiB", f.memoryMiB, policy.MinMemoryBytes/policy.MiB)
	case f.maxOutput < 1:
		return fmt.Errorf("--max-output %d: must be at least 1 byte", f.maxOutput)
	}
	return nil
}

func runRun(cmd *cobra.Command, f *runFlags, args []string) error {
	if err := checkFlags(f); err != nil {
		return rejected{err}
	}
	req := protocol.Request{Limits: protocol.Limits{
		TimeoutMS:      f.timeout.Milliseconds(),
		CPUMS:          f.cpu.Milliseconds(),
		MemoryBytes:    f.memoryMiB * policy.MiB,
		Fuel:           f.fuel,
		MaxStdoutBytes: f.maxOutput,
		MaxStderrBytes: f.maxOutput,
	}}
	switch {
	case cmd.Flags().Changed("code"):
		req.Code, req.Args = f.code, args
	case len(args) > 0:
		src, err := os.ReadFile(args[0])
		if err != nil {
			return err
		}
		// A UTF-8 byte order mark is allowed at the start of a source file (PEP 263).
		src = bytes.TrimPrefix(src, []byte("\ufeff"))
		req.Code, req.Filename, req.Args = string(src), filepath.Base(args[0]), args[1:]
	default:
		return errors.New("give -c CODE or FILE.py")
	}
	pol := policy.Default()
	limits, err := pol.Resolve(req.Limits)
	if err != nil {
		return rejected{errors.New(strings.Join(policy.Describe(err, flagLimitName), "; "))}
	}
	req.Limits = limits
	pol.Require = f.require
	switch {
	case len(f.require) == 0:
		return rejected{errors.New(`--require: give layer names, or "none"`)}
	case len(f.require) == 1 && f.require[0] == "none":
		pol.Require = nil
	}
	if f.profile != "" {
		prof, err := seccomp.LoadFile(f.profile)
		if err != nil {
			return rejected{err}
		}
		pol.Seccomp = &prof
	}
	gvisor := slices.Contains(pol.Require, protocol.LayerGVisor)
	if gvisor && f.backend == protocol.BackendNative {
		// gvisor is the native backend's layer alone (see policy.Validate).
		pol.NativeRequire, pol.Require = pol.Require, nil
	}
	if err := pol.Validate(); err != nil {
		return rejected{err}
	}
	req.Hardening = pol.Hardening(limits)
	switch f.backend {
	case protocol.BackendWasm:
	case protocol.BackendNative:
		if f.fuel > 0 {
			return rejected{errors.New("--fuel: fuel is counted by the wasm engine; the native backend has none (use --cpu)")}
		}
		req.Backend, req.Hardening = protocol.BackendNative, pol.NativeHardening(limits)
	default:
		return rejected{fmt.Errorf("--backend %q: one of %s", f.backend, strings.Join(protocol.Backends(), ", "))}
	}
	if len(f.env) > 0 {
		req.Env = map[string]string{}
		for _, kv := range f.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("--env %q: want NAME=VALUE", kv)
			}
			req.Env[k] = v
		}
	}
	if f.stdin != "" {
		if req.Stdin, err = readStdin(f.stdin); err != nil {
			return err
		}
	}

	if f.socket != "" {
		return runRemote(cmd, f, req)
	}

	if f.workspace == "" {
		dir, err := os.MkdirTemp("", "sandcell-ws-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		req.Workspace = dir
	} else {
		dir, err := filepath.Abs(f.workspace)
		if err != nil {
			return err
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return rejected{fmt.Errorf("workspace %s is not a directory", f.workspace)}
		}
		req.Workspace = dir
	}

	if req.Backend == protocol.BackendNative {
		root, err := bundle.OpenNativeStamped(f.bundleDir)
		if err != nil {
			return err
		}
		req.RootDir = root.Dir
	} else if req.ModulePath, req.LibDir, err = precompiled(f.bundleDir, f.cacheDir, req.Limits.Fuel > 0); err != nil {
		return err
	} else if req.Limits.Fuel == 0 {
		req.EpochlessModulePath = req.ModulePath // a run's own module (protocol.Request.RunModule)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	sp := newSpawner(f.bundleDir, f.cacheDir)
	if gvisor {
		// One directory per user, shared by its concurrent runs: what a killed one
		// left there goes at the next (see sandbox.NewGVisor).
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("sandcell-gvisor-%d", os.Geteuid()))
		if sp.GVisor, err = sandbox.NewGVisor("runsc", dir); err != nil {
			return rejected{fmt.Errorf("--require gvisor: %w", err)}
		}
	}
	res, err := sp.Run(ctx, req)
	if errors.Is(err, sandbox.ErrBadRequest) {
		return rejected{err}
	}
	if err != nil {
		return err
	}
	return report(f, res, req.Limits)
}

// runRemote runs req through the daemon at f.socket: the daemon applies its own
// policy (limits here only lower its defaults), workspace and hardening.
func runRemote(cmd *cobra.Command, f *runFlags, req protocol.Request) error {
	for _, local := range []string{"workspace", "require", "seccomp-profile", "bundle-dir", "cache-dir"} {
		if cmd.Flags().Changed(local) {
			return rejected{fmt.Errorf("--%s applies to local runs; the daemon has its own (see sandcell config)", local)}
		}
	}
	rr := wire.RunRequest{Code: req.Code, Args: req.Args, Stdin: string(req.Stdin), Env: req.Env, Backend: req.Backend}
	if !utf8.Valid(req.Stdin) {
		// JSON strings carry text: other bytes go as base64.
		rr.Stdin, rr.StdinEncoding = base64.StdEncoding.EncodeToString(req.Stdin), "base64"
	}
	if cmd.Flags().Changed("timeout") {
		rr.Limits.TimeoutMS = f.timeout.Milliseconds()
	}
	if cmd.Flags().Changed("cpu") {
		rr.Limits.CPUMS = f.cpu.Milliseconds()
	}
	if cmd.Flags().Changed("memory") {
		rr.Limits.MemoryMiB = f.memoryMiB
	}
	rr.Limits.Fuel = f.fuel
	if cmd.Flags().Changed("max-output") {
		rr.Limits.MaxOutputBytes = f.maxOutput
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	v, err := client.New(f.socket).Run(ctx, rr)
	var p *wire.Problem
	switch {
	case errors.As(err, &p) && p.Status >= 400 && p.Status < 500 && p.Status != http.StatusTooManyRequests:
		return rejected{err}
	case ctx.Err() != nil:
		return exitCode(exitCancelled)
	case err != nil:
		return err
	case v.Result == nil:
		return fmt.Errorf("the daemon answered without a result")
	}
	return report(f, *v.Result, req.Limits)
}

// report prints res as `sandcell run` does and returns its exit status as an error.
func report(f *runFlags, res protocol.Result, limits protocol.Limits) error {
	if f.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		os.Stdout.Write(res.Stdout)
		os.Stderr.Write(res.Stderr)
		for _, line := range notes(res, limits) {
			fmt.Fprintln(os.Stderr, "sandcell:", line)
		}
		for _, d := range res.Displays {
			fmt.Fprintf(os.Stderr, "sandcell: displayed %s in the workspace's %s (%d bytes)\n", d.Type, d.Path, d.Bytes)
		}
	}
	if code := exitStatus(res); code != 0 {
		return exitCode(code)
	}
	return nil
}

// rejected marks an error that refuses the request itself (policy, bad input): the
// CLI exits 126 for it rather than 125.
type rejected struct{ error }

func (r rejected) Unwrap() error { return r.error }

// precompiled opens the bundle and returns a verified .cwasm for a run (the fuel
// engine variant with fuel, the epochless one without), compiling one (seconds, once
// per host) when none is usable, and the interpreter's library directory.
func precompiled(bundleDir, cacheDir string, fuel bool) (module, lib string, err error) {
	b, err := bundle.Open(bundleDir)
	if err != nil {
		return "", "", fmt.Errorf("%w (bundle directory %s; run `make bundle`)", err, bundleDir)
	}
	v := engine.Epochless
	if fuel {
		v = engine.Fuel
	}
	pre, err := b.Precompiled(engine.New(v.Options()), cacheDir)
	if err != nil {
		return "", "", err
	}
	if pre.Rebuilt {
		fmt.Fprintf(os.Stderr, "sandcell: compiled the interpreter for this host into %s\n", pre.Path)
	}
	return pre.Path, b.LibPath(), nil
}

func readStdin(name string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, protocol.MaxFrame/2+1))
	if err != nil {
		return nil, err
	}
	if len(data) > protocol.MaxFrame/2 {
		// A request over the limit: refused like any other (exit 126).
		return nil, rejected{fmt.Errorf("stdin is larger than %d bytes", protocol.MaxFrame/2)}
	}
	return data, nil
}

// exitStatus maps a result to the CLI's exit status (see the run command's help).
func exitStatus(res protocol.Result) int {
	switch res.Reason {
	case protocol.Exited:
		return res.ExitCode
	case protocol.Timeout:
		return exitTimeout
	case protocol.Cancelled:
		return exitCancelled
	case protocol.Trap:
		return exitTrap
	case protocol.CPULimit:
		return exitCPULimit
	case protocol.MemoryLimit:
		return exitMemoryLimit
	case protocol.OutputLimit, protocol.QuotaExceeded:
		return exitOutputLimit
	case protocol.Rejected:
		return exitRejected
	default:
		return exitUsage
	}
}

// notes explains, on stderr, a run that did not simply exit.
func notes(res protocol.Result, l protocol.Limits) []string {
	var out []string
	switch res.Reason {
	case protocol.Exited:
	case protocol.Timeout:
		out = append(out, fmt.Sprintf("timeout: killed after the %v wall-clock limit", time.Duration(l.TimeoutMS)*time.Millisecond))
	case protocol.OutputLimit:
		out = append(out, fmt.Sprintf("output_limit: killed at the %d-byte output cap", l.MaxStdoutBytes))
	case protocol.MemoryLimit:
		out = append(out, fmt.Sprintf("memory_limit: out of memory at the %d MiB limit", l.MemoryBytes/policy.MiB))
	default:
		out = append(out, string(res.Reason))
	}
	for _, d := range res.Diagnostics {
		out = append(out, "  "+d)
	}
	if res.StdoutTruncated {
		out = append(out, "stdout truncated")
	}
	if res.StderrTruncated {
		out = append(out, "stderr truncated")
	}
	return out
}

// flagLimitName names a limit as sandcell run's flags do.
func flagLimitName(e *policy.LimitError, v int64) (string, string) {
	switch e.Field {
	case "timeout_ms":
		return "--timeout", (time.Duration(v) * time.Millisecond).String()
	case "cpu_ms":
		return "--cpu", (time.Duration(v) * time.Millisecond).String()
	case "memory_bytes":
		return "--memory", strconv.FormatFloat(float64(v)/policy.MiB, 'f', -1, 64)
	case "max_stdout_bytes", "max_stderr_bytes":
		return "--max-output", strconv.FormatInt(v, 10)
	}
	return "--" + e.Field, strconv.FormatInt(v, 10)
}
