package sandbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// testTools offers demo.echo (returns its arguments), demo.hold (holds the run's
// clock for hold_ms, as a call waiting for a person does, then answers) and
// demo.fail (ToolError), demo.big, demo.bad and demo.panic (see
// TestToolCallsAtTheirBounds); it counts the calls it is given.
type testTools struct{ calls atomic.Int64 }

func (tt *testTools) Call(ctx context.Context, c protocol.ToolCall, clock sandbox.Clock) protocol.ToolAnswer {
	if c.List {
		return protocol.ToolAnswer{Tools: []protocol.ToolSpec{
			{Name: "demo.echo", Description: "Return the arguments.", InputSchema: json.RawMessage(
				`{"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer"}},"required":["text"]}`)},
			{Name: "demo.hold", Description: "Wait, with the run's clock held.", Writes: true, InputSchema: json.RawMessage(
				`{"type":"object","properties":{"hold_ms":{"type":"integer"}},"required":["hold_ms"]}`)},
			{Name: "demo.fail", Description: "Fail."},
			{Name: "demo.big", Description: "4 MiB of text."},
			{Name: "demo.bad", Description: "An answer that is not JSON."},
			{Name: "demo.panic", Description: "Panic."},
		}}
	}
	tt.calls.Add(1)
	var args struct {
		HoldMS int `json:"hold_ms"`
	}
	switch c.Tool {
	case "demo.echo":
		return protocol.ToolAnswer{Result: c.Arguments}
	case "demo.hold":
		_ = json.Unmarshal(c.Arguments, &args)
		release := clock.Hold()
		defer release()
		select {
		case <-time.After(time.Duration(args.HoldMS) * time.Millisecond):
		case <-ctx.Done():
			return protocol.ToolAnswer{Error: &protocol.ToolError{Class: protocol.ToolErrorFailed, Message: "ended"}}
		}
		return protocol.ToolAnswer{Result: json.RawMessage(`"held"`)}
	case "demo.fail":
		return protocol.ToolAnswer{Error: &protocol.ToolError{Class: protocol.ToolErrorFailed, Message: "the tool failed"}}
	case "demo.big": // 4 MiB of text
		return protocol.ToolAnswer{Result: json.RawMessage(`"` + strings.Repeat("y", 4<<20) + `"`)}
	case "demo.bad": // not JSON
		return protocol.ToolAnswer{Result: json.RawMessage(`{not json`)}
	case "demo.panic":
		panic("a Tools that panics")
	}
	return protocol.ToolAnswer{Error: &protocol.ToolError{Class: protocol.ToolErrorDenied, Message: "no tool " + c.Tool}}
}

// runWithTools runs code on backend with t answering its tool calls.
func runWithTools(t *testing.T, backend, code string, tools sandbox.Tools, edit func(*protocol.Request)) protocol.Result {
	t.Helper()
	var req protocol.Request
	if backend == protocol.BackendNative {
		req = nativeRequest(t, code, nil)
	} else {
		req = protocol.Request{Code: code, Workspace: t.TempDir()}
		limits, err := policy.Default().Resolve(req.Limits)
		if err != nil {
			t.Fatal(err)
		}
		req.Limits = limits
		req.Hardening = policy.Default().Hardening(limits)
		req.ModulePath = bundletest.Module(t, false)
		req.LibDir = bundletest.LibDir(t)
	}
	if edit != nil {
		edit(&req)
	}
	ctx := context.Background()
	if tools != nil {
		ctx = sandbox.WithTools(ctx, tools)
	}
	res, err := sandbox.NewSpawner().Run(ctx, req)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return res
}

const toolsProgram = `
import sandcell.tools as tools
from sandcell.tools import demo, ToolError, ToolDenied
tools.help()
print(demo.echo("hi", n=2))
print(demo.echo(text="kw"))
try:
    demo.fail()
except ToolError as e:
    print(type(e).__name__, e)
try:
    tools.nope
except AttributeError as e:
    print("AttributeError", e)
print([s["name"] for s in tools.list()])
print(demo.echo.__doc__.splitlines()[0])
`

func TestToolCalls(t *testing.T) {
	for _, backend := range []string{protocol.BackendWasm, protocol.BackendNative} {
		t.Run(backend, func(t *testing.T) {
			tt := &testTools{}
			res := runWithTools(t, backend, toolsProgram, tt, nil)
			out := string(res.Stdout)
			if res.Reason != protocol.Exited || res.ExitCode != 0 {
				t.Fatalf("%s %d: %s %s %v", res.Reason, res.ExitCode, out, res.Stderr, res.Diagnostics)
			}
			for _, want := range []string{
				"demo.echo  Return the arguments.", "demo.hold [writes]  Wait",
				"{'text': 'hi', 'n': 2}\n", "{'text': 'kw'}\n",
				"ToolError the tool failed\n",
				"AttributeError sandcell.tools offers no 'nope'",
				"['demo.echo', 'demo.hold', 'demo.fail', 'demo.big', 'demo.bad', 'demo.panic']",
				"Return the arguments.\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if n := tt.calls.Load(); n != 3 {
				t.Errorf("the tools were called %d times, want 3", n)
			}
		})
	}
}

// A run given no tools lists none and is denied every call.
func TestToolCallsWithoutTools(t *testing.T) {
	for _, backend := range []string{protocol.BackendWasm, protocol.BackendNative} {
		t.Run(backend, func(t *testing.T) {
			res := runWithTools(t, backend, `
import sandcell.tools as tools
tools.help()
try:
    tools.demo
except AttributeError:
    print("none")
import json
from sandcell.tools import ToolDenied
`, nil, nil)
			if out := string(res.Stdout); res.ExitCode != 0 || out != "No tools are offered to this run.\nnone\n" {
				t.Fatalf("%s %d: %q %s", res.Reason, res.ExitCode, out, res.Stderr)
			}
		})
	}
}

// The run's wall clock does not run while a call holds it (a call waiting for a
// person): a run whose limit is 1.5 s makes a call that holds it for 2 s and ends by
// itself; one that sleeps as long is stopped at its limit.
func TestToolCallHoldsTheClock(t *testing.T) {
	for _, backend := range []string{protocol.BackendWasm, protocol.BackendNative} {
		t.Run(backend, func(t *testing.T) {
			limit := func(r *protocol.Request) { r.Limits.TimeoutMS = 1500 }
			res := runWithTools(t, backend, "from sandcell.tools import demo\nprint(demo.hold(2000))", &testTools{}, limit)
			if res.Reason != protocol.Exited || string(res.Stdout) != "held\n" {
				t.Fatalf("%s: %q %s %v", res.Reason, res.Stdout, res.Stderr, res.Diagnostics)
			}
			res = runWithTools(t, backend, "import time\ntime.sleep(2)\nprint('woke')", &testTools{}, limit)
			if res.Reason != protocol.Timeout {
				t.Fatalf("a run sleeping past its limit ended %s: %q", res.Reason, res.Stdout)
			}
		})
	}
}

// Calls are made one at a time: a second thread's call while one is in progress is
// refused with ToolError (native: the wasm guest has one thread).
func TestToolCallsOneAtATime(t *testing.T) {
	res := runWithTools(t, protocol.BackendNative, `
import threading, time
from sandcell.tools import demo, ToolError
out = []
a = threading.Thread(target=lambda: out.append(demo.hold(500)))
a.start()
time.sleep(0.2)
try:
    demo.echo("second")
except ToolError as e:
    print("refused:", e)
a.join()
print(out, demo.echo("after"))
`, &testTools{}, nil)
	out := string(res.Stdout)
	if res.ExitCode != 0 || !strings.Contains(out, "refused: a tool call is already in progress") ||
		!strings.Contains(out, "['held'] {'text': 'after'}") {
		t.Fatalf("%s %d: %s %s", res.Reason, res.ExitCode, out, res.Stderr)
	}
}

// A native guest writes on the channel itself: a frame claiming more than a call
// may carry is read past and answered ToolLimit, garbage ToolError, and the channel
// goes on serving; arguments past the bound are refused in the guest already.
func TestToolChannelForgedFrames(t *testing.T) {
	tt := &testTools{}
	res := runWithTools(t, protocol.BackendNative, `
import json, os, stat
from sandcell.tools import demo, ToolLimit
demo  # (the module has listed its tools: the runner's descriptor is in use)
fd = [n for n in range(10, 64) if os.path.exists("/proc/self/fd/%d" % n) and stat.S_ISSOCK(os.fstat(n).st_mode)][-1]
def frame(body):
    os.write(fd, len(body).to_bytes(4, "big"))
    while body:
        body = body[os.write(fd, body[:1 << 16]):]
    n = int.from_bytes(os.read(fd, 4), "big")
    b = b""
    while len(b) < n:
        b += os.read(fd, n - len(b))
    return json.loads(b)["answer"]["error"]["class"]
print(frame(b"x" * (9 << 20)))
print(frame(b"not json"))
print(frame(b'{"version":9,"step":"report"}'))
try:
    demo.echo("x" * (9 << 20))
except ToolLimit as e:
    print("ToolLimit")
print(demo.echo("still"))
`, tt, nil)
	if out := string(res.Stdout); res.ExitCode != 0 || out != "ToolLimit\nToolError\nToolError\nToolLimit\n{'text': 'still'}\n" {
		t.Fatalf("%s %d: %q %s", res.Reason, res.ExitCode, out, res.Stderr)
	}
	if n := tt.calls.Load(); n != 1 {
		t.Errorf("the tools were called %d times, want 1", n)
	}
}

// A session's cells call tools as runs do, each with its own cell's Tools: a cell
// given none is denied; a cell cancelled while it waits in a call ends cancelled and
// rolled back, and the next cell's call gets its own answer, not the ended one's.
func TestToolCallsInSessions(t *testing.T) {
	for _, backend := range []string{protocol.BackendWasm, protocol.BackendNative} {
		t.Run(backend, func(t *testing.T) {
			var ss *sandbox.Session
			if backend == protocol.BackendNative {
				ss = openNativeSession(t)
			} else {
				ss, _ = openSession(t)
			}
			tt := &testTools{}
			limits, _ := policy.Default().Resolve(protocol.Limits{})
			run := func(ctx context.Context, code string) sandbox.Cell {
				t.Helper()
				res, err := ss.Run(ctx, protocol.Request{Code: code, Limits: limits})
				if err != nil {
					t.Fatalf("cell %q: %v", code, err)
				}
				return res
			}
			with := sandbox.WithTools(context.Background(), tt)
			c := run(with, "from sandcell.tools import demo, ToolDenied\nx = demo.echo('one')\nprint(x)")
			if string(c.Stdout) != "{'text': 'one'}\n" {
				t.Fatalf("first cell: %s %q %s", c.Reason, c.Stdout, c.Stderr)
			}
			c = run(context.Background(), "try:\n    demo.echo('two')\nexcept ToolDenied as e:\n    print('denied:', e)")
			if string(c.Stdout) != "denied: no tools are offered to this run\n" {
				t.Fatalf("a cell without tools: %s %q %s", c.Reason, c.Stdout, c.Stderr)
			}
			ctx, cancel := context.WithCancel(with)
			time.AfterFunc(500*time.Millisecond, cancel)
			c = run(ctx, "x = 'changed'\ndemo.hold(60000)\nprint('not here')")
			if c.Reason != protocol.Cancelled || !c.RolledBack {
				t.Fatalf("a cell cancelled in a call: %s, rolled back %v: %q %s %v", c.Reason, c.RolledBack, c.Stdout, c.Stderr, c.Diagnostics)
			}
			c = run(with, "print(x, demo.echo('three'))")
			if string(c.Stdout) != "{'text': 'one'} {'text': 'three'}\n" {
				t.Fatalf("after the cancelled cell: %s %q %s", c.Reason, c.Stdout, c.Stderr)
			}
		})
	}
}

// What a hostile review found: a call at the channel's bound is answered, not
// left waiting; "<" is one byte each way; an answer that is not JSON, and a Tools
// that panics, are ToolErrors, and the channel goes on.
func TestToolCallsAtTheirBounds(t *testing.T) {
	for _, backend := range []string{protocol.BackendWasm, protocol.BackendNative} {
		t.Run(backend, func(t *testing.T) {
			res := runWithTools(t, backend, `
import json
from sandcell.tools import demo, ToolError, ToolLimit
n = (8 << 20) - len(json.dumps({"tool": "demo.echo", "arguments": {"text": ""}}))
for k in (n - 4096, n - 4000, n - 1, n + 10):
    try:
        print(len(demo.echo("x" * k)["text"]) == k)
    except ToolLimit as e:
        print("ToolLimit")
print(demo.echo("<" * 10)["text"])
for f in (demo.bad, demo.panic):
    try:
        f()
    except ToolError as e:
        print(type(e).__name__, e)
print(len(demo.big()))
`, &testTools{}, func(r *protocol.Request) { r.Limits.TimeoutMS = 20000 })
			want := "True\nToolLimit\nToolLimit\nToolLimit\n<<<<<<<<<<\n" +
				"ToolError the tool's answer could not be sent (it is not JSON)\n" +
				"ToolError the call failed in the daemon\n4194304\n"
			if out := string(res.Stdout); res.Reason != protocol.Exited || out != want {
				t.Fatalf("%s: %q\n%s", res.Reason, out, res.Stderr)
			}
		})
	}
}

// A native session's cell that ends (rolled back) with a call or an answer half
// sent leaves the channel in step: the next cell's calls are answered.
func TestToolChannelAfterARollback(t *testing.T) {
	ss := openNativeSession(t)
	tt := &testTools{}
	limits, _ := policy.Default().Resolve(protocol.Limits{})
	run := func(code string, timeoutMS int64) sandbox.Cell {
		t.Helper()
		l := limits
		if timeoutMS > 0 {
			l.TimeoutMS = timeoutMS
		}
		res, err := ss.Run(sandbox.WithTools(context.Background(), tt), protocol.Request{Code: code, Limits: l})
		if err != nil {
			t.Fatalf("cell %q: %v", code, err)
		}
		return res
	}
	if c := run("from sandcell.tools import demo\nimport os, stat, time, json\nprint(demo.echo('one'))", 0); string(c.Stdout) != "{'text': 'one'}\n" {
		t.Fatalf("first cell: %s %q %s", c.Reason, c.Stdout, c.Stderr)
	}
	fd := "[n for n in range(10, 64) if os.path.exists('/proc/self/fd/%d' % n) and stat.S_ISSOCK(os.fstat(n).st_mode)][-1]"
	for name, code := range map[string]string{
		"a call half written": "fd = " + fd + "\nos.write(fd, (200).to_bytes(4, 'big') + b'{\"version\":9')\ntime.sleep(60)",
		"an answer half read": "fd = " + fd + "\nb = json.dumps({'version': 9, 'step': 'tool_call', 'call': {'tool': 'demo.big', 'id': 5}}).encode()\n" +
			"os.write(fd, len(b).to_bytes(4, 'big') + b)\nos.read(fd, 1000)\ntime.sleep(60)",
	} {
		if c := run(code, 1500); c.Reason != protocol.Timeout || !c.RolledBack {
			t.Fatalf("%s: %s, rolled back %v: %s %v", name, c.Reason, c.RolledBack, c.Stderr, c.Diagnostics)
		}
		if c := run("print(demo.echo('after'))", 5000); string(c.Stdout) != "{'text': 'after'}\n" {
			t.Fatalf("after %s: %s %q %s", name, c.Reason, c.Stdout, c.Stderr)
		}
	}
}
