// Package config is the daemon's configuration: a TOML file (decoded strictly: an
// unknown key is an error naming it), then SANDCELL_* environment variables over it,
// then Validate, which reports every problem at once, each with its key.
//
// The fully commented default is packaging/sandcell.toml; `sandcell config default`
// prints the same values, `sandcell config dump` the configuration in force and
// `sandcell config validate` checks a file.
package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/caarlos0/env/v11"
	"github.com/hashicorp/go-multierror"

	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/seccomp"
)

// EnvPrefix starts the name of every environment override: SANDCELL_<SECTION>_<KEY>,
// for example SANDCELL_SOCKET_PATH or SANDCELL_RUNS_MAX_CONCURRENT. Lists are
// comma-separated.
const EnvPrefix = "SANDCELL_"

// Duration is a time.Duration written as a Go duration string ("30s", "1h30m").
type Duration struct{ time.Duration }

// UnmarshalText parses a duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (like \"30s\" or \"2h\")", b)
	}
	d.Duration = v
	return nil
}

// MarshalText writes the duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.Duration.String()), nil }

// Config is the whole configuration. Field comments give units; packaging/sandcell.toml
// says what each knob is for.
type Config struct {
	// Disabled is the kill switch: every run is refused (503) while it is true.
	Disabled bool `toml:"disabled" env:"DISABLED"`

	Bundle Bundle `toml:"bundle" envPrefix:"BUNDLE_"`
	State  State  `toml:"state" envPrefix:"STATE_"`
	Socket Socket `toml:"socket" envPrefix:"SOCKET_"`
	// TCP is the optional TCP listener for remote callers (bearer tokens).
	TCP   TCP   `toml:"tcp" envPrefix:"TCP_"`
	Runs  Runs  `toml:"runs" envPrefix:"RUNS_"`
	Audit Audit `toml:"audit" envPrefix:"AUDIT_"`
	// Approvals says which actions need a person's approval.
	Approvals Approvals `toml:"approvals" envPrefix:"APPROVALS_"`
	// Health configures the start-up self-test and the periodic canary.
	Health Health `toml:"health" envPrefix:"HEALTH_"`
	// Workspaces bounds every workspace: the named ones of /v1/workspaces and each run's private one.
	Workspaces Workspaces `toml:"workspaces" envPrefix:"WORKSPACES_"`
	// Pool keeps workers started ahead of demand.
	Pool Pool `toml:"pool" envPrefix:"POOL_"`
	// Sessions bounds the interpreter sessions of /v1/sessions.
	Sessions Sessions `toml:"sessions" envPrefix:"SESSIONS_"`
	Limits   Limits   `toml:"limits" envPrefix:"LIMITS_"`
	// Sandbox is the worker's hardening.
	Sandbox Sandbox `toml:"sandbox" envPrefix:"SANDBOX_"`
	// Native configures the native backend.
	Native Native `toml:"native" envPrefix:"NATIVE_"`
	// Access maps callers (SO_PEERCRED uid and gid) to roles.
	Access Access `toml:"access" envPrefix:"ACCESS_"`

	// Tools are the tools a guest may call ("code mode"), by name: the name is the
	// group its functions are in (sandcell.tools.NAME.TOOL). In the file only (no
	// environment overrides); a reload (SIGHUP) applies a change to the next runs.
	Tools map[string]Tool `toml:"tools"`
}

// Tool declares one source of tools for guests: an MCP server the daemon connects
// to as a client, over stdio (Command, which the daemon starts, with the daemon's
// own rights) or streamable HTTP (URL, with a bearer token from TokenFile), each of
// its tools offered as NAME.TOOL (the tool's name with characters other than
// letters, digits and '_' made '_'); or a SQLite database (Path), offered as
// NAME.query(sql, params, max_rows) under the SQL tool's rules.
type Tool struct {
	// Path is a SQLite database outside every workspace (absolute). Its statements
	// run in a SQL worker, as POST /v1/sql's do, which is given the file's
	// directory: keep the database in a directory of its own. Writable lets a
	// statement that writes run, once approved (else it is refused).
	Path     string `toml:"path"`
	Writable bool   `toml:"writable"`
	// Command is the server's argv (the first an absolute path, or a name looked
	// up in the daemon's PATH); Env its environment (nothing else of the daemon's
	// but PATH).
	Command []string          `toml:"command"`
	Env     map[string]string `toml:"env"`
	// URL is a streamable HTTP server's endpoint; TokenFile holds its bearer token.
	URL       string `toml:"url"`
	TokenFile string `toml:"token_file"`
	// Roles may call its tools: "runner" (every caller who may run code, the
	// default), "approver", "admin".
	Roles []string `toml:"roles"`
	// Allow, when set, offers only the tools it names (the server's own names).
	Allow []string `toml:"allow"`
	// Reads and Writes name tools that read only, or that write, overriding the
	// server's annotations (readOnlyHint). A tool neither names nor annotates as
	// read-only writes.
	Reads  []string `toml:"reads"`
	Writes []string `toml:"writes"`
	// Approval: a call of a tool that writes waits for a person's approval (the
	// default, true); false calls it at once (still audited).
	Approval *bool `toml:"approval"`
	// Limits of one run's (or one session cell's) calls to this source's tools.
	Calls int `toml:"calls"` // calls in all (default 1000)
	// ArgumentBytes and ResultBytes bound one call's arguments and result, as
	// JSON (default 1 MiB each, at most 4 MiB).
	ArgumentBytes int64 `toml:"argument_bytes"`
	ResultBytes   int64 `toml:"result_bytes"`
	// Timeout bounds one call, the tool's time (default 30s; a wait for an
	// approval is not counted: approvals.ttl bounds it).
	Timeout Duration `toml:"timeout"`
}

// Tool limits' defaults and bounds.
const (
	DefaultToolCalls = 1000
	DefaultToolBytes = 1 << 20
	MaxToolBytes     = 4 << 20
	DefaultToolTime  = 30 * time.Second
)

// WithDefaults returns t with its unset limits at their defaults.
func (t Tool) WithDefaults() Tool {
	if t.Calls == 0 {
		t.Calls = DefaultToolCalls
	}
	if t.ArgumentBytes == 0 {
		t.ArgumentBytes = DefaultToolBytes
	}
	if t.ResultBytes == 0 {
		t.ResultBytes = DefaultToolBytes
	}
	if t.Timeout.Duration == 0 {
		t.Timeout.Duration = DefaultToolTime
	}
	if len(t.Roles) == 0 {
		t.Roles = []string{"runner"}
	}
	if t.Approval == nil {
		yes := true
		t.Approval = &yes
	}
	return t
}

// toolName is what a [tools.NAME] may be called: a Python identifier of ASCII
// letters, digits and '_', not starting with '_' or a digit.
var toolName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,62}$`)

// validateTools adds each problem of the [tools] section.
func (c Config) validateTools(add func(key, format string, a ...any)) {
	for name, t := range c.Tools {
		key := "tools." + name
		if !toolName.MatchString(name) {
			add(key, "the name must be a Python identifier of letters, digits and '_' (it is the guest's sandcell.tools.%s)", name)
		}
		kinds := 0
		for _, set := range []bool{len(t.Command) > 0, t.URL != "", t.Path != ""} {
			if set {
				kinds++
			}
		}
		switch {
		case kinds > 1:
			add(key, "command, url and path are three kinds of source: give one")
		case kinds == 0:
			add(key, "give command (an MCP server over stdio), url (over streamable HTTP) or path (a SQLite database)")
		case t.Path != "" && (!filepath.IsAbs(t.Path) || filepath.Dir(t.Path) == "/"):
			add(key+".path", "must be an absolute path to a database in a directory of its own, is %q", t.Path)
		case t.Writable && t.Path == "":
			add(key+".writable", "is for a database (path); an MCP server's tools say whether they write")
		case len(t.Command) > 0 && t.Command[0] == "":
			add(key+".command", "the program is empty")
		case t.URL != "" && !strings.HasPrefix(t.URL, "http://") && !strings.HasPrefix(t.URL, "https://"):
			add(key+".url", "%q is not an http(s) URL", t.URL)
		}
		if t.TokenFile != "" && !filepath.IsAbs(t.TokenFile) {
			add(key+".token_file", "must be an absolute path, is %q", t.TokenFile)
		}
		for _, r := range t.Roles {
			if r != "runner" && r != "approver" && r != "admin" {
				add(key+".roles", "%q is not a role (runner, approver, admin)", r)
			}
		}
		if t.Calls < 0 {
			add(key+".calls", "must not be negative, is %d", t.Calls)
		}
		for k, v := range map[string]int64{"argument_bytes": t.ArgumentBytes, "result_bytes": t.ResultBytes} {
			if v < 0 || v > MaxToolBytes {
				add(key+"."+k, "must be between 0 (the default, 1 MiB) and %d, is %d", MaxToolBytes, v)
			}
		}
		if t.Timeout.Duration < 0 {
			add(key+".timeout", "must not be negative, is %s", t.Timeout.Duration)
		}
	}
}

// Bundle locates the pinned interpreter.
type Bundle struct {
	// Dir holds python.wasm, MANIFEST and the precompiled .cwasm files.
	Dir string `toml:"dir" env:"DIR"`
	// CacheDir receives a .cwasm rebuilt when the bundle's own cannot be used.
	CacheDir string `toml:"cache_dir" env:"CACHE_DIR"`
	// HashSecretRotation is the lifetime of the string hash secret new runs and
	// sessions start with: the daemon compiles modules with a secret of its own,
	// beneath state.dir, in the background after its first start and again each
	// period (docs/security.md); 0 keeps the bundle's secret, which every
	// installation of one package shares.
	HashSecretRotation Duration `toml:"hash_secret_rotation" env:"HASH_SECRET_ROTATION"`
}

// State locates the daemon's own files.
type State struct {
	// Dir holds the audit log, run results and workspaces.
	Dir string `toml:"dir" env:"DIR"`
}

// Socket is the Unix socket the API listens on.
type Socket struct {
	Path string `toml:"path" env:"PATH"`
	// Mode is the socket file's octal mode ("0660"); never wider than 0666.
	Mode string `toml:"mode" env:"MODE"`
	// Group owns the socket file; empty keeps the daemon's group.
	Group string `toml:"group" env:"GROUP"`
}

// TCP configures the optional TCP listener. It starts only when Listen is set, and
// then only with at least one bearer token in TokensFile; TLS when both files are set.
type TCP struct {
	// Listen is host:port ("127.0.0.1:8080", ":8443"); empty: no TCP listener.
	Listen string `toml:"listen" env:"LISTEN"`
	// TokensFile holds the [[token]] entries (name, sha256 of the secret, roles).
	TokensFile string `toml:"tokens_file" env:"TOKENS_FILE"`
	// TLSCertFile and TLSKeyFile are PEM files; both or neither.
	TLSCertFile string `toml:"tls_cert_file" env:"TLS_CERT_FILE"`
	TLSKeyFile  string `toml:"tls_key_file" env:"TLS_KEY_FILE"`
}

// Runs bounds the run manager.
type Runs struct {
	// MaxConcurrent is how many workers run at once; 0 means one per CPU.
	MaxConcurrent int `toml:"max_concurrent" env:"MAX_CONCURRENT"`
	// QueueLength is how many runs may wait for a worker before 429.
	QueueLength int `toml:"queue_length" env:"QUEUE_LENGTH"`
	// MaxPerCaller bounds the runs (code and SQL, running plus queued, wait:false
	// included) of one caller: a uid on the socket, a token on TCP (429
	// caller_limit beyond). 0 means a quarter of the workers and queue places
	// together, rounded up (PerCaller).
	MaxPerCaller int `toml:"max_per_caller" env:"MAX_PER_CALLER"`
	// ResultRetention is how long a finished run's result stays readable.
	ResultRetention Duration `toml:"result_retention" env:"RESULT_RETENTION"`
	// ShutdownGrace is how long a stopping daemon lets running runs finish before it
	// cancels them. It must fit in the service manager's stop timeout (systemd's
	// TimeoutStopSec=, podman and docker stop's 10 s, Kubernetes'
	// terminationGracePeriodSeconds) with room for the rest of the shutdown.
	ShutdownGrace Duration `toml:"shutdown_grace" env:"SHUTDOWN_GRACE"`
	// MaxRequestBytes bounds a request body (413 above it).
	MaxRequestBytes int64 `toml:"max_request_bytes" env:"MAX_REQUEST_BYTES"`
	// RequestTimeout bounds how long a caller may take to send one request, headers
	// and body (408 request_timeout past it).
	RequestTimeout Duration `toml:"request_timeout" env:"REQUEST_TIMEOUT"`
	// MaxRetainedOutputBytes bounds what the daemon keeps for callers: the output and
	// event records of finished and running runs; past it the oldest finished
	// results lose their stdout and stderr.
	MaxRetainedOutputBytes int64 `toml:"max_retained_output_bytes" env:"MAX_RETAINED_OUTPUT_BYTES"`
	// MaxConnections bounds the API's open connections; at the bound a new one
	// replaces the one idle the longest, or takes one of 8 more kept for the health
	// endpoints only.
	MaxConnections int `toml:"max_connections" env:"MAX_CONNECTIONS"`
	// MaxConnectionsPerUID bounds the open connections of one uid on the Unix socket
	// (429 beyond), and of one client address on the TCP listener (closed beyond).
	MaxConnectionsPerUID int `toml:"max_connections_per_uid" env:"MAX_CONNECTIONS_PER_UID"`
}

// Audit configures the audit log.
type Audit struct {
	// Retention is how long audit records are kept.
	Retention Duration `toml:"retention" env:"RETENTION"`
	// RecordCode stores each run's code in the log, not only its SHA-256.
	RecordCode bool `toml:"record_code" env:"RECORD_CODE"`
}

// Approvals configures the approval mechanism.
type Approvals struct {
	// Required names the actions held for approval: "sql.write" (a SQL statement
	// that writes), "run" (any run of code).
	Required []string `toml:"required" env:"REQUIRED"`
	// Elicitation names the callers whose own confirmation, asked of the person at
	// their MCP client (elicitation), counts as the approval of their request:
	// "socket" (local users on the Unix socket, such as an agent host running
	// `sandcell mcp`), "tcp" (token holders). Others need an approver.
	Elicitation []string `toml:"elicitation" env:"ELICITATION"`
	// TTL is how long a request waits for a decision.
	TTL Duration `toml:"ttl" env:"TTL"`
	// Window is how long an approved request may be used (once).
	Window Duration `toml:"window" env:"WINDOW"`
}

// Health configures readiness.
type Health struct {
	// ExitOnFailure makes a failed start-up self-test end the daemon (non-zero);
	// false keeps it up, unready (every run refused with 503), for inspection.
	ExitOnFailure bool `toml:"exit_on_failure" env:"EXIT_ON_FAILURE"`
	// CanaryInterval is how often a light canary (print(6*7) with every required
	// layer) runs; readiness and the systemd watchdog depend on it.
	CanaryInterval Duration `toml:"canary_interval" env:"CANARY_INTERVAL"`
}

// Workspaces bounds each workspace (a named one, and a run's private one). Uploads
// are refused past the quota; a run is measured as it goes and ends
// quota_exceeded once its workspace is past it (no file may be larger than
// max_bytes, RLIMIT_FSIZE; what the guest writes between two measures, 0.1 s to 2 s
// apart, may pass it), after which the workspace refuses runs and uploads until
// files are removed.
type Workspaces struct {
	// MaxBytes bounds the bytes of one workspace's regular files.
	MaxBytes int64 `toml:"max_bytes" env:"MAX_BYTES"`
	// MaxFiles bounds the names (files, directories, links) in one workspace.
	MaxFiles int `toml:"max_files" env:"MAX_FILES"`
}

// Pool configures the warm pool: workers started, hardened as far as a run not yet
// known allows, with the interpreter's snapshot loaded, each serving one run with
// the default limits (other runs start a worker of their own).
type Pool struct {
	// Size is how many idle workers are kept; 0 turns the pool off.
	Size int `toml:"size" env:"SIZE"`
	// MemoryBudget bounds the resident memory of the idle workers together, in bytes.
	MemoryBudget int64 `toml:"memory_budget" env:"MEMORY_BUDGET"`
}

// Sessions bounds the interpreter sessions: each is one worker process, with its
// interpreter's memory (up to its memory limit), for as long as it lives.
type Sessions struct {
	// Max bounds the live sessions in all; 0 turns sessions off.
	Max int `toml:"max" env:"MAX"`
	// MaxPerCaller bounds those of one caller (a uid, a token).
	MaxPerCaller int `toml:"max_per_caller" env:"MAX_PER_CALLER"`
	// IdleTimeout ends a session that has run no cell for that long, paused or
	// not (its state with it).
	IdleTimeout Duration `toml:"idle_timeout" env:"IDLE_TIMEOUT"`
	// PauseAfter pauses a live session that has run no cell for that long: its
	// state goes to a checkpoint file in the state directory, its worker ends, and
	// its next cell resumes it. 0: only MemoryBudget and the daemon's stop pause.
	PauseAfter Duration `toml:"pause_after" env:"PAUSE_AFTER"`
	// MemoryBudget bounds the interpreter memory of the live sessions together, in
	// bytes: past it the least recently used idle ones are paused. 0: no bound.
	MemoryBudget int64 `toml:"memory_budget" env:"MEMORY_BUDGET"`
	// MaxPausedBytesPerCaller bounds the checkpoint files of one caller's paused
	// sessions, in bytes; a session that would pass it stays live. 0: no bound.
	MaxPausedBytesPerCaller int64 `toml:"max_paused_bytes_per_caller" env:"MAX_PAUSED_BYTES_PER_CALLER"`
}

// Limits are a run's defaults and the maxima a request may ask for.
type Limits struct {
	Default RunLimits `toml:"default" envPrefix:"DEFAULT_"`
	Max     RunLimits `toml:"max" envPrefix:"MAX_"`
}

// RunLimits bound one run. In Max, 0 means no cap (for Fuel and CPU: not allowed
// unless a default sets them).
type RunLimits struct {
	Timeout        Duration `toml:"timeout" env:"TIMEOUT"`
	CPU            Duration `toml:"cpu" env:"CPU"`
	MemoryMiB      int64    `toml:"memory_mib" env:"MEMORY_MIB"`
	Fuel           uint64   `toml:"fuel" env:"FUEL"`
	MaxOutputBytes int64    `toml:"max_output_bytes" env:"MAX_OUTPUT_BYTES"`
}

// Sandbox configures the worker's hardening.
type Sandbox struct {
	// Require names the enforcement layers without which no code runs.
	Require []string `toml:"require" env:"REQUIRE"`
	// SeccompProfile is an OCI seccomp JSON file replacing the built-in profile.
	SeccompProfile string `toml:"seccomp_profile" env:"SECCOMP_PROFILE"`
	// EnvAllow lists the environment variable names a request may pass to the guest.
	EnvAllow []string `toml:"env_allow" env:"ENV_ALLOW"`
	// MaxFileBytes is the largest file a run may write (RLIMIT_FSIZE).
	MaxFileBytes int64 `toml:"max_file_bytes" env:"MAX_FILE_BYTES"`
	// MaxOpenFiles is RLIMIT_NOFILE of a worker.
	MaxOpenFiles int64 `toml:"max_open_files" env:"MAX_OPEN_FILES"`
	// MaxThreads is RLIMIT_NPROC of a worker (inside its user namespace).
	MaxThreads int64 `toml:"max_threads" env:"MAX_THREADS"`
	// Disable lists layers not applied at all ("seccomp", "landlock", "namespaces").
	Disable []string `toml:"disable" env:"DISABLE"`
}

// Native configures the native backend: Debian's CPython with its scientific stack
// (numpy, pandas, matplotlib, scipy, scikit-learn), run from the bundle's verified
// native root as a hardened process (see docs/security.md, "The two backends").
type Native struct {
	// Runners may run code on the native backend: entries as in [access] (a user,
	// a uid, "@group", "@gid"), "token:NAME" for a TCP token, or "*" for every
	// caller who may run code at all. Empty: nobody (the backend is off).
	Runners []string `toml:"runners" env:"RUNNERS"`
	// Require names the enforcement layers without which no native code runs;
	// empty means the same as sandbox.require.
	Require []string `toml:"require" env:"REQUIRE"`
	// Processes lets native guests start processes (fork, subprocess), which stay
	// in the run's namespaces and limits; off, only threads.
	Processes bool `toml:"processes" env:"PROCESSES"`
	// TmpMiB is the size of a native guest's private /tmp (a tmpfs), in MiB.
	TmpMiB int64 `toml:"tmp_mib" env:"TMP_MIB"`
	// Warm is how many warm native workers are kept, one for each of the
	// workspaces of the latest native runs: hardened like any native worker, with
	// Preimport imported, waiting for the next run there (see docs/operator.md).
	// Each holds about 95 MiB resident; 0 turns them off.
	Warm int `toml:"warm" env:"WARM"`
	// Preimport are the modules a warm native worker imports before its run.
	Preimport []string `toml:"preimport" env:"PREIMPORT"`
	// Runsc is gVisor's runsc (a path, or a name looked up in PATH), through which
	// native runs go where Require names "gvisor"; empty: none (such runs are
	// refused). Read at start.
	Runsc string `toml:"runsc" env:"RUNSC"`
}

// Access lists who may do what. An entry is a user name, a uid, "@group" or "@gid".
type Access struct {
	// Runners may run code and use workspaces.
	Runners []string `toml:"runners" env:"RUNNERS"`
	// Approvers may approve or deny requests that need approval.
	Approvers []string `toml:"approvers" env:"APPROVERS"`
	// Admins may read the audit log and change the daemon's state.
	Admins []string `toml:"admins" env:"ADMINS"`
}

// Default returns the built-in configuration, the values packaging/sandcell.toml
// shows.
func Default() Config {
	p := policy.Default()
	return Config{
		Bundle: Bundle{Dir: "/usr/lib/sandcell", CacheDir: "/var/cache/sandcell", HashSecretRotation: Duration{24 * time.Hour}},
		State:  State{Dir: "/var/lib/sandcell"},
		Socket: Socket{Path: "/run/sandcell/sandcell.sock", Mode: "0660", Group: "sandcell"},
		Runs: Runs{MaxConcurrent: 0, QueueLength: 64, ResultRetention: Duration{time.Hour}, ShutdownGrace: Duration{30 * time.Second},
			MaxRequestBytes: 1 << 20, RequestTimeout: Duration{30 * time.Second}, MaxRetainedOutputBytes: 256 << 20, MaxConnections: 256, MaxConnectionsPerUID: 64},
		Audit:      Audit{Retention: Duration{90 * 24 * time.Hour}},
		Workspaces: Workspaces{MaxBytes: 256 << 20, MaxFiles: 10_000},
		Pool:       Pool{Size: 4, MemoryBudget: 512 << 20},
		Sessions: Sessions{Max: 8, MaxPerCaller: 2, IdleTimeout: Duration{time.Hour}, PauseAfter: Duration{5 * time.Minute},
			MemoryBudget: 2 << 30, MaxPausedBytesPerCaller: 4 << 30},
		Health: Health{ExitOnFailure: true, CanaryInterval: Duration{time.Minute}},
		Approvals: Approvals{Required: []string{"sql.write"}, Elicitation: []string{}, TTL: Duration{15 * time.Minute},
			Window: Duration{10 * time.Minute}},
		Limits: Limits{
			Default: fromLimits(p.Default),
			Max:     fromLimits(p.Max),
		},
		Sandbox: Sandbox{Require: p.Require, MaxFileBytes: p.MaxFileBytes, MaxOpenFiles: p.MaxOpenFiles,
			MaxThreads: p.MaxThreads, EnvAllow: []string{}, Disable: []string{}},
		Access: Access{Runners: []string{"@sandcell"}, Approvers: []string{}, Admins: []string{"root"}},
		Native: Native{Runners: []string{"*"}, Require: []string{}, TmpMiB: p.NativeTmpBytes / policy.MiB,
			Warm: 2, Preimport: []string{"numpy", "pandas", "matplotlib.pyplot"}, Runsc: "runsc"},
	}
}

func fromLimits(l protocol.Limits) RunLimits {
	return RunLimits{Timeout: Duration{time.Duration(l.TimeoutMS) * time.Millisecond},
		CPU: Duration{time.Duration(l.CPUMS) * time.Millisecond}, MemoryMiB: l.MemoryBytes / policy.MiB,
		Fuel: l.Fuel, MaxOutputBytes: l.MaxStdoutBytes}
}

// maxMemoryMiB is the most guest memory in MiB: the 4 GiB a wasm32 guest can address.
const maxMemoryMiB = 4096

func (r RunLimits) limits() protocol.Limits {
	return protocol.Limits{TimeoutMS: r.Timeout.Milliseconds(), CPUMS: r.CPU.Milliseconds(),
		MemoryBytes: r.MemoryMiB * policy.MiB, Fuel: r.Fuel, MaxStdoutBytes: r.MaxOutputBytes,
		MaxStderrBytes: r.MaxOutputBytes}
}

// Load reads path over the defaults (an empty path reads no file), then applies the
// SANDCELL_* environment from environ (os.Environ() form), then validates. Every
// error names its key: a TOML syntax error with its line, an unknown key by its dotted
// name, a bad environment value by its variable.
func Load(path string, environ []string) (Config, error) {
	c := Default()
	if path != "" {
		md, err := toml.DecodeFile(path, &c)
		if err != nil {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
		if extra := md.Undecoded(); len(extra) > 0 {
			var keys []string
			for _, k := range extra {
				keys = append(keys, k.String())
			}
			return c, fmt.Errorf("config %s: unknown key %s", path, strings.Join(keys, ", "))
		}
	}
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix) {
			vars[k] = v
		}
	}
	if err := env.ParseWithOptions(&c, env.Options{Prefix: EnvPrefix, Environment: vars}); err != nil {
		// Name the variables at fault: the library names struct fields.
		var bad []string
		for k, v := range vars {
			probe := Default()
			if env.ParseWithOptions(&probe, env.Options{Prefix: EnvPrefix, Environment: map[string]string{k: v}}) != nil {
				bad = append(bad, fmt.Sprintf("%s=%q", k, v))
			}
		}
		sort.Strings(bad)
		return c, fmt.Errorf("environment: cannot use %s: %w", strings.Join(bad, ", "), err)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

var principal = regexp.MustCompile(`^@?[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$`)

// Validate reports every problem in c, one line each, starting with its key.
func (c Config) Validate() error {
	var errs *multierror.Error
	add := func(key, format string, a ...any) {
		errs = multierror.Append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	c.validateTools(add)
	// MiB beyond what a wasm32 guest can address would overflow as bytes.
	for key, m := range map[string]int64{"limits.default.memory_mib": c.Limits.Default.MemoryMiB, "limits.max.memory_mib": c.Limits.Max.MemoryMiB} {
		if m < 0 || m > maxMemoryMiB {
			add(key, "must be between 0 and %d (the 4 GiB a wasm32 guest can address), is %d", maxMemoryMiB, m)
		}
	}
	for key, p := range map[string]string{"bundle.dir": c.Bundle.Dir, "bundle.cache_dir": c.Bundle.CacheDir,
		"state.dir": c.State.Dir, "socket.path": c.Socket.Path} {
		if !filepath.IsAbs(p) {
			add(key, "must be an absolute path, is %q", p)
		}
	}
	if m, err := strconv.ParseUint(c.Socket.Mode, 8, 32); err != nil || m&^0o666 != 0 || m&0o600 != 0o600 {
		add("socket.mode", "%q must be octal, give the owner read and write, and grant nothing beyond 0666", c.Socket.Mode)
	} else if m&0o006 != 0 {
		add("socket.mode", "%q lets every local user reach the API; use a group (socket.group) instead", c.Socket.Mode)
	}
	if r := c.Bundle.HashSecretRotation.Duration; r != 0 && r < time.Hour {
		add("bundle.hash_secret_rotation", "must be 0 (the bundle's secret) or at least 1h (each costs a snapshot and two compiles), is %s", r)
	}
	if c.Native.Warm < 0 || c.Native.Warm > 64 {
		add("native.warm", "must be between 0 and 64, is %d", c.Native.Warm)
	}
	for _, m := range c.Native.Preimport {
		if !protocol.ModuleName(m) {
			add("native.preimport", "%q is not a dotted module name", m)
		}
	}
	if c.Runs.MaxConcurrent < 0 {
		add("runs.max_concurrent", "must be 0 (one per CPU) or positive, is %d", c.Runs.MaxConcurrent)
	}
	if c.Runs.QueueLength < 0 {
		add("runs.queue_length", "must not be negative, is %d", c.Runs.QueueLength)
	}
	if c.Runs.MaxPerCaller < 0 {
		add("runs.max_per_caller", "must be 0 (a quarter of the workers and queue places) or positive, is %d", c.Runs.MaxPerCaller)
	}
	if c.Runs.ShutdownGrace.Duration < 0 {
		add("runs.shutdown_grace", "must not be negative")
	}
	if c.Runs.ResultRetention.Duration <= 0 {
		add("runs.result_retention", "must be positive")
	}
	if c.Runs.MaxRequestBytes < 1024 || c.Runs.MaxRequestBytes > protocol.MaxFrame {
		add("runs.max_request_bytes", "must be between 1024 and %d, is %d", protocol.MaxFrame, c.Runs.MaxRequestBytes)
	}
	if c.Runs.RequestTimeout.Duration < 100*time.Millisecond {
		add("runs.request_timeout", "must be at least 100ms, is %v", c.Runs.RequestTimeout.Duration)
	}
	if c.Runs.MaxRetainedOutputBytes < 1<<20 {
		add("runs.max_retained_output_bytes", "must be at least 1048576, is %d", c.Runs.MaxRetainedOutputBytes)
	}
	if c.Runs.MaxConnections < 4 {
		add("runs.max_connections", "must be at least 4, is %d", c.Runs.MaxConnections)
	}
	if c.Runs.MaxConnectionsPerUID < 1 || c.Runs.MaxConnectionsPerUID > c.Runs.MaxConnections {
		add("runs.max_connections_per_uid", "must be between 1 and runs.max_connections (%d), is %d",
			c.Runs.MaxConnections, c.Runs.MaxConnectionsPerUID)
	}
	if c.Audit.Retention.Duration <= 0 {
		add("audit.retention", "must be positive")
	}
	if c.TCP.Listen != "" {
		if _, _, err := net.SplitHostPort(c.TCP.Listen); err != nil {
			add("tcp.listen", "%q is not host:port", c.TCP.Listen)
		}
		if c.TCP.TokensFile == "" {
			add("tcp.tokens_file", "is required with tcp.listen: the TCP listener never starts without bearer tokens")
		}
	}
	if (c.TCP.TLSCertFile == "") != (c.TCP.TLSKeyFile == "") {
		add("tcp.tls_cert_file", "tcp.tls_cert_file and tcp.tls_key_file go together")
	}
	for _, a := range c.Approvals.Required {
		if a != "sql.write" && a != "run" {
			add("approvals.required", "%q is not an action (sql.write, run)", a)
		}
	}
	for _, e := range c.Approvals.Elicitation {
		if e != "socket" && e != "tcp" {
			add("approvals.elicitation", "%q is not a kind of caller (socket, tcp)", e)
		}
	}
	if c.Approvals.TTL.Duration <= 0 || c.Approvals.Window.Duration <= 0 {
		add("approvals.ttl", "approvals.ttl and approvals.window must be positive")
	}
	if c.Health.CanaryInterval.Duration < time.Second {
		add("health.canary_interval", "must be at least 1s, is %s", c.Health.CanaryInterval.Duration)
	}
	if c.Workspaces.MaxBytes < 1 {
		add("workspaces.max_bytes", "must be positive, is %d", c.Workspaces.MaxBytes)
	}
	if c.Sessions.Max < 0 || c.Sessions.Max > 1024 {
		add("sessions.max", "must be 0 (off) to 1024, is %d", c.Sessions.Max)
	}
	if c.Sessions.Max > 0 && (c.Sessions.MaxPerCaller < 1 || c.Sessions.MaxPerCaller > c.Sessions.Max) {
		add("sessions.max_per_caller", "must be between 1 and sessions.max (%d), is %d", c.Sessions.Max, c.Sessions.MaxPerCaller)
	}
	if c.Sessions.Max > 0 && c.Sessions.IdleTimeout.Duration < time.Second {
		add("sessions.idle_timeout", "must be at least 1s, is %s", c.Sessions.IdleTimeout)
	}
	if c.Sessions.PauseAfter.Duration < 0 {
		add("sessions.pause_after", "must be 0 (no idle pause) or more, is %s", c.Sessions.PauseAfter)
	}
	if c.Sessions.MemoryBudget < 0 {
		add("sessions.memory_budget", "must be 0 (no bound) or more, is %d", c.Sessions.MemoryBudget)
	}
	if c.Sessions.MaxPausedBytesPerCaller < 0 {
		add("sessions.max_paused_bytes_per_caller", "must be 0 (no bound) or more, is %d", c.Sessions.MaxPausedBytesPerCaller)
	}
	if c.Pool.Size < 0 || c.Pool.Size > 64 {
		add("pool.size", "must be 0 (off) to 64, is %d", c.Pool.Size)
	}
	if c.Pool.MemoryBudget < 0 {
		add("pool.memory_budget", "must not be negative, is %d", c.Pool.MemoryBudget)
	}
	if c.Workspaces.MaxFiles < 1 {
		add("workspaces.max_files", "must be positive, is %d", c.Workspaces.MaxFiles)
	}
	if c.Sandbox.SeccompProfile != "" {
		if _, err := seccomp.LoadFile(c.Sandbox.SeccompProfile); err != nil {
			add("sandbox.seccomp_profile", "%v", err)
		}
	}
	for key, list := range map[string][]string{"access.runners": c.Access.Runners,
		"access.approvers": c.Access.Approvers, "access.admins": c.Access.Admins} {
		for _, p := range list {
			if !principal.MatchString(p) {
				add(key, "%q is not a user name, uid, @group or @gid", p)
			}
		}
	}
	// The limits and the hardening are the sandbox policy's to judge; a limit's
	// problem is said with this file's key (limits.max.memory_mib), the rest name
	// the sandbox.* settings.
	if err := c.policy().Validate(); err != nil {
		for _, e := range policy.Describe(err, configLimitName) {
			if !strings.HasPrefix(e, "limits.") {
				e = "limits/sandbox: " + e
			}
			errs = multierror.Append(errs, errors.New(e))
		}
	}
	return joined(errs)
}

// joined formats errs one per line, or returns nil.
func joined(errs *multierror.Error) error {
	if errs == nil {
		return nil
	}
	errs.ErrorFormat = func(es []error) string {
		lines := make([]string, len(es))
		for i, e := range es {
			lines[i] = e.Error()
		}
		return strings.Join(lines, "\n")
	}
	return errs
}

func (c Config) policy() policy.Policy {
	return policy.Policy{
		Default:      c.Limits.Default.limits(),
		Max:          c.Limits.Max.limits(),
		EnvAllow:     c.Sandbox.EnvAllow,
		Require:      c.Sandbox.Require,
		MaxFileBytes: c.Sandbox.MaxFileBytes,
		MaxOpenFiles: c.Sandbox.MaxOpenFiles,
		MaxThreads:   c.Sandbox.MaxThreads,
		Disable:      c.Sandbox.Disable,

		NativeRequire:   c.Native.Require,
		NativeProcesses: c.Native.Processes,
		NativeTmpBytes:  c.Native.TmpMiB * policy.MiB,
	}
}

// Policy returns the sandbox policy c describes, with the operator's seccomp profile
// loaded when one is configured.
func (c Config) Policy() (policy.Policy, error) {
	p := c.policy()
	if c.Sandbox.SeccompProfile != "" {
		prof, err := seccomp.LoadFile(c.Sandbox.SeccompProfile)
		if err != nil {
			return p, err
		}
		p.Seccomp = &prof
	}
	return p, p.Validate()
}

// MemoryLimit is the daemon's soft memory limit (runtime/debug.SetMemoryLimit), in
// bytes: what its budgets let it hold (runs.max_retained_output_bytes for what it
// keeps, the two streams of each running run at limits.max.max_output_bytes, 64
// MiB when that is 0, and of each running cell of a session at 16 MiB when sessions
// are on) plus 256 MiB for everything else. Near it the collector runs
// more often and gives freed memory back to the kernel sooner, so the resident size
// follows what is kept instead of twice the largest heap ever reached. A sum past
// math.MaxInt64 is math.MaxInt64 (no limit).
func (c Config) MemoryLimit() int64 {
	out := c.Limits.Max.MaxOutputBytes
	if out <= 0 {
		out = 64 << 20
	}
	perWorker := 2 * float64(out)
	if c.Sessions.Max > 0 {
		perWorker += 2 * 16 << 20 // sessions.MaxCellOutputBytes, per stream
	}
	sum := float64(max(c.Runs.MaxRetainedOutputBytes, 0)) + float64(c.Concurrency())*perWorker + 256<<20
	if sum >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(sum)
}

// Concurrency is Runs.MaxConcurrent with 0 resolved to the CPU count.
func (c Config) Concurrency() int {
	if c.Runs.MaxConcurrent > 0 {
		return c.Runs.MaxConcurrent
	}
	return runtime.NumCPU()
}

// PerCaller is Runs.MaxPerCaller with 0 resolved to a quarter of the workers and
// queue places together, rounded up (17 with 2 workers and a queue of 64): four
// callers at their bound fill the daemon, and no one caller can.
func (c Config) PerCaller() int {
	if c.Runs.MaxPerCaller > 0 {
		return c.Runs.MaxPerCaller
	}
	return max(1, (c.Concurrency()+c.Runs.QueueLength+3)/4)
}

// Encode writes c as TOML (what `sandcell config dump` prints).
func (c Config) Encode(w io.Writer) error {
	return toml.NewEncoder(w).Encode(c)
}

// configLimitName names a limit of the policy as this file's keys do.
func configLimitName(e *policy.LimitError, v int64) (string, string) {
	key := "limits." + e.Set + "."
	switch e.Field {
	case "timeout_ms":
		return key + "timeout", (time.Duration(v) * time.Millisecond).String()
	case "cpu_ms":
		return key + "cpu", (time.Duration(v) * time.Millisecond).String()
	case "memory_bytes":
		return key + "memory_mib", strconv.FormatFloat(float64(v)/policy.MiB, 'f', -1, 64)
	case "max_stdout_bytes", "max_stderr_bytes":
		return key + "max_output_bytes", strconv.FormatInt(v, 10)
	}
	return key + e.Field, strconv.FormatInt(v, 10)
}
