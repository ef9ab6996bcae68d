package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// A sandbox's paths are its workspace's: its home and /ws, never beyond.
func TestWorkspacePath(t *testing.T) {
	for in, want := range map[string]string{
		"/home/user/data.csv": "data.csv", "data.csv": "data.csv", "~/a/b.txt": "a/b.txt", "/ws/x": "x",
		"a/../b": "b", "/home/user/a/./b": "a/b",
	} {
		if got, err := workspacePath(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/etc/passwd", "/home/user", "/home/user/../../etc/passwd", "../x", "/ws", "/home/userx/a", "/"} {
		if got, err := workspacePath(in); err == nil {
			t.Errorf("%q: %q, want an error", in, got)
		}
	}
}

// A cell's answer as the code interpreter's messages: output, the error parted from
// stderr (a traceback, a syntax error, an exit status, a limit), displays, the value.
func TestMessages(t *testing.T) {
	read := func(d protocol.Display) ([]byte, error) {
		if d.Path == "displays/bad" {
			return nil, errors.New("gone")
		}
		return []byte("<b>x</b>"), nil
	}
	answer := func(reason protocol.Reason, code int, stdout, stderr string) wire.CellAnswer {
		return wire.CellAnswer{State: wire.SessionPreserved, Session: wire.SessionView{Cells: 3},
			Result: protocol.Result{Reason: reason, ExitCode: code, Stdout: []byte(stdout), Stderr: []byte(stderr)}}
	}
	a := answer(protocol.Exited, 1, "out\n", "warned\nTraceback (most recent call last):\n  File \"<cell>\", line 1, in <module>\nZeroDivisionError: division by zero\n")
	a.Result.Displays = []protocol.Display{{Type: "text/html", Path: "displays/1.html"}, {Type: "image/png", Path: "displays/bad"}}
	m := messages(a, "now", 0, read)
	if len(m) != 6 || m[0]["text"] != "out\n" || m[1]["text"] != "warned\n" || m[2]["html"] != "<b>x</b>" ||
		!strings.Contains(m[3]["text"].(string), "gone") || m[4]["name"] != "ZeroDivisionError" ||
		m[4]["value"] != "division by zero" || !strings.HasPrefix(m[4]["traceback"].(string), "Traceback") ||
		m[5]["execution_count"] != 3 {
		t.Fatalf("%v", m)
	}
	m = messages(answer(protocol.Exited, 1, "", "  File \"<cell>\", line 1\n    1 +\n       ^\nSyntaxError: invalid syntax\n"), "now", 0, read)
	if m[0]["name"] != "SyntaxError" || m[0]["value"] != "invalid syntax" {
		t.Fatalf("%v", m)
	}
	m = messages(answer(protocol.Exited, 3, "", ""), "now", 0, read)
	if m[0]["name"] != "SystemExit" || m[0]["value"] != "3" {
		t.Fatalf("%v", m)
	}
	// An end with no report: stderr is the program's, not an exception's name.
	m = messages(answer(protocol.Exited, 137, "", "e\n"), "now", 0, read)
	if m[0]["type"] != "stderr" || m[0]["text"] != "e\n" || m[1]["name"] != "SystemExit" || m[1]["value"] != "137" {
		t.Fatalf("%v", m)
	}
	m = messages(answer(protocol.Timeout, 0, "", ""), "now", 0, read)
	if m[0]["name"] != "TimeoutError" || !strings.Contains(m[0]["value"].(string), "preserved") {
		t.Fatalf("%v", m)
	}
	v := answer(protocol.Exited, 0, "", "")
	v.Value = "42"
	if m = messages(v, "now", 0, read); len(m) != 2 || m[0]["text"] != "42" || m[0]["is_main_result"] != true {
		t.Fatalf("%v", m)
	}
}

// What a sandbox cannot have is refused at its creation, whatever its template.
func TestCreateRefuses(t *testing.T) {
	s := New(Options{Caller: func(*http.Request) (any, string, bool) { return nil, "k", true }})
	for _, body := range []string{`{"templateID":"sandcell-native","allow_internet_access":true}`,
		`{"allow_internet_access":true}`, `{"templateID":"sandcell-native","autoPause":true}`,
		`{"network":{"allowOut":["0.0.0.0/0"]}}`, `{"templateID":"mine"}`, `not json`} {
		w := httptest.NewRecorder()
		s.create(w, httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(body)))
		if w.Code != 400 || !strings.Contains(w.Body.String(), `"message"`) {
			t.Errorf("%s: %d %s", body, w.Code, w.Body)
		}
	}
}

// Stdout goes out as it comes, in whole lines and ASCII messages: a line's start
// waits for its end (a print's text and its newline come apart), a long line goes
// in whole characters (a chunk ending inside a UTF-8 sequence keeps its last bytes
// for the next); what was queued is counted, so the answer's messages carry only
// the rest; past the queue's bound, stdout stops streaming and the rest comes with
// the answer.
func TestLiveStdout(t *testing.T) {
	rec := httptest.NewRecorder()
	l := newLiveStdout(rec)
	l.output("stderr", []byte("not streamed"))
	l.output("stdout", []byte("a"))
	l.output("stdout", []byte("\n"))
	l.output("stdout", []byte("\xc3"))
	l.output("stdout", []byte("\xa9b😀\n\xe2"))
	l.output("stdout", []byte("\x82\xac"))
	long := strings.Repeat("é", liveLine/2) // liveLine bytes, no end
	l.output("stdout", []byte(long+"\xe2"))
	if !l.finish() {
		t.Fatal("the stream did not start")
	}
	if want := len("a\néb😀\n€" + long); l.sent != want {
		t.Fatalf("sent %d bytes, want %d", l.sent, want)
	}
	var texts []string
	for _, line := range strings.Split(strings.TrimSpace(rec.Body.String()), "\n") {
		for _, c := range []byte(line) {
			if c >= 0x80 {
				t.Fatalf("a line that is not ASCII: %q", line)
			}
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		texts = append(texts, m["text"].(string))
	}
	if want := []string{"a\n", "éb😀\n", "€" + long}; !slices.Equal(texts, want) {
		t.Fatalf("messages %.80q, want %.80q", texts, want)
	}
	full := wire.CellAnswer{Result: protocol.Result{Reason: protocol.Exited, Stdout: []byte("a\néb😀\n€" + long + "€")}}
	m := messages(full, "now", l.sent, func(protocol.Display) ([]byte, error) { return nil, nil })
	if m[0]["type"] != "stdout" || m[0]["text"] != "€" {
		t.Fatalf("the answer's stdout message %v, want the rest: €", m[0])
	}

	// A line's end and a long start of the next in one chunk: both go.
	tail := newLiveStdout(httptest.NewRecorder())
	tail.output("stdout", []byte("a\n"+strings.Repeat("b", liveLine)))
	tail.finish()
	if tail.sent != 2+liveLine {
		t.Fatalf("sent %d bytes of a line's end and %d of the next, want all", tail.sent, liveLine)
	}

	// Nothing printed: nothing started, the status is still the handler's to choose.
	if quiet := newLiveStdout(httptest.NewRecorder()); quiet.finish() {
		t.Fatal("a stream with no stdout started")
	}

	// A client slower than the cell: the queue is bounded, the cell never waits.
	slow := &blockingWriter{ResponseRecorder: httptest.NewRecorder(), release: make(chan struct{})}
	l = newLiveStdout(slow)
	chunk := []byte(strings.Repeat("x", 64<<10))
	for range 64 { // 4 MiB, four times the queue
		l.output("stdout", chunk)
	}
	if !l.overflow || l.sent >= 4<<20 {
		t.Fatalf("overflow %v after %d bytes queued", l.overflow, l.sent)
	}
	close(slow.release)
	l.finish()
}

// blockingWriter is a client that reads nothing until release is closed.
type blockingWriter struct {
	*httptest.ResponseRecorder
	release chan struct{}
}

func (w *blockingWriter) Write(b []byte) (int, error) {
	<-w.release
	return w.ResponseRecorder.Write(b)
}

// A sandbox's timeout: E2B's default for none, a day at most, never negative.
func TestTimeout(t *testing.T) {
	for in, want := range map[int]time.Duration{0: DefaultTimeout, 1: time.Second, 86400: MaxTimeout} {
		if got, err := timeout(in); err != nil || got != want {
			t.Errorf("timeout(%d) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []int{-1, 86401} {
		if _, err := timeout(in); err == nil {
			t.Errorf("timeout(%d) accepted", in)
		}
	}
}
