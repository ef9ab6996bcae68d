package worker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The native runner writes its report frame itself, in Python: its version must be
// this build's, or the parent refuses the frame and loses a MemoryError's reason.
func TestNativeRunnerSpeaksThisProtocol(t *testing.T) {
	runner := protocol.NativeRunner()
	if want := fmt.Sprintf("_sandcell_version = %d ", protocol.Version); !strings.HasPrefix(runner, want) {
		t.Fatalf("the native runner does not begin with %q", want)
	}
	for _, want := range []string{`'{"version":%d,"step":"%s"%s}' % (_sandcell_version, step,`,
		`'{"version":%d,"step":"tool_call","call":%s}' % (_sandcell_version, json.dumps(msg))`} {
		if !strings.Contains(runner, want) {
			t.Fatalf("native.py does not write %s", want)
		}
	}
}

// The guest's environment: the defaults for the root's libraries, which the
// request's own variables override, in a stable order.
func TestNativeEnv(t *testing.T) {
	got := strings.Join(protocol.NativeEnv(map[string]string{"MPLBACKEND": "svg", "A": "1"}), " ")
	want := "A=1 HOME=/tmp LANG=C.UTF-8 MPLBACKEND=svg MPLCONFIGDIR=/tmp/.matplotlib PATH=/usr/bin"
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}
