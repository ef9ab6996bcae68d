package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
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
	live := &liveStdout{w: w}
	a, err := b.CellStream(ctx, sb.id, wire.CellRequest{Code: req.Code}, live.output)
	s.mu.Lock()
	sb.stop = nil
	s.mu.Unlock()
	stop()
	sb.cells.Unlock()
	if err != nil && live.started {
		// Past the status line: the failure is the stream's last message.
		if gone(err) {
			s.drop(context.WithoutCancel(r.Context()), sb)
		}
		live.write(map[string]any{"type": "error", "name": "SandcellError", "value": err.Error(), "traceback": ""})
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

// liveWait bounds each write of an execution's messages: a client that stops reading
// loses its stream rather than holding the cell's output, and so the cell.
const liveWait = 2 * time.Second

// liveStdout writes an execution's messages: stdout as it comes, whole characters
// only (a chunk's last bytes of an incomplete UTF-8 sequence wait for the next), then
// the messages of the answer. sent counts the stdout bytes written.
type liveStdout struct {
	w       http.ResponseWriter
	started bool
	gone    bool
	sent    int
	pending []byte // stdout not yet written: an incomplete character
}

func (l *liveStdout) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/x-ndjson")
		l.w.WriteHeader(http.StatusOK)
	}
}

// output is the cell's observer: stdout goes out as a message at once.
func (l *liveStdout) output(stream string, data []byte) {
	if stream != "stdout" || l.gone {
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
	if n == 0 {
		return
	}
	l.start()
	if l.write(map[string]any{"type": "stdout", "text": string(l.pending[:n]), "timestamp": time.Now().UTC().Format(time.RFC3339Nano)}) {
		l.sent += n
	}
	l.pending = append(l.pending[:0], l.pending[n:]...)
}

// write sends one message, flushed; false once the client stopped reading.
func (l *liveStdout) write(m map[string]any) bool {
	if l.gone {
		return false
	}
	rc := http.NewResponseController(l.w)
	rc.SetWriteDeadline(time.Now().Add(liveWait))
	if json.NewEncoder(l.w).Encode(m) != nil || rc.Flush() != nil {
		l.gone = true
		return false
	}
	return true
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
	if at < 0 {
		at = 0
	}
	tb := strings.TrimRight(stderr[at:], "\n")
	if tb == "" {
		// sys.exit(N): no report at all.
		return stderr, map[string]any{"type": "error", "name": "SystemExit", "value": fmt.Sprint(res.ExitCode), "traceback": ""}
	}
	last := tb[strings.LastIndex(tb, "\n")+1:]
	name, value, ok := strings.Cut(last, ": ")
	if !ok {
		name, value = strings.TrimSpace(last), ""
	}
	return stderr[:at], map[string]any{"type": "error", "name": name, "value": value, "traceback": tb}
}
