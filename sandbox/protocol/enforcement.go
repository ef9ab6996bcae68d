package protocol

import (
	"fmt"
	"slices"
	"sort"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The enforcement layers, by the names policy's `require` list and the contract use.
const (
	LayerSeccomp      = "seccomp"      // seccomp filter installed on every thread
	LayerLandlock     = "landlock"     // Landlock domain: bundle read-only, workspace read-write, no TCP
	LayerUserNS       = "userns"       // own user namespace (uid 0 inside, the parent's uid outside)
	LayerNetNS        = "netns"        // not the host's network namespace, and empty: only a loopback, down (see Hardening.SharedNetwork)
	LayerMountNS      = "mntns"        // own mount namespace whose root holds only /ws and /lib
	LayerPidNS        = "pidns"        // own pid namespace: the worker is pid 1 and sees no other process
	LayerIPCNS        = "ipcns"        // own System V IPC and POSIX message queue namespace
	LayerUTSNS        = "utsns"        // own host name
	LayerRlimits      = "rlimits"      // CORE 0 and NOFILE, FSIZE, CPU limits in force
	LayerNoNewPrivs   = "no_new_privs" // prctl(PR_SET_NO_NEW_PRIVS) on every thread
	LayerCapabilities = "capabilities" // no capability in any set, bounding set empty where it could be
	// LayerGVisor (native backend only): the guest runs on gVisor's user-space
	// kernel (runsc), which serves its system calls and files in place of the
	// host's; see Enforcement.GVisor.
	LayerGVisor = "gvisor"
)

// knownLayers is every name a require list may hold: Layers and LayerGVisor.
func knownLayers() []string { return append([]string{LayerGVisor}, Layers()...) }

// Layers lists every layer a worker applies, in its order: the host kernel's. The
// gvisor layer, a native run's alone, is not among them (see LayerGVisor); policy
// names it where it wants it.
func Layers() []string {
	return []string{LayerRlimits, LayerUserNS, LayerNetNS, LayerMountNS, LayerPidNS, LayerIPCNS,
		LayerUTSNS, LayerCapabilities, LayerLandlock, LayerNoNewPrivs, LayerSeccomp}
}

// Namespaces maps each namespace layer to its name under /proc/PID/ns (namespaces(7)).
func Namespaces() map[string]string {
	return map[string]string{LayerUserNS: "user", LayerNetNS: "net", LayerMountNS: "mnt",
		LayerPidNS: "pid", LayerIPCNS: "ipc", LayerUTSNS: "uts"}
}

// Hardening is what the parent asks of a worker before the guest runs. The parent
// fills it from policy; the worker applies each layer it is given, verifies it, and
// refuses to run the guest when a layer named in Require is not active.
type Hardening struct {
	// Seccomp is the seccomp profile to install; nil installs none.
	Seccomp *specs.LinuxSeccomp `json:"seccomp,omitempty"`
	// Landlock asks for a Landlock domain at the best ABI the kernel has.
	Landlock bool `json:"landlock"`
	// Namespaces asks the parent to start the worker in new user, network, mount,
	// pid, IPC and UTS namespaces (the parent does this; the worker verifies it).
	Namespaces bool `json:"namespaces"`
	// HostNamespaces are the parent's own namespaces (namespace name -> the target of
	// /proc/self/ns/NAME, e.g. "net:[4026531840]"). A worker namespace that differs
	// from the parent's is new.
	HostNamespaces map[string]string `json:"host_namespaces,omitempty"`
	// SharedNetwork says the parent started the worker in the empty network
	// namespace its workers share rather than a new one: it keeps them apart only
	// while their seccomp filter denies socket(2), so the worker reports the netns
	// layer inactive if its filter is not in force.
	SharedNetwork bool `json:"shared_network,omitempty"`
	// Rlimits are the resource limits the worker sets on itself (setrlimit(2)).
	Rlimits Rlimits `json:"rlimits"`
	// Require names the layers (see Layers) that must be active, or the guest does
	// not run and the run ends rejected.
	Require []string `json:"require,omitempty"`
	// Processes (native backend) lets the guest start processes (fork, vfork,
	// clone without CLONE_THREAD), which stay in its namespaces, under its limits,
	// and die with it; off, the seccomp profile refuses them and threads alone work.
	Processes bool `json:"processes,omitempty"`
	// TmpBytes (native backend) is the size of the guest's private /tmp (a tmpfs of
	// the worker's own mount namespace), in bytes.
	TmpBytes int64 `json:"tmp_bytes,omitempty"`
}

// Rlimits are resource limits in setrlimit(2) units; 0 leaves a limit as inherited.
// RLIMIT_CORE is always 0 and RLIMIT_AS is never set (it breaks wasmtime's
// reservations of virtual memory).
type Rlimits struct {
	// NOFILE is the most file descriptors the worker may hold.
	NOFILE uint64 `json:"nofile"`
	// NPROC is the most threads the worker's user may run. It is set only inside the
	// worker's own user namespace, where it counts the worker alone; outside one it
	// would count every process of the daemon's user.
	NPROC uint64 `json:"nproc"`
	// FSIZE is the largest file the worker may write, in bytes; writing past it
	// fails with EFBIG.
	FSIZE uint64 `json:"fsize"`
	// CPU is a backstop on the worker's CPU time, in seconds (SIGKILL one second
	// after the soft limit); the engine's CPU limit and the wall clock act first.
	CPU uint64 `json:"cpu"`
	// DATA (native backend) is the most private writable memory the guest's process
	// may map, in bytes (RLIMIT_DATA: the heap, anonymous mappings, thread stacks;
	// not the read-only mappings of Debian's libraries). The wasm backend's memory
	// limit is the engine's instead.
	DATA uint64 `json:"data,omitempty"`
}

// Enforcement is the contract: what a worker verified to be in force, layer by layer,
// before its guest ran.
type Enforcement struct {
	// Backend is the backend the guest ran on (BackendWasm or BackendNative); empty
	// in a contract of a worker from before there were two, which is wasm.
	Backend  string        `json:"backend,omitempty"`
	Seccomp  SeccompState  `json:"seccomp"`
	Landlock LandlockState `json:"landlock"`
	// Namespaces maps each namespace layer (userns, netns, ...) to whether the worker
	// runs in its own.
	Namespaces map[string]bool `json:"namespaces"`
	// MountRoot lists what the worker's root directory holds when mntns is active.
	MountRoot []string `json:"mount_root,omitempty"`
	// Rlimits are the soft limits read back with getrlimit(2), by resource name
	// ("CORE", "NOFILE", ...); absent means unlimited or not set.
	Rlimits map[string]uint64 `json:"rlimits"`
	// NoNewPrivs is prctl(PR_GET_NO_NEW_PRIVS).
	NoNewPrivs bool `json:"no_new_privs"`
	// Capabilities is the worker's capability state in libcap's text form; "=" means
	// none in any set.
	Capabilities string `json:"capabilities"`
	// Engine is the wasm engine's variant that ran the guest: "plain" (epoch
	// interruption stops a call at its CPU limit), "fuel" (and fuel metering) or
	// "epochless" (the CPU limit ends the worker); empty on the native backend.
	Engine string `json:"engine,omitempty"`
	// GVisor is the gVisor layer of a native run under runsc, or nil.
	GVisor *GVisorState `json:"gvisor,omitempty"`
	// Errors says, per layer, why a layer asked for is not active.
	Errors map[string]string `json:"errors,omitempty"`
}

// GVisorState describes the gVisor layer: which runsc ran the guest, how, and the
// container it was given.
type GVisorState struct {
	Active bool `json:"active"`
	// Version is the first line of `runsc --version`.
	Version string `json:"version"`
	// Platform is how the sentry runs the guest's code ("ptrace").
	Platform string `json:"platform"`
	// Spec is the SHA-256 (hex) of the OCI runtime spec (config.json) runsc ran.
	Spec string `json:"spec"`
}

// SeccompState describes the seccomp layer.
type SeccompState struct {
	Active bool `json:"active"`
	// Mode is "filter" when active (prctl(PR_GET_SECCOMP) == 2), else "disabled".
	Mode string `json:"mode"`
	// SHA256 is the hash of the BPF program loaded (see sandbox/seccomp).
	SHA256 string `json:"sha256,omitempty"`
	// Instructions is the program's length; Arch the architecture it filters for.
	Instructions int    `json:"instructions,omitempty"`
	Arch         string `json:"arch,omitempty"`
	// DefaultAction is the profile's action for calls it does not list.
	DefaultAction string `json:"default_action,omitempty"`
}

// LandlockState describes the Landlock layer.
type LandlockState struct {
	Active bool `json:"active"`
	// ABI is the Landlock ABI version the domain was built for (the kernel's best, or
	// the newest the library knows); 0 when Landlock is unavailable.
	ABI int `json:"abi"`
	// FS, Net and Scoped are the handled access rights, as go-landlock names them.
	FS     string `json:"fs,omitempty"`
	Net    string `json:"net,omitempty"`
	Scoped string `json:"scoped,omitempty"`
}

// Active reports whether the named layer is in force. Unknown names are not.
func (e Enforcement) Active(layer string) bool {
	switch layer {
	case LayerSeccomp:
		return e.Seccomp.Active
	case LayerLandlock:
		return e.Landlock.Active
	case LayerRlimits:
		core, ok := e.Rlimits["CORE"]
		return ok && core == 0 && e.Rlimits["NOFILE"] > 0 && e.Rlimits["FSIZE"] > 0 && e.Rlimits["CPU"] > 0
	case LayerNoNewPrivs:
		return e.NoNewPrivs
	case LayerCapabilities:
		return e.Capabilities == "="
	case LayerGVisor:
		return e.GVisor != nil && e.GVisor.Active
	}
	if _, ok := Namespaces()[layer]; ok {
		return e.Namespaces[layer]
	}
	return false
}

// Missing returns the layers of require that are not active, in require's order.
func (e Enforcement) Missing(require []string) []string {
	var out []string
	for _, l := range require {
		if !e.Active(l) {
			out = append(out, l)
		}
	}
	return out
}

// ActiveLayers returns the names of the active layers, in Layers order after
// gvisor's.
func (e Enforcement) ActiveLayers() []string {
	var out []string
	for _, l := range knownLayers() {
		if e.Active(l) {
			out = append(out, l)
		}
	}
	return out
}

// CheckLayers returns an error naming every entry of names that is not a layer
// (Layers, or LayerGVisor).
func CheckLayers(names []string) error {
	var bad []string
	for _, n := range names {
		known := false
		for _, l := range knownLayers() {
			known = known || n == l
		}
		if !known {
			bad = append(bad, fmt.Sprintf("%q", n))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("unknown enforcement layer %v (known: %v)", bad, knownLayers())
	}
	return nil
}

// DeniesSyscall reports whether profile keeps every call of the system call name from
// running: it is not named by any rule whose action lets it run (allow, log, trace,
// notify: with or without conditions), and the default action refuses it (errno,
// kill, trap). Another architecture's rules are not consulted: a profile's rules
// apply to every architecture it lists.
func DeniesSyscall(profile specs.LinuxSeccomp, name string) bool {
	runs := func(a specs.LinuxSeccompAction) bool {
		switch a {
		case specs.ActErrno, specs.ActKill, specs.ActKillProcess, specs.ActKillThread, specs.ActTrap:
			return false
		}
		return true // allow, log, trace, notify, and anything unknown
	}
	if runs(profile.DefaultAction) {
		for _, r := range profile.Syscalls {
			if !runs(r.Action) && slices.Contains(r.Names, name) && len(r.Args) == 0 {
				return true // refused outright by a rule of its own
			}
		}
		return false
	}
	for _, r := range profile.Syscalls {
		if runs(r.Action) && slices.Contains(r.Names, name) {
			return false
		}
	}
	return true
}
