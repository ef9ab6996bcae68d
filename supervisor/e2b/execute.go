package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
)

type sandboxKey struct{}

func withSandbox(ctx context.Context, sb *sandbox) context.Context {
	return context.WithValue(ctx, sandboxKey{}, sb)
}

func sandboxOf(ctx context.Context) *sandbox { return ctx.Value(sandboxKey{}).(*sandbox) }

// executeRequest is the code interpreter's POST /execute.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execute runs the request's code as a cell of the sandbox's session and answers
// E2B's stream of messages (one JSON object a line): stdout as the cell prints it,
// then, when it ends, stderr, a result per display, the main result (the last
// expression's value), the error, the count of executions. (stderr comes at the end,
// apart from the traceback E2B reports as the error, which is known only then.)
func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	var req executeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&req); err != nil {
		envdError(w, http.StatusBadRequest, "the body is not an execution request: "+err.Error())
		return
	}
	switch {
	case req.Language != "" && req.Language != "python":
		envdError(w, http.StatusBadRequest, "language "+req.Language+": a Sandcell sandbox runs Python only")
		return
	case req.ContextID != "" && req.ContextID != "default":
		envdError(w, http.StatusBadRequest, "context "+req.ContextID+": a Sandcell sandbox has one context, its session")
		return
	case len(req.EnvVars) > 0:
		envdError(w, http.StatusBadRequest, "env_vars: a cell takes none; give them when the sandbox is created (envs)")
		return
	}
	b := s.o.Backend(sb.who)
	sb.cells.Lock()
	ctx, stop := context.WithCancel(r.Context())
	s.mu.Lock()
	sb.stop = stop
	s.mu.Unlock()
	live := newLiveStdout(w)
	a, err := b.CellStream(ctx, sb.id, wire.CellRequest{Code: req.Code}, live.output)
	s.mu.Lock()
	sb.stop = nil
	s.mu.Unlock()
	stop()
	sb.cells.Unlock()
	if started := live.finish(); err != nil && started {
		// Past the status line: the failure is the stream's last message (the call
		// cannot fail any more; the execution's error says what happened).
		live.write(map[string]any{"type": "error", "name": "SandboxError", "value": "the execution ended: " + err.Error(), "traceback": ""})
		if gone(err) {
			s.drop(context.WithoutCancel(r.Context()), sb)
		}
		return
	}
	if err != nil {
		if gone(err) {
			s.drop(context.WithoutCancel(r.Context()), sb)
			envdError(w, http.StatusNotFound, "sandbox "+sb.id+" not found: its session has ended ("+err.Error()+")")
			return
		}
		backendEnvdError(w, err)
		return
	}
	if a.State == wire.SessionLost {
		// The answer says so; the sandbox ends with its state.
		defer s.drop(context.WithoutCancel(r.Context()), sb)
	}
	live.start()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	budget := int64(MaxDisplayBytes)
	for _, m := range messages(a, now, live.sent, func(d protocol.Display) ([]byte, error) {
		if d.Bytes > budget {
			return nil, fmt.Errorf("past what one answer carries of displays (%d MiB): read the file", MaxDisplayBytes>>20)
		}
		f, _, err := b.OpenFile(r.Context(), sb.workspace, d.Path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, min(budget, protocol.MaxDisplayBytes)))
		budget -= int64(len(data))
		return data, err
	}) {
		live.write(m)
	}
}

// liveQueue bounds the stdout an execution holds for a client that reads slower
// than the cell prints: past it, stdout stops streaming and the rest comes with the
// answer's messages. The cell never waits for the client.
const liveQueue = 1 << 20

// liveLine is how much of a line without its end stdout holds before it sends it
// (in whole characters).
const liveLine = 64 << 10

// liveStdout writes an execution's messages: stdout as it comes, in whole lines (a
// line past liveLine bytes in pieces of whole characters: the last bytes of an
// incomplete UTF-8 sequence wait for the next chunk), from
// a goroutine of its own fed by the cell's observer through a bounded queue; then,
// once finish has joined that goroutine, the answer's messages. Every line is ASCII
// (JSON's \u escapes), so a client that decodes each network read on its own never
// sees a character split.
type liveStdout struct {
	w    http.ResponseWriter
	mu   sync.Mutex
	wake chan struct{} // a line was queued, or the queue closed
	done chan struct{} // the writer has returned
	// Guarded by mu:
	queue    [][]byte
	queued   int
	closed   bool
	overflow bool // stdout stopped streaming
	failed   bool // a write failed: the client is gone
	writing  bool // the writer goroutine was started
	started  bool // the status line is out
	sent     int  // the stdout bytes queued as messages
	pending  []byte
}

func newLiveStdout(w http.ResponseWriter) *liveStdout {
	return &liveStdout{w: w, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// start sends the status and headers, once; only the goroutine writing (the writer,
// then the handler once finish has joined it) calls it.
func (l *liveStdout) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return
	}
	l.started = true
	h := l.w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	l.w.WriteHeader(http.StatusOK)
}

// output is the cell's observer: stdout is queued as a message at once.
func (l *liveStdout) output(stream string, data []byte) {
	if stream != "stdout" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.overflow || l.failed || l.closed {
		return
	}
	l.pending = append(l.pending, data...)
	n := len(l.pending)
	for i := 1; i <= min(n, utf8.UTFMax); i++ { // hold back an incomplete last character
		if utf8.RuneStart(l.pending[n-i]) {
			if !utf8.FullRune(l.pending[n-i:]) {
				n -= i
			}
			break
		}
	}
	// Whole lines, as E2B's code interpreter gives them (its kernel's stream sends
	// what a flush wrote; a print's text and its newline reach the pipe apart): the
	// rest of a line waits for its end, or for liveLine bytes of it. What pending
	// held before data has no newline (it was sent up to its last), so only data
	// is searched.
	end := 0 // after the last newline
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		end = len(l.pending) - len(data) + i + 1
	}
	if n-end < liveLine {
		n = end
	}
	if n == 0 {
		return
	}
	line := ndjson(map[string]any{"type": "stdout", "text": string(l.pending[:n]), "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	if l.queued+len(line) > liveQueue {
		l.overflow = true
		return
	}
	if !l.writing {
		l.writing = true
		go l.writer()
	}
	l.queue = append(l.queue, line)
	l.queued += len(line)
	l.sent += n
	l.pending = append(l.pending[:0], l.pending[n:]...)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// writer writes the queued lines until the queue is closed and empty.
func (l *liveStdout) writer() {
	defer close(l.done)
	l.start()
	rc := http.NewResponseController(l.w)
	for {
		l.mu.Lock()
		lines, closed := l.queue, l.closed
		l.queue, l.queued = nil, 0
		l.mu.Unlock()
		for _, line := range lines {
			if _, err := l.w.Write(line); err != nil {
				l.mu.Lock()
				l.failed = true
				l.mu.Unlock()
				return
			}
		}
		if len(lines) > 0 && rc.Flush() != nil {
			l.mu.Lock()
			l.failed = true
			l.mu.Unlock()
			return
		}
		if closed && len(lines) == 0 {
			return
		}
		if !closed {
			<-l.wake
		}
	}
}

// finish stops the queue and waits for the writer to have written it; it reports
// whether the status line is out.
func (l *liveStdout) finish() bool {
	l.mu.Lock()
	l.closed = true
	writing := l.writing
	l.mu.Unlock()
	if writing {
		select {
		case l.wake <- struct{}{}:
		default:
		}
		<-l.done
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started
}

// write sends one message, flushed, after finish; false once the client is gone.
func (l *liveStdout) write(m map[string]any) bool {
	l.mu.Lock()
	failed := l.failed
	l.mu.Unlock()
	if failed {
		return false
	}
	if _, err := l.w.Write(ndjson(m)); err != nil || http.NewResponseController(l.w).Flush() != nil {
		l.mu.Lock()
		l.failed = true
		l.mu.Unlock()
		return false
	}
	return true
}

// ndjson is m as one line of JSON in ASCII: every other character as its \u escape
// (a pair of them past U+FFFF). Outside its strings JSON is ASCII already.
func ndjson(m map[string]any) []byte {
	b, _ := json.Marshal(m)
	out := make([]byte, 0, len(b)+1)
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			out = append(out, b[i])
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		i += size
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return append(out, '\n')
}

// messages turns a cell's answer into the code interpreter's messages, stdout's from
// byte sent on (what was not written as it came). read returns a display's file.
func messages(a wire.CellAnswer, now string, sent int, read func(protocol.Display) ([]byte, error)) []map[string]any {
	var out []map[string]any
	res := a.Result.Joined()
	stdout, stderr := res.Stdout, res.Stderr
	if len(stdout) > sent {
		out = append(out, map[string]any{"type": "stdout", "text": string(stdout[sent:]), "timestamp": now})
	}
	logs, errMsg := splitError(res, string(stderr), a.State)
	if res.StdoutTruncated || res.StderrTruncated {
		logs += fmt.Sprintf("sandcell: the cell's output was cut at its limit (stdout %d bytes, stderr %d bytes kept)\n",
			len(stdout), len(stderr))
	}
	if logs != "" {
		out = append(out, map[string]any{"type": "stderr", "text": logs, "timestamp": now})
	}
	for _, d := range res.Displays {
		m := map[string]any{"type": "result", "is_main_result": false}
		data, err := read(d)
		switch {
		case err != nil:
			m["text"] = fmt.Sprintf("<%s display %s: %v>", d.Type, d.Path, err)
		case d.Type == "image/png":
			m["png"] = base64.StdEncoding.EncodeToString(data)
		case d.Type == "image/svg+xml":
			m["svg"] = string(data)
		case d.Type == "text/html":
			m["html"] = string(data)
		case d.Type == "application/json":
			var v any
			if json.Unmarshal(data, &v) == nil {
				m["json"] = v
			} else {
				m["text"] = string(data)
			}
		default:
			m["text"] = string(data)
		}
		out = append(out, m)
	}
	if a.Value != "" {
		out = append(out, map[string]any{"type": "result", "text": a.Value, "is_main_result": true})
	}
	if errMsg != nil {
		out = append(out, errMsg)
	}
	return append(out, map[string]any{"type": "number_of_executions", "execution_count": a.Session.Cells})
}

// splitError separates a cell's error from its stderr: the traceback of an uncaught
// exception (its last line "Name: value"), or the limit that stopped the cell. It
// returns the rest of stderr and the error message (nil: none).
func splitError(res protocol.Result, stderr string, state wire.SessionState) (string, map[string]any) {
	if res.Reason != protocol.Exited {
		name := map[protocol.Reason]string{protocol.Timeout: "TimeoutError", protocol.CPULimit: "TimeoutError",
			protocol.MemoryLimit: "MemoryError", protocol.Cancelled: "KeyboardInterrupt"}[res.Reason]
		if name == "" {
			name = "SandcellLimitError"
		}
		return stderr, map[string]any{"type": "error", "name": name,
			"value": fmt.Sprintf("the cell was stopped (%s); the session's state: %s", res.Reason, state), "traceback": ""}
	}
	if res.ExitCode == 0 {
		return stderr, nil
	}
	at := strings.LastIndex(stderr, "Traceback (most recent call last):\n")
	if at < 0 {
		// A syntax error has no traceback header: its report starts at its File line.
		at = strings.LastIndex(stderr, "  File \"")
	}
	tb := ""
	if at >= 0 {
		tb = strings.TrimRight(stderr[at:], "\n")
	}
	if tb == "" {
		// sys.exit(N), or an end with no report (stderr is the program's own, kept).
		return stderr, map[string]any{"type": "error", "name": "SystemExit", "value": fmt.Sprint(res.ExitCode), "traceback": ""}
	}
	last := tb[strings.LastIndex(tb, "\n")+1:]
	name, value, ok := strings.Cut(last, ": ")
	if !ok {
		name, value = strings.TrimSpace(last), ""
	}
	return stderr[:at], map[string]any{"type": "error", "name": name, "value": value, "traceback": tb}
}
