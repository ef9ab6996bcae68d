package config

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/packaging"
)

func write(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sandcell.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The packaged, commented file shows exactly the built-in defaults.
func TestPackagedFileIsTheDefault(t *testing.T) {
	c, err := Load(write(t, packaging.DefaultConfig()), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("packaging/sandcell.toml differs from Default():\n%+v\n%+v", c, Default())
	}
}

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := Default().Policy(); err != nil {
		t.Fatal(err)
	}
}

func TestUnknownKeyNamed(t *testing.T) {
	_, err := Load(write(t, "[socket]\npath = \"/run/x.sock\"\nmdoe = \"0600\"\n[runz]\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "socket.mdoe") {
		t.Fatalf("err = %v", err)
	}
}

func TestSyntaxErrorHasLine(t *testing.T) {
	_, err := Load(write(t, "disabled = false\n[runs\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "line ") {
		t.Fatalf("err = %v", err)
	}
}

// Validate reports every problem, each with its key.
func TestValidateNamesEveryKey(t *testing.T) {
	_, err := Load(write(t, `
[bundle]
hash_secret_rotation = "10m"
[socket]
path = "relative.sock"
mode = "0666"
[runs]
max_concurrent = -1
queue_length = -2
max_request_bytes = 10
[audit]
retention = "0s"
[limits.default]
timeout = "20m"
[sandbox]
require = ["seccomp", "apparmor"]
seccomp_profile = "/nonexistent.json"
[access]
runners = ["bad name!"]
[tcp]
listen = "0.0.0.0:8443"
tls_key_file = "/k.pem"
[workspaces]
max_files = 0
`), nil)
	if err == nil {
		t.Fatal("no error")
	}
	for _, key := range []string{"socket.path", "socket.mode", "runs.max_concurrent", "runs.queue_length",
		"runs.max_request_bytes", "audit.retention", "limits.default.timeout 20m0s is above the maximum 10m0s", "apparmor", "sandbox.seccomp_profile", "access.runners",
		"tcp.tokens_file", "tcp.tls_cert_file", "workspaces.max_files", "bundle.hash_secret_rotation"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s:\n%v", key, err)
		}
	}
	for _, m := range []string{"-17592186044416", "17592186044416", "-1"} {
		if _, err := Load(write(t, "[limits.max]\nmemory_mib = "+m+"\n"), nil); err == nil || !strings.Contains(err.Error(), "limits.max.memory_mib: must be between 0 and 4096") {
			t.Errorf("memory_mib %s: %v", m, err)
		}
	}
	if _, err := Load(write(t, "[runs]\nresult_retention = \"soon\"\n"), nil); err == nil || !strings.Contains(err.Error(), "soon") {
		t.Errorf("bad duration: %v", err)
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	c, err := Load(write(t, "[socket]\npath = \"/run/file.sock\"\n"), []string{
		"SANDCELL_SOCKET_PATH=/run/env.sock",
		"SANDCELL_DISABLED=true",
		"SANDCELL_RUNS_MAX_CONCURRENT=3",
		"SANDCELL_LIMITS_DEFAULT_TIMEOUT=5s",
		"SANDCELL_SANDBOX_REQUIRE=seccomp,landlock",
		"HOME=/root",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket.Path != "/run/env.sock" || !c.Disabled || c.Concurrency() != 3 ||
		c.Limits.Default.Timeout.Duration != 5*time.Second || !reflect.DeepEqual(c.Sandbox.Require, []string{"seccomp", "landlock"}) {
		t.Fatalf("%+v", c)
	}
	if _, err := Load("", []string{"SANDCELL_RUNS_QUEUE_LENGTH=many"}); err == nil || !strings.Contains(err.Error(), "SANDCELL_RUNS_QUEUE_LENGTH") {
		t.Fatalf("bad env value: %v", err)
	}
}

// A dump reads back as the same configuration.
func TestDumpRoundTrip(t *testing.T) {
	c := Default()
	c.Runs.MaxConcurrent = 5
	c.Access.Approvers = []string{"alice", "@ops"}
	var b bytes.Buffer
	if err := c.Encode(&b); err != nil {
		t.Fatal(err)
	}
	back, err := Load(write(t, b.String()), nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip:\n%+v\n%+v", back, c)
	}
}

// The soft memory limit follows the budgets and saturates instead of overflowing
// (a max_output_bytes near 2^62 had made it 1 MiB).
func TestMemoryLimit(t *testing.T) {
	c := Default()
	c.Runs.MaxConcurrent = 2
	if got, want := c.MemoryLimit(), c.Runs.MaxRetainedOutputBytes+2*(2*c.Limits.Max.MaxOutputBytes+2*16<<20)+256<<20; got != want {
		t.Fatalf("default: %d, want %d", got, want)
	}
	c.Limits.Max.MaxOutputBytes = 4611686018293432320
	if got := c.MemoryLimit(); got != math.MaxInt64 {
		t.Fatalf("huge output limit: %d", got)
	}
	c.Limits.Max.MaxOutputBytes, c.Runs.MaxRetainedOutputBytes = 1<<20, math.MaxInt64
	if got := c.MemoryLimit(); got != math.MaxInt64 {
		t.Fatalf("huge retained budget: %d", got)
	}
}

// Each [tools.NAME] is checked: its name (the guest's sandcell.tools.NAME), one
// kind of server, its roles and limits; a good one loads with its defaults.
func TestToolsValidated(t *testing.T) {
	_, err := Load(write(t, `
[tools.bad-name]
command = ["x"]
[tools.both]
command = ["x"]
url = "https://example"
[tools.neither]
roles = ["root"]
[tools.limits]
url = "ftp://example"
token_file = "relative"
argument_bytes = 99999999
calls = -1
`), nil)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"tools.bad-name: the name must be a Python identifier", "tools.both: command, url and path",
		"tools.neither: give command", `tools.neither.roles: "root" is not a role`, `tools.limits.url: "ftp://example"`,
		"tools.limits.token_file", "tools.limits.argument_bytes", "tools.limits.calls"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	c, err := Load(write(t, `
[tools.memory]
command = ["/usr/bin/mcp-server-memory"]
reads = ["read_graph"]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Tools["memory"].WithDefaults(); m.Calls != DefaultToolCalls || m.ResultBytes != DefaultToolBytes ||
		m.Timeout.Duration != DefaultToolTime || !*m.Approval || m.Roles[0] != "runner" {
		t.Fatalf("defaults: %+v", m)
	}
}
