// Package seccomp holds the worker's seccomp profile as data (an OCI runtime-spec
// specs.LinuxSeccomp, see Rules), compiles a profile to a BPF program with
// libseccomp (github.com/seccomp/libseccomp-golang, the library runc and podman use),
// and installs it on every thread of the process.
//
// Operators may replace the profile with a JSON file in the same OCI format
// (LoadFile). What this compiler accepts of that format, and how it reads it:
//
//   - defaultAction and each rule's action: SCMP_ACT_ALLOW, SCMP_ACT_ERRNO,
//     SCMP_ACT_KILL_PROCESS, SCMP_ACT_TRAP, SCMP_ACT_LOG. defaultAction may not be
//     SCMP_ACT_ALLOW or LOG (an allowlist is the point). SCMP_ACT_KILL and
//     SCMP_ACT_KILL_THREAD are refused: killing one thread of a Go program hangs it.
//   - the file: a regular file of at most 1 MiB; when a key appears twice the last
//     one wins (encoding/json).
//   - errnoRet and defaultErrnoRet: an errno from 1 to 4095; absent means EPERM.
//   - args: SCMP_CMP_EQ, NE, LT, LE, GT, GE, and SCMP_CMP_MASKED_EQ
//     ((arg & value) == valueTwo, valueTwo a subset of value). As in runc, the
//     conditions of one rule are ANDed when they name distinct arguments, and each
//     becomes its own rule (ORed) when an argument is named twice.
//   - names unknown to the running architecture are skipped, as libseccomp does.
//   - architectures is informational: the filter is built for the running
//     architecture only, and a call through any other ABI (x32 or i386 on x86_64)
//     fails with ENOSYS.
//   - flags, listenerPath and SCMP_ACT_TRACE are refused; so is SCMP_ACT_NOTIFY in a
//     file (LoadFile): a notifying rule is the worker's own (a native session's
//     checkpoint, see package unotify), whose answers only the daemon gives.
package seccomp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// maxProfileBytes bounds a profile file (1 MiB; Docker's default profile is 20 KB).
const maxProfileBytes = 1 << 20

// ErrProfile is wrapped by every error about a profile's content.
var ErrProfile = errors.New("seccomp: unsupported profile")

// Program is a profile compiled for the running architecture.
type Program struct {
	raw []byte // the BPF program: struct sock_filter entries as the kernel reads them
	// SHA256 is the hex SHA-256 of the BPF program as loaded into the kernel (struct
	// sock_filter array from seccomp_export_bpf(3)): the same profile with the same
	// libseccomp on the same architecture gives the same hash.
	SHA256 string
	// Instructions is the program's length in BPF instructions.
	Instructions int
	// Arch is the architecture the program was built for (for example "amd64").
	Arch string
	// Notifies says a rule's action is SCMP_ACT_NOTIFY: the program is installed
	// with InstallListener, and the listener's holder answers those calls
	// (unotify.Supervise).
	Notifies bool
}

// Compile turns profile into a BPF program for the running architecture. Errors wrap
// ErrProfile and name the rule that cannot be compiled.
func Compile(profile specs.LinuxSeccomp) (*Program, error) {
	def, err := defaultAction(profile)
	if err != nil {
		return nil, err
	}
	if len(profile.Flags) > 0 || profile.ListenerPath != "" || profile.ListenerMetadata != "" {
		return nil, fmt.Errorf("%w: flags and listeners are not supported", ErrProfile)
	}
	native, err := libseccomp.GetNativeArch()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	f, err := libseccomp.NewFilter(def)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	defer f.Release() // only its exported program is kept
	// Any other ABI of this CPU (x32, i386) is not ours: ENOSYS, as if absent.
	if err := f.SetBadArchAction(libseccomp.ActErrno.SetReturnCode(int16(unix.ENOSYS))); err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	rules, notifies := 0, false
	for i, rule := range profile.Syscalls {
		act, err := action(rule.Action, rule.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("syscalls[%d]: %w", i, err)
		}
		if act == def {
			continue // libseccomp refuses rules that repeat the default action
		}
		notifies = notifies || act == libseccomp.ActNotify
		alts, err := conditions(rule.Args)
		if err != nil {
			return nil, fmt.Errorf("syscalls[%d]: %w", i, err)
		}
		for _, name := range rule.Names {
			call, err := libseccomp.GetSyscallFromNameByArch(name, native)
			if err != nil {
				continue // not a call on this architecture (libseccomp's own tools skip these too)
			}
			if alts == nil {
				err = f.AddRule(call, act)
			}
			for _, c := range alts {
				if err = f.AddRuleConditional(call, act, c); err != nil {
					break
				}
			}
			if err != nil {
				return nil, fmt.Errorf("%w: syscalls[%d] %s: %v", ErrProfile, i, name, err)
			}
			rules++
		}
	}
	if rules == 0 {
		return nil, fmt.Errorf("%w: no rule names a call of this architecture (%s)", ErrProfile, native)
	}
	raw, err := export(f)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	return &Program{raw: raw, SHA256: hex.EncodeToString(sum[:]), Instructions: len(raw) / 8, Arch: native.String(),
		Notifies: notifies}, nil
}

// export returns the BPF program libseccomp generates for f (seccomp_export_bpf(3)).
func export(f *libseccomp.ScmpFilter) ([]byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	defer r.Close()
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	err = f.ExportBPF(w)
	w.Close()
	raw := <-done
	if err != nil {
		return nil, fmt.Errorf("seccomp: export: %w", err)
	}
	return raw, nil
}

// Install loads p, exactly the program SHA256 names, with SECCOMP_FILTER_FLAG_TSYNC,
// so that every thread of the process runs under it from now on and gets the calling
// thread's no_new_privs, which must be set (seccomp(2)). If a thread cannot be
// synchronised the call fails and no thread gets the filter. A program that
// notifies is installed with InstallListener instead.
func (p *Program) Install() error {
	if p.Notifies {
		return errors.New("seccomp: the program notifies: install it with InstallListener")
	}
	_, err := p.load(unix.SECCOMP_FILTER_FLAG_TSYNC)
	return err
}

// InstallListener is Install for a program that notifies (Notifies): it returns the
// filter's listener (SECCOMP_FILTER_FLAG_NEW_LISTENER), through which its notifying
// calls are answered (unotify.Supervise). Until the listener is handed to a supervisor, a
// notifying call waits; once every copy of it is closed, such calls fail with
// ENOSYS.
func (p *Program) InstallListener() (*os.File, error) {
	if !p.Notifies {
		return nil, errors.New("seccomp: the program notifies of no call")
	}
	// TSYNC with a listener needs TSYNC_ESRCH (Linux 5.7): the return value is then
	// the listener, and a thread that cannot be synchronised is ESRCH. With
	// WAIT_KILLABLE_RECV (Linux 5.19) a call the supervisor has received waits for
	// its answer through signals other than a fatal one, so that an answer is not
	// lost to a signal (the call would ask again, and a one-time approval be spent).
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH | unix.SECCOMP_FILTER_FLAG_NEW_LISTENER)
	fd, err := p.load(flags | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV)
	if errors.Is(err, unix.EINVAL) {
		fd, err = p.load(flags)
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(fd, "seccomp-listener"), nil
}

func (p *Program) load(flags uintptr) (uintptr, error) {
	if len(p.raw) == 0 || len(p.raw)%8 != 0 || len(p.raw)/8 > 0xffff {
		return 0, errors.New("seccomp: no program")
	}
	prog := unix.SockFprog{Len: uint16(len(p.raw) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&p.raw[0]))}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(p)
	switch {
	case e != 0:
		return 0, fmt.Errorf("seccomp: load: %w", e)
	case r != 0 && flags&unix.SECCOMP_FILTER_FLAG_NEW_LISTENER == 0:
		return 0, fmt.Errorf("seccomp: load: thread %d cannot be synchronised", r)
	}
	return r, nil
}

// Mode returns the calling thread's seccomp mode from prctl(PR_GET_SECCOMP): 0 means
// disabled and 2 filter mode (in strict mode the call itself would be fatal).
func Mode() (int, error) {
	return unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0)
}

// LoadFile reads an OCI seccomp profile (the "seccomp" object of a runtime-spec
// config, as JSON) from path. Unknown fields are refused, and the profile must
// compile (see the package comment for what is accepted).
func LoadFile(path string) (specs.LinuxSeccomp, error) {
	var p specs.LinuxSeccomp
	// O_NONBLOCK: opening a FIFO must not wait for a writer (it is then refused).
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return p, fmt.Errorf("seccomp profile: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return p, fmt.Errorf("seccomp profile %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxProfileBytes+1))
	if err != nil {
		return p, fmt.Errorf("seccomp profile: %w", err)
	}
	if len(b) > maxProfileBytes {
		return p, fmt.Errorf("seccomp profile %s: larger than %d bytes", path, maxProfileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("seccomp profile %s: %w", path, err)
	}
	if _, err := Compile(p); err != nil {
		return p, fmt.Errorf("seccomp profile %s: %w", path, err)
	}
	for i, rule := range p.Syscalls {
		if rule.Action == specs.ActNotify {
			return p, fmt.Errorf("seccomp profile %s: %w: syscalls[%d]: SCMP_ACT_NOTIFY is the worker's own: a profile's calls are allowed or refused",
				path, ErrProfile, i)
		}
	}
	return p, nil
}

func defaultAction(p specs.LinuxSeccomp) (libseccomp.ScmpAction, error) {
	switch p.DefaultAction {
	case specs.ActAllow, specs.ActLog:
		return 0, fmt.Errorf("%w: defaultAction %s would allow every unlisted call", ErrProfile, p.DefaultAction)
	case specs.ActNotify:
		return 0, fmt.Errorf("%w: defaultAction %s would ask for every unlisted call", ErrProfile, p.DefaultAction)
	}
	a, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return 0, fmt.Errorf("defaultAction: %w", err)
	}
	return a, nil
}

func action(a specs.LinuxSeccompAction, errno *uint) (libseccomp.ScmpAction, error) {
	switch a {
	case specs.ActAllow:
		return libseccomp.ActAllow, nil
	case specs.ActErrno:
		e := uint(unix.EPERM)
		if errno != nil {
			e = *errno
		}
		if e == 0 || e > 4095 {
			// SECCOMP_RET_ERRNO with 0 would make the call "succeed" without running.
			return 0, fmt.Errorf("%w: errnoRet %d is not an errno", ErrProfile, e)
		}
		return libseccomp.ActErrno.SetReturnCode(int16(e)), nil
	case specs.ActKill, specs.ActKillThread:
		// Killing one thread of a Go program leaves the rest waiting for it forever.
		return 0, fmt.Errorf("%w: %s kills one thread and hangs the worker; use SCMP_ACT_KILL_PROCESS", ErrProfile, a)
	case specs.ActKillProcess:
		return libseccomp.ActKillProcess, nil
	case specs.ActTrap:
		return libseccomp.ActTrap, nil
	case specs.ActLog:
		return libseccomp.ActLog, nil
	case specs.ActNotify:
		return libseccomp.ActNotify, nil
	}
	return 0, fmt.Errorf("%w: action %q", ErrProfile, a)
}

var operators = map[specs.LinuxSeccompOperator]libseccomp.ScmpCompareOp{
	specs.OpEqualTo:      libseccomp.CompareEqual,
	specs.OpNotEqual:     libseccomp.CompareNotEqual,
	specs.OpLessThan:     libseccomp.CompareLess,
	specs.OpLessEqual:    libseccomp.CompareLessOrEqual,
	specs.OpGreaterThan:  libseccomp.CompareGreater,
	specs.OpGreaterEqual: libseccomp.CompareGreaterEqual,
	specs.OpMaskedEqual:  libseccomp.CompareMaskedEqual,
}

// conditions turns a rule's args into alternatives (ORed), each a conjunction, as
// runc does: one conjunction when every argument index is distinct, otherwise one
// rule per condition. nil means the rule is unconditional.
func conditions(args []specs.LinuxSeccompArg) ([][]libseccomp.ScmpCondition, error) {
	if len(args) == 0 {
		return nil, nil
	}
	var conds []libseccomp.ScmpCondition
	seen := map[uint]bool{}
	repeated := false
	for _, a := range args {
		op, ok := operators[a.Op]
		if !ok {
			return nil, fmt.Errorf("%w: operator %q", ErrProfile, a.Op)
		}
		if a.Index > 5 {
			return nil, fmt.Errorf("%w: argument index %d (0-5)", ErrProfile, a.Index)
		}
		if op == libseccomp.CompareMaskedEqual && a.ValueTwo&^a.Value != 0 {
			return nil, fmt.Errorf("%w: SCMP_CMP_MASKED_EQ valueTwo %#x has bits outside value %#x (never true)", ErrProfile, a.ValueTwo, a.Value)
		}
		values := []uint64{a.Value}
		if op == libseccomp.CompareMaskedEqual {
			values = append(values, a.ValueTwo)
		}
		c, err := libseccomp.MakeCondition(a.Index, op, values...)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrProfile, err)
		}
		repeated = repeated || seen[a.Index]
		seen[a.Index] = true
		conds = append(conds, c)
	}
	if !repeated {
		return [][]libseccomp.ScmpCondition{conds}, nil
	}
	out := make([][]libseccomp.ScmpCondition, len(conds))
	for i, c := range conds {
		out[i] = []libseccomp.ScmpCondition{c}
	}
	return out, nil
}
