package api_test

import (
	"strings"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// A path that cannot name a program (a NUL byte, the workspace itself, a way out of
// it) is refused before a worker is spent on it.
func TestRunPathRefused(t *testing.T) {
	d := start(t, setup{})
	ws := d.newWorkspace(t)
	for _, p := range []string{`a\u0000b`, `.`, `./a.py`, `../a.py`, `/ws/a.py`, `a//b.py`} {
		resp, body := d.do(t, "POST", "/v1/runs", `{"workspace":"`+ws+`","path":"`+p+`"}`)
		wantProblem(t, resp, body, 400, wire.CodeBadRequest)
	}
}

// A path that names nothing ends as CPython's own start-up ends it: status 2, and
// its message on stderr.
func TestRunPathMissing(t *testing.T) {
	d := start(t, setup{})
	ws := d.newWorkspace(t)
	v := d.run(t, `{"workspace":"`+ws+`","path":"nothing.py"}`)
	if r := v.Result; r.Reason != protocol.Exited || r.ExitCode != 2 ||
		!strings.Contains(string(r.Stderr), "can't open file '/ws/nothing.py': [Errno 44] No such file or directory") {
		t.Fatalf("a missing program: %s %d %q", r.Reason, r.ExitCode, r.Stderr)
	}
}
