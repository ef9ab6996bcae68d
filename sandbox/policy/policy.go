// Package policy holds the limits a run gets by default and the maxima no request may
// exceed, and the hardening every worker gets. It is a leaf of the sandbox: the
// supervisor's configuration and the CLI both build a Policy and call Resolve and
// Hardening for every request.
package policy

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/go-multierror"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/seccomp"
)

// MiB is 2^20 bytes.
const MiB = 1 << 20

// wasm32MaxMemory is the most linear memory a wasm32 module can address (4 GiB).
const wasm32MaxMemory = 4096 * MiB

// MinMemoryBytes is the least guest memory a run may have (32 MiB): the interpreter's
// initial linear memory plus room for its heap. Below it CPython cannot start.
const MinMemoryBytes = 32 * MiB

// ErrLimit is wrapped by Resolve for a request that asks for more than the maxima or
// for a nonsensical value.
var ErrLimit = errors.New("policy: limit out of range")

// ErrEnv is returned by FilterEnv for a variable policy does not allow.
var ErrEnv = errors.New("policy: environment variable not allowed")

// Policy is the default limits of a run and the maxima a request may ask for.
type Policy struct {
	// Default fills every limit a request leaves at zero.
	Default protocol.Limits
	// Max caps every limit a request sets; a zero field in Max means no cap.
	Max protocol.Limits
	// EnvAllow lists the environment variable names a request may pass to the guest.
	// Empty means the guest gets an empty environment.
	EnvAllow []string
	// Require names the enforcement layers (protocol.Layers()) without which no code
	// runs: a run whose worker cannot verify one of them ends rejected.
	Require []string
	// Seccomp is the worker's seccomp profile; nil means seccomp.Rules().
	Seccomp *specs.LinuxSeccomp
	// MaxFileBytes is the largest file a run may write (RLIMIT_FSIZE), in bytes.
	MaxFileBytes int64
	// MaxOpenFiles is the most descriptors a worker may hold (RLIMIT_NOFILE).
	MaxOpenFiles int64
	// MaxThreads is the most threads a worker may run (RLIMIT_NPROC, set inside the
	// worker's own user namespace only).
	MaxThreads int64
	// Disable lists layers not to apply at all: "seccomp", "landlock", "namespaces"
	// (for hosts where one breaks; a disabled layer that Require names makes every
	// run, and the start-up self-test, fail).
	Disable []string
	// NativeProcesses lets native-backend guests start processes (see
	// protocol.Hardening.Processes); off by default.
	NativeProcesses bool
	// NativeTmpBytes is the size of a native guest's private /tmp, in bytes; zero
	// means DefaultNativeTmpBytes.
	NativeTmpBytes int64
	// NativeRequire names the layers without which no native code runs; empty
	// means Require.
	NativeRequire []string
}

// Disableable are the names Policy.Disable accepts.
func Disableable() []string {
	return []string{"seccomp", "landlock", "namespaces"}
}

// Hardening returns the hardening request for a run with limits l (already
// resolved): every layer asked for, the rlimits, and the layers policy requires.
func (p Policy) Hardening(l protocol.Limits) protocol.Hardening {
	prof := p.Seccomp
	if prof == nil {
		r := seccomp.Rules()
		prof = &r
	}
	// The CPU backstop is a whole second above the larger of the CPU and wall-clock
	// limits, so the engine's limit and the parent's clock always act first.
	ms := l.TimeoutMS
	if l.CPUMS > ms {
		ms = l.CPUMS
	}
	if contains(p.Disable, "seccomp") {
		prof = nil
	}
	return protocol.Hardening{
		Seccomp:    prof,
		Landlock:   !contains(p.Disable, "landlock"),
		Namespaces: !contains(p.Disable, "namespaces"),
		Rlimits: protocol.Rlimits{
			NOFILE: uint64(p.MaxOpenFiles),
			NPROC:  uint64(p.MaxThreads),
			FSIZE:  uint64(p.MaxFileBytes),
			CPU:    uint64((ms+999)/1000) + 1,
		},
		Require: p.Require,
	}
}

// NativeHardening returns the hardening of a run with limits l (resolved) on the
// native backend: Hardening's, with the native seccomp profile (see
// seccomp.NativeRules; an operator's profile is the wasm worker's and does not
// apply), the memory limit as RLIMIT_DATA, a CPU limit kept by RLIMIT_CPU to the
// second (the wasm engine's epoch deadline has no native twin), namespaces always
// (the worker's mount namespace holds the native root), and processes as
// NativeProcesses says.
func (p Policy) NativeHardening(l protocol.Limits) protocol.Hardening {
	h := p.Hardening(l)
	if h.Seccomp != nil {
		r := seccomp.NativeRules(p.NativeProcesses)
		h.Seccomp = &r
	}
	h.Namespaces = true
	h.Processes = p.NativeProcesses
	if len(p.NativeRequire) > 0 {
		h.Require = p.NativeRequire
	}
	h.Rlimits.DATA = uint64(l.MemoryBytes)
	if l.CPUMS > 0 {
		h.Rlimits.CPU = uint64((l.CPUMS + 999) / 1000)
	}
	h.TmpBytes = p.NativeTmpBytes
	if h.TmpBytes <= 0 {
		h.TmpBytes = DefaultNativeTmpBytes
	}
	return h
}

// DefaultNativeTmpBytes is the size of a native guest's private /tmp unless policy
// says otherwise (64 MiB).
const DefaultNativeTmpBytes = 64 * MiB

// Default returns the built-in policy: 30 s wall clock (at most 10 min), 256 MiB of
// guest memory (at most 4 GiB), 1 MiB each of stdout and stderr (at most 64 MiB), no
// CPU-time or fuel limit unless asked for, an empty environment, files of at most
// 1 GiB, 256 descriptors, 256 threads, and every enforcement layer required.
func Default() Policy {
	return Policy{
		Require:        append([]string(nil), protocol.Layers()...),
		NativeTmpBytes: DefaultNativeTmpBytes,
		MaxFileBytes:   1024 * MiB,
		MaxOpenFiles:   256,
		MaxThreads:     256,
		Default: protocol.Limits{
			TimeoutMS:      30_000,
			MemoryBytes:    256 * MiB,
			MaxStdoutBytes: 1 * MiB,
			MaxStderrBytes: 1 * MiB,
		},
		Max: protocol.Limits{
			TimeoutMS:      600_000,
			CPUMS:          600_000,
			MemoryBytes:    wasm32MaxMemory,
			MaxStdoutBytes: 64 * MiB,
			MaxStderrBytes: 64 * MiB,
		},
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports every inconsistency in p, one error per problem.
func (p Policy) Validate() error {
	var errs *multierror.Error
	if err := checkLimits("default", p.Default, true); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := checkLimits("max", p.Max, false); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := exceeds("default", p.Default, p.Max); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := protocol.CheckLayers(p.Require); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("require: %w", err))
	}
	if err := protocol.CheckLayers(p.NativeRequire); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("native require: %w", err))
	}
	if contains(p.Require, protocol.LayerGVisor) {
		errs = multierror.Append(errs, fmt.Errorf("require: %q is a layer of the native backend alone: name it in native.require", protocol.LayerGVisor))
	}
	if contains(p.NativeRequire, protocol.LayerGVisor) && contains(p.NativeRequire, protocol.LayerLandlock) {
		// A guest under gVisor calls gVisor's kernel, which has no Landlock; what
		// Landlock keeps from the guest (every file but its mounts) the gofer does.
		errs = multierror.Append(errs, fmt.Errorf("native require: %q and %q exclude each other: gVisor's kernel has no Landlock (its gofer serves the guest only the run's mounts); leave %q out",
			protocol.LayerGVisor, protocol.LayerLandlock, protocol.LayerLandlock))
	}
	if p.NativeTmpBytes < 0 || p.NativeTmpBytes > 64<<30 {
		errs = multierror.Append(errs, fmt.Errorf("native tmp: %d bytes is out of range (0 to 64 GiB)", p.NativeTmpBytes))
	}
	for _, d := range p.Disable {
		if !contains(Disableable(), d) {
			errs = multierror.Append(errs, fmt.Errorf("disable: %q is not one of %v", d, Disableable()))
		}
	}
	if p.Seccomp != nil {
		if _, err := seccomp.Compile(*p.Seccomp); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("seccomp: %w", err))
		}
	}
	for name, v := range map[string]int64{"max_file_bytes": p.MaxFileBytes, "max_open_files": p.MaxOpenFiles, "max_threads": p.MaxThreads} {
		if v <= 0 {
			errs = multierror.Append(errs, fmt.Errorf("%s: must be positive, is %d", name, v))
		}
	}
	if p.MaxOpenFiles > 0 && p.MaxOpenFiles < 32 {
		errs = multierror.Append(errs, fmt.Errorf("max_open_files: %d is too few for the engine (at least 32)", p.MaxOpenFiles))
	}
	if p.MaxThreads > 0 && p.MaxThreads < 32 {
		errs = multierror.Append(errs, fmt.Errorf("max_threads: %d is too few for the engine (at least 32)", p.MaxThreads))
	}
	for _, n := range p.EnvAllow {
		if !envName.MatchString(n) {
			errs = multierror.Append(errs, fmt.Errorf("env_allow: %q is not a variable name", n))
		}
	}
	return joined(errs)
}

// Resolve fills the zero fields of req from the defaults and checks the result
// against the maxima. Errors wrap ErrLimit and name every offending limit.
func (p Policy) Resolve(req protocol.Limits) (protocol.Limits, error) {
	out := req
	d := p.Default
	fill(&out.TimeoutMS, d.TimeoutMS)
	fill(&out.CPUMS, d.CPUMS)
	fill(&out.MemoryBytes, d.MemoryBytes)
	fill(&out.MaxStdoutBytes, d.MaxStdoutBytes)
	fill(&out.MaxStderrBytes, d.MaxStderrBytes)
	if out.Fuel == 0 {
		out.Fuel = d.Fuel
	}
	var errs *multierror.Error
	if err := checkLimits("request", out, true); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := exceeds("request", out, p.Max); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := joined(errs); err != nil {
		return protocol.Limits{}, err
	}
	return out, nil
}

// joined returns errs as one error whose message lists every problem on one line.
func joined(errs *multierror.Error) error {
	if errs == nil || len(errs.Errors) == 0 {
		return nil
	}
	errs.ErrorFormat = func(list []error) string {
		msgs := make([]string, len(list))
		for i, e := range list {
			msgs[i] = e.Error()
		}
		return strings.Join(msgs, "; ")
	}
	return errs
}

// FilterEnv returns env if every name in it is allowed, else an error naming the
// first name that is not.
func (p Policy) FilterEnv(env map[string]string) (map[string]string, error) {
	for k := range env {
		if !contains(p.EnvAllow, k) {
			return nil, fmt.Errorf("%w: %q is not in env_allow", ErrEnv, k)
		}
	}
	return env, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func fill(v *int64, d int64) {
	if *v == 0 {
		*v = d
	}
}

// checkLimits rejects negative values and, where complete is set, missing ones.
func checkLimits(what string, l protocol.Limits, complete bool) error {
	var errs *multierror.Error
	bad := func(field string, v int64, kind LimitProblem, bound int64) {
		errs = multierror.Append(errs, &LimitError{Set: what, Field: field, Value: v, Problem: kind, Bound: bound})
	}
	for _, f := range fields(l) {
		if f.v < 0 {
			bad(f.name, f.v, Negative, 0)
		}
		if complete && f.required && f.v == 0 {
			bad(f.name, f.v, Unset, 0)
		}
	}
	if l.MemoryBytes > 0 && l.MemoryBytes < MinMemoryBytes {
		bad("memory_bytes", l.MemoryBytes, BelowMinimum, MinMemoryBytes)
	}
	if l.MemoryBytes > wasm32MaxMemory {
		bad("memory_bytes", l.MemoryBytes, BeyondAddressable, wasm32MaxMemory)
	}
	return joined(errs)
}

// exceeds reports every field of l above a non-zero field of max.
func exceeds(what string, l, max protocol.Limits) error {
	var errs *multierror.Error
	lf, mf := fields(l), fields(max)
	for i := range lf {
		if lf[i].name == "memory_bytes" && lf[i].v > wasm32MaxMemory {
			continue // said by checkLimits: beyond what a wasm32 guest can address
		}
		if mf[i].v > 0 && lf[i].v > mf[i].v {
			errs = multierror.Append(errs, &LimitError{Set: what, Field: lf[i].name, Value: lf[i].v, Problem: AboveMaximum, Bound: mf[i].v})
		}
	}
	if max.Fuel > 0 && l.Fuel > max.Fuel {
		errs = multierror.Append(errs, &LimitError{Set: what, Field: "fuel", Value: int64(min(l.Fuel, 1<<63-1)), Problem: AboveMaximum,
			Bound: int64(min(max.Fuel, 1<<63-1))})
	}
	return joined(errs)
}

// LimitProblem is what is wrong with a limit.
type LimitProblem int

// The problems a limit can have.
const (
	Negative          LimitProblem = iota // below 0
	Unset                                 // 0 where a value is required
	BelowMinimum                          // below Bound (the interpreter's least memory)
	AboveMaximum                          // above Bound, policy's maximum
	BeyondAddressable                     // above Bound, the memory a wasm32 guest can address
)

// LimitError is one limit that Resolve or Validate refused. It wraps ErrLimit. Field
// is the limit's name in protocol.Limits' JSON (timeout_ms, cpu_ms, memory_bytes,
// max_stdout_bytes, max_stderr_bytes, fuel) and Set the limits it is one of
// ("request", "default" or "max"); Value and Bound are in its units (milliseconds,
// bytes, fuel). Its Error says it in those names; a front end whose callers know
// other names (the API's limits.memory_mib, the CLI's --memory) says it with Describe.
type LimitError struct {
	Set, Field   string
	Value, Bound int64
	Problem      LimitProblem
}

func (e *LimitError) Error() string {
	return e.describe(e.Set+"."+e.Field, strconv.FormatInt(e.Value, 10), strconv.FormatInt(e.Bound, 10))
}

func (e *LimitError) describe(key, value, bound string) string {
	switch e.Problem {
	case Negative:
		return fmt.Sprintf("%s is negative (%s)", key, value)
	case Unset:
		return key + " must be set"
	case BelowMinimum:
		return fmt.Sprintf("%s %s is below the %s the interpreter needs", key, value, bound)
	case BeyondAddressable:
		return fmt.Sprintf("%s %s exceeds the %s a wasm32 guest can address (4 GiB)", key, value, bound)
	default:
		return fmt.Sprintf("%s %s is above the maximum %s", key, value, bound)
	}
}

func (e *LimitError) Unwrap() error { return ErrLimit }

// Describe says err (from Resolve or Validate) in a front end's own names, one
// sentence per problem: name gives the key a caller knows a LimitError's limit by and
// a value of it (the Value or the Bound) in that key's units. Sentences that come out
// the same are said once (the API's max_output_bytes is both max_stdout_bytes and
// max_stderr_bytes). Errors that are not LimitErrors are said as they are.
func Describe(err error, name func(e *LimitError, v int64) (key, value string)) []string {
	var list []error
	if m, ok := err.(*multierror.Error); ok {
		list = m.Errors
	} else {
		list = []error{err}
	}
	var out []string
	seen := map[string]bool{}
	for _, e := range list {
		msg := e.Error()
		var le *LimitError
		if errors.As(e, &le) {
			key, value := name(le, le.Value)
			_, bound := name(le, le.Bound)
			msg = le.describe(key, value, bound)
		}
		if !seen[msg] {
			seen[msg] = true
			out = append(out, msg)
		}
	}
	return out
}

type field struct {
	name     string
	v        int64
	required bool
}

func fields(l protocol.Limits) []field {
	return []field{
		{"timeout_ms", l.TimeoutMS, true},
		{"cpu_ms", l.CPUMS, false},
		{"memory_bytes", l.MemoryBytes, true},
		{"max_stdout_bytes", l.MaxStdoutBytes, true},
		{"max_stderr_bytes", l.MaxStderrBytes, true},
	}
}
