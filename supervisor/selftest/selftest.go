// Package selftest proves, on this host, that the sandbox holds before the daemon
// accepts work: the pinned interpreter's bytes, a usable
// precompiled module (rebuilt if needed), then a canary worker under the configured
// policy that must print the expected answer, report every required enforcement
// layer active, and fail each escape probe: a socket, a host file, the daemon's
// environment, a write outside /ws; and that the warm pool's workers can hold its
// workspace roots. `sandcell serve` runs it before READY=1 and
// `sandcell selftest` prints it as a table.
package selftest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// State is a check's outcome.
type State string

// The outcomes: ok; warn (works, but not as well as it could: a module rebuilt, an
// optional layer missing); fail (no code may run).
const (
	OK   State = "ok"
	Warn State = "warn"
	Fail State = "fail"
)

// Check is one line of the report.
type Check struct {
	Name   string `json:"name"`
	State  State  `json:"state"`
	Detail string `json:"detail"`
}

// Report is the whole self-test.
type Report struct {
	Checks []Check `json:"checks"`
	// Enforcement is the canary's contract, when a canary ran.
	Enforcement *protocol.Enforcement `json:"enforcement,omitempty"`
	// Modules are the verified precompiled modules, one per engine variant.
	Modules map[engine.Variant]string `json:"-"`
	// LibDir is the interpreter's standard library directory.
	LibDir string `json:"-"`
	// NativeRoot is the verified native root whose canary passed, or "" (then
	// NativeWhy says why the native backend is not offered).
	NativeRoot string `json:"-"`
	NativeWhy  string `json:"-"`
	// NativeEnforcement is the native canary's contract, when one ran.
	NativeEnforcement *protocol.Enforcement `json:"native_enforcement,omitempty"`
}

// OK reports whether no check failed.
func (r *Report) OK() bool { return r.Failure() == "" }

// Failure names the first failed check and why, or "".
func (r *Report) Failure() string {
	for _, c := range r.Checks {
		if c.State == Fail {
			return c.Name + ": " + c.Detail
		}
	}
	return ""
}

func (r *Report) add(name string, s State, format string, a ...any) {
	r.Checks = append(r.Checks, Check{Name: name, State: s, Detail: fmt.Sprintf(format, a...)})
}

// Options say what to verify.
type Options struct {
	BundleDir, CacheDir string
	Policy              policy.Policy
	Spawner             *sandbox.Spawner
	// WorkDir holds the canary's workspace (created and removed).
	WorkDir string
	// Slow, if set, is called before a step that may take seconds (compiling the
	// module), so a service manager can be told to wait (EXTEND_TIMEOUT_USEC).
	Slow func(what string)
	// PoolRoots are the warm pool's workspace roots (sandbox.PoolOptions.Roots), to
	// check that its workers can hold them; none: no pool, no check.
	PoolRoots []string
}

// Run performs the whole self-test. It stops at the first failure that leaves
// nothing to test (no bundle, no module).
func Run(ctx context.Context, o Options) *Report {
	r := &Report{Modules: map[engine.Variant]string{}}
	b, err := bundle.Open(o.BundleDir)
	if err != nil {
		r.add("bundle", Fail, "%v (bundle directory %s)", err, o.BundleDir)
		return r
	}
	if err := b.Verify(); err != nil {
		r.add("bundle", Fail, "%v", err)
		return r
	}
	r.LibDir = b.LibPath()
	r.add("bundle", OK, "CPython %s, python.wasm sha256 %s", bundle.Pinned().Version, bundle.Pinned().Wasm.SHA256[:16])
	for _, v := range engine.Variants() {
		name := "module"
		if v != engine.Plain {
			name = "module (" + string(v) + ")"
		}
		if o.Slow != nil {
			o.Slow(name)
		}
		pre, err := b.Precompiled(engine.New(v.Options()), o.CacheDir)
		switch {
		case err != nil:
			r.add(name, Fail, "no usable precompiled module and none can be built: %v", err)
			return r
		case pre.Rebuilt && len(pre.Stale) == 0:
			// The bundle ships no .cwasm for this variant (the OCI image ships the
			// epochless one only): compiled once into the cache, as designed.
			r.add(name, OK, "compiled into %s (the bundle has none for this engine variant)", pre.Path)
		case pre.Rebuilt:
			r.add(name, Warn, "compiled for this host into %s (%s)", pre.Path, strings.Join(pre.Stale, "; "))
		case pre.Unpacked:
			r.add(name, OK, "unpacked into %s", pre.Path)
		default:
			r.add(name, OK, "%s", filepath.Base(pre.Path))
		}
		r.Modules[v] = pre.Path
	}
	r.canary(ctx, o, CanaryProgram)
	r.poolRoots(o.PoolRoots)
	if r.OK() {
		r.native(ctx, o)
	}
	return r
}

// NativeCanaryProgram is the native backend's canary: numpy computes 6*7, then each
// escape probe's outcome is printed as JSON. Each must come out "denied" ("fork"
// only where the policy keeps processes off): refused with EPERM or EACCES, not
// failing otherwise (a probe whose target is missing proves nothing). An exec that
// worked would leave another program's output where the JSON should be: the canary
// fails.
const NativeCanaryProgram = `import json, os, mmap
import numpy
r = {"answer": int(numpy.int64(6) * 7)}
try:
    import socket
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 22))
    r["network"] = "connected"
except OSError:
    r["network"] = "denied"
try:
    with open("/sandcell-canary", "w") as f:
        f.write("x")
    r["write_outside"] = "written"
except OSError:
    r["write_outside"] = "denied"
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    r["executable_memory"] = "mapped"
except OSError:
    r["executable_memory"] = "denied"
try:
    open("/proc/self/mem", "r+b")
    r["own_memory"] = "writable"
except OSError:
    r["own_memory"] = "denied"
import errno
refused = (errno.EPERM, errno.EACCES)
try:
    os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNS)
    r["unshare"] = "unshared"
except OSError as e:
    r["unshare"] = "denied" if e.errno in refused else "failed otherwise: %s" % e
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    r["fork"] = "forked"
except OSError as e:
    r["fork"] = "denied" if e.errno in refused else "failed otherwise: %s" % e
try:
    if not os.path.isfile("/usr/bin/getconf"):
        raise FileNotFoundError("/usr/bin/getconf is not in the root: nothing to try")
    os.execv("/usr/bin/getconf", ["getconf", "PAGESIZE"])
except OSError as e:
    r["exec_other"] = "denied" if e.errno in refused else "failed otherwise: %s" % e
with open("/ws/canary", "w") as f:
    f.write("x")
os.remove("/ws/canary")
r["workspace"] = "written"
print(json.dumps(r, sort_keys=True))
`

// native verifies the bundle's native root, if it has one, against its pinned
// manifest, and runs the native canary under the policy's native hardening. A
// bundle without one, or one that fails, leaves the native backend not offered
// (NativeWhy); the wasm backend is unaffected, so it is a warning, not a failure.
func (r *Report) native(ctx context.Context, o Options) {
	if o.Slow != nil {
		o.Slow("native root")
	}
	root, err := bundle.OpenNativeStamped(o.BundleDir)
	if errors.Is(err, bundle.ErrNoNative) {
		r.NativeWhy = "not installed (make native)"
		r.add("native", OK, "not installed: the wasm backend alone is offered")
		return
	}
	if err != nil {
		r.NativeWhy = err.Error()
		r.add("native", Warn, "not offered: %v", err)
		return
	}
	limits, err := o.Policy.Resolve(protocol.Limits{TimeoutMS: 30_000})
	if err != nil {
		r.NativeWhy = err.Error()
		r.add("native", Warn, "not offered: %v", err)
		return
	}
	res, err := runIn(ctx, o, protocol.Request{Backend: protocol.BackendNative, RootDir: root.Dir, Code: NativeCanaryProgram,
		Limits: limits, Hardening: o.Policy.NativeHardening(limits)})
	var out map[string]any
	switch {
	case err != nil:
	case res.Reason != protocol.Exited || res.ExitCode != 0:
		err = fmt.Errorf("the native canary ended %s (exit %d): %s %s", res.Reason, res.ExitCode,
			strings.Join(res.Diagnostics, "; "), tail(res.Stderr))
	case json.Unmarshal(res.Stdout, &out) != nil || out["answer"] != float64(42):
		err = fmt.Errorf("the native canary printed %q", tail(res.Stdout))
	case res.Enforcement == nil || res.Enforcement.Backend != protocol.BackendNative:
		err = errors.New("the native canary reported no native contract")
	}
	if err == nil {
		if miss := res.Enforcement.Missing(o.Policy.NativeHardening(limits).Require); len(miss) > 0 {
			err = fmt.Errorf("required layers not active on the native backend: %v", miss)
		}
	}
	probes := []string{"network", "write_outside", "executable_memory", "own_memory", "unshare", "exec_other"}
	if !o.Policy.NativeProcesses {
		probes = append(probes, "fork")
	}
	for _, probe := range probes {
		if err == nil && out[probe] != "denied" {
			err = fmt.Errorf("native probe %s: %v (want denied)", probe, out[probe])
		}
	}
	if err != nil {
		r.NativeWhy = err.Error()
		r.add("native", Warn, "not offered: %v", err)
		return
	}
	r.NativeRoot, r.NativeEnforcement = root.Dir, res.Enforcement
	r.add("native", OK, "root verified (%d entries, %d MiB, manifest %s); canary with numpy in %.0f ms; probes denied: %s",
		root.Entries, root.Bytes>>20, root.ManifestSHA256[:16], res.ElapsedMS, strings.ReplaceAll(strings.Join(probes, ", "), "_", " "))
}

// poolRoots reports whether the warm pool's workers can hold each of its roots
// (sandbox.CheckRoots): one they cannot is a warning, naming the root and why (a
// mount beneath it), since runs beneath it start cold. A root that does not exist
// yet is fine: the daemon makes it, empty.
func (r *Report) poolRoots(roots []string) {
	if len(roots) == 0 {
		return
	}
	var present []string
	for _, root := range roots {
		if _, err := os.Lstat(root); !errors.Is(err, fs.ErrNotExist) {
			present = append(present, root)
		}
	}
	problems := sandbox.CheckRoots(present)
	if len(problems) == 0 {
		r.add("pool roots", OK, "warm workers can hold all %d: %s", len(roots), strings.Join(roots, ", "))
		return
	}
	var named []string
	for _, p := range problems {
		named = append(named, p.Root+" "+p.Why)
	}
	r.add("pool roots", Warn, "%s", strings.Join(named, "; "))
}

// CanaryProgram prints 6*7, then the outcome of each escape probe as JSON. Each
// probe must come out "denied".
const CanaryProgram = `import json, os
r = {"answer": 6 * 7}
try:
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.connect(("127.0.0.1", 22))
    r["network"] = "connected"
except Exception as e:
    r["network"] = "denied"
try:
    with open("/etc/passwd") as f:
        f.read(1)
    r["host_file"] = "read"
except OSError:
    r["host_file"] = "denied"
r["environment"] = "denied" if not os.environ else "visible: " + ",".join(sorted(os.environ))
try:
    with open("/sandcell-canary", "w") as f:
        f.write("x")
    r["write_outside"] = "written"
except OSError:
    r["write_outside"] = "denied"
with open("/ws/canary", "w") as f:
    f.write("x")
os.remove("/ws/canary")
r["workspace"] = "written"
print(json.dumps(r, sort_keys=True))
`

// canary runs program under the policy (as a real run, with every configured layer)
// and checks its contract and output.
func (r *Report) canary(ctx context.Context, o Options, program string) {
	res, err := runCanary(ctx, o, r.Interpreter(false), program)
	if err != nil {
		r.add("canary", Fail, "%v", err)
		return
	}
	r.Enforcement = res.Enforcement
	r.layers(o.Policy.Require, res)
	if res.Reason != protocol.Exited || res.ExitCode != 0 {
		r.add("canary", Fail, "ended %s (exit %d): %s %s", res.Reason, res.ExitCode,
			strings.Join(res.Diagnostics, "; "), tail(res.Stderr))
		return
	}
	var out map[string]any
	if err := json.Unmarshal(res.Stdout, &out); err != nil || out["answer"] != float64(42) {
		r.add("canary", Fail, "unexpected output %q", tail(res.Stdout))
		return
	}
	r.add("canary", OK, "printed 42 in %.0f ms", res.ElapsedMS)
	for _, probe := range []string{"network", "host_file", "environment", "write_outside", "workspace"} {
		want := "denied"
		if probe == "workspace" {
			want = "written"
		}
		if got := fmt.Sprint(out[probe]); got != want {
			r.add("probe "+probe, Fail, "%s (want %s)", got, want)
		} else {
			r.add("probe "+probe, OK, "%s", got)
		}
	}
}

// layers reports each enforcement layer: required and missing is a failure, optional
// and missing a warning.
func (r *Report) layers(require []string, res protocol.Result) {
	e := res.Enforcement
	if e == nil {
		r.add("layers", Fail, "the worker reported no enforcement contract")
		return
	}
	active := e.ActiveLayers()
	var missingReq, missingOpt []string
	for _, l := range protocol.Layers() {
		if slices.Contains(active, l) {
			continue
		}
		if slices.Contains(require, l) {
			missingReq = append(missingReq, l)
		} else {
			missingOpt = append(missingOpt, l)
		}
	}
	switch {
	case len(missingReq) > 0:
		r.add("layers", Fail, "required but not active: %s", strings.Join(missingReq, ", "))
	case len(missingOpt) > 0:
		r.add("layers", Warn, "active: %s; not active (not required): %s", strings.Join(active, ", "), strings.Join(missingOpt, ", "))
	default:
		r.add("layers", OK, "all %d active: %s", len(active), strings.Join(active, ", "))
	}
}

// Interpreter is the wasm backend's part of a run's or a session's request, from
// the verified modules: with fuel, the fuel-metered module; without, the plain
// module (a session's) and the epochless one (a run's); and the library.
func (r *Report) Interpreter(fuel bool) protocol.Request {
	if fuel {
		return protocol.Request{ModulePath: r.Modules[engine.Fuel], LibDir: r.LibDir}
	}
	return protocol.Request{ModulePath: r.Modules[engine.Plain], EpochlessModulePath: r.Modules[engine.Epochless], LibDir: r.LibDir}
}

// runCanary runs program as a run of interp's interpreter (see Interpreter).
func runCanary(ctx context.Context, o Options, interp protocol.Request, program string) (protocol.Result, error) {
	limits, err := o.Policy.Resolve(protocol.Limits{TimeoutMS: 30_000})
	if err != nil {
		return protocol.Result{}, err
	}
	req := interp
	req.Code, req.Isolated, req.Limits, req.Hardening = program, true, limits, o.Policy.Hardening(limits)
	return runIn(ctx, o, req)
}

// runIn runs req in a fresh workspace of o.WorkDir, removed after.
func runIn(ctx context.Context, o Options, req protocol.Request) (protocol.Result, error) {
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return protocol.Result{}, err
	}
	ws, err := os.MkdirTemp(o.WorkDir, "canary-")
	if err != nil {
		return protocol.Result{}, err
	}
	defer os.RemoveAll(ws)
	req.Workspace = ws
	return o.Spawner.Run(ctx, req)
}

// Light is the periodic canary: `print(6*7)` as a run of interp's interpreter (see
// Report.Interpreter) in a worker with every required layer. An error says what
// went wrong.
func Light(ctx context.Context, o Options, interp protocol.Request) error {
	res, err := runCanary(ctx, o, interp, "print(6*7)")
	switch {
	case err != nil:
		return err
	case res.Reason != protocol.Exited || string(res.Stdout) != "42\n":
		return fmt.Errorf("canary ended %s with %q: %s", res.Reason, tail(res.Stdout), strings.Join(res.Diagnostics, "; "))
	case res.Enforcement == nil:
		return errors.New("canary reported no enforcement contract")
	}
	if miss := res.Enforcement.Missing(o.Policy.Require); len(miss) > 0 {
		return fmt.Errorf("required layers not active: %v", miss)
	}
	return nil
}

func tail(b []byte) string {
	const n = 300
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
