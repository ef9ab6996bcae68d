package toolbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/config"
)

// connectTimeout bounds starting a server and listing its tools.
const connectTimeout = 30 * time.Second

// envelope is what an MCP message carries besides a result's own bytes: a stdio
// line longer than ResultBytes plus this is refused before it is read whole.
const envelope = 64 << 10

// tool is one tool a source offers, as the guest sees it and as the server names it.
type tool struct {
	spec   protocol.ToolSpec // Name is SOURCE.TOOL
	server string            // the server's own name for it
}

// source is one [tools.NAME]: an MCP server, connected when first needed and again
// after it failed (crashed, hung up, answered what could not be read).
type source struct {
	name string
	cfg  config.Tool // with its defaults

	mu    sync.Mutex
	sess  *mcp.ClientSession
	cmd   *exec.Cmd // a stdio server's process
	tools []tool
	err   error // the last connection's failure
}

func newSource(name string, cfg config.Tool) *source {
	return &source{name: name, cfg: cfg.WithDefaults()}
}

// session returns the source's MCP session and its tools, connecting first if
// needed.
func (s *source) session(ctx context.Context) (*mcp.ClientSession, []tool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Path != "" {
		// A database: nothing to connect to; its one tool, query.
		if s.tools == nil {
			s.tools = databaseTools(s.name, s.cfg.Writable)
		}
		return nil, s.tools, nil
	}
	if s.sess != nil {
		return s.sess, s.tools, nil
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := s.connect(ctx); err != nil {
		s.err = err
		s.closeLocked()
		return nil, nil, err
	}
	s.err = nil
	return s.sess, s.tools, nil
}

// connect starts (stdio) or reaches (HTTP) the server, initialises a session and
// lists its tools; s.mu is held.
func (s *source) connect(ctx context.Context) error {
	var transport mcp.Transport
	if len(s.cfg.Command) > 0 {
		cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range s.cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		// Its own process group, killed whole with the daemon or the source; its
		// stderr is the daemon's (the journal).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", s.cfg.Command[0], err)
		}
		s.cmd = cmd
		go cmd.Wait() //nolint:errcheck // reaped; its end is the session's
		transport = &mcp.IOTransport{Reader: stdout, Writer: stdin, MaxLineLength: int(s.cfg.ResultBytes) + envelope}
	} else {
		token := ""
		if s.cfg.TokenFile != "" {
			b, err := os.ReadFile(s.cfg.TokenFile)
			if err != nil {
				return fmt.Errorf("read the token: %w", err)
			}
			token = strings.TrimSpace(string(b))
		}
		transport = &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, MaxRetries: -1, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{Transport: &bounded{token: token, max: s.cfg.ResultBytes + envelope}}}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "sandcell", Version: "1"}, nil)
	sess, err := client.Connect(ctx, transport, nil)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	s.sess = sess
	var tools []tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("list its tools: %w", err)
		}
		if len(s.cfg.Allow) > 0 && !slices.Contains(s.cfg.Allow, t.Name) {
			continue
		}
		schema, _ := json.Marshal(t.InputSchema)
		readOnly := t.Annotations != nil && t.Annotations.ReadOnlyHint
		writes := !readOnly
		switch {
		case slices.Contains(s.cfg.Writes, t.Name):
			writes = true
		case slices.Contains(s.cfg.Reads, t.Name):
			writes = false
		}
		tools = append(tools, tool{server: t.Name, spec: protocol.ToolSpec{Name: s.name + "." + identifier(t.Name),
			Description: t.Description, InputSchema: schema, Writes: writes}})
	}
	s.tools = tools
	return nil
}

// call calls the server's tool with args (a JSON object) within the source's
// timeout, and returns its result as the guest gets it (see result), or an error
// the guest raises as ToolError. A call that fails the connection (the server
// crashed, hung up, or answered past the bound) closes the session: the next call
// connects again.
func (s *source) call(ctx context.Context, sess *mcp.ClientSession, name string, args json.RawMessage) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout.Duration)
	defer cancel()
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer within %s", s.cfg.Timeout.Duration)
		}
		var rpc *jsonrpc.Error
		if !errors.As(err, &rpc) {
			s.drop(sess) // the connection, not the tool (a hang, a crash): start again
		}
		return nil, err
	}
	out, err := result(res)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// result is a tool's result as the guest gets it: its structured content where it
// has one; else its one text content, parsed where it is JSON, else as a string;
// else its content list. A result marked an error is an error with its text.
func result(res *mcp.CallToolResult) (json.RawMessage, error) {
	var texts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			texts = append(texts, t.Text)
		}
	}
	if res.IsError {
		msg := strings.Join(texts, "\n")
		if msg == "" {
			msg = "the tool reported an error"
		}
		return nil, errors.New(msg)
	}
	if res.StructuredContent != nil {
		return json.Marshal(res.StructuredContent)
	}
	if len(res.Content) == 1 && len(texts) == 1 {
		if json.Valid([]byte(texts[0])) {
			return json.RawMessage(texts[0]), nil
		}
		return json.Marshal(texts[0])
	}
	return json.Marshal(res.Content)
}

// drop closes sess if it is still the source's (a failed call's), so that the
// next call connects again.
func (s *source) drop(sess *mcp.ClientSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == sess {
		s.closeLocked()
	}
}

// close ends the source's session and its server's process.
func (s *source) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked()
}

func (s *source) closeLocked() {
	if s.sess != nil {
		go s.sess.Close() //nolint:errcheck // a hung server must not hold the caller
		s.sess = nil
	}
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		s.cmd = nil
	}
	s.tools = nil
}

// identifier is name with every character but ASCII letters, digits and '_' made
// '_', and a leading digit prefixed with '_' (a Python identifier).
func identifier(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' {
		b = append([]byte("t_"), b...)
	}
	return string(b)
}

// bounded is an HTTP client's transport for a streamable HTTP server: it adds the
// bearer token and refuses a response body past max bytes (the read fails) instead
// of reading it whole.
type bounded struct {
	token string
	max   int64
}

func (b *bounded) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.token != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	res.Body = &limitedBody{r: res.Body, left: b.max}
	return res, nil
}

type limitedBody struct {
	r    io.ReadCloser
	left int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errors.New("the server's answer is larger than the source's result_bytes")
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedBody) Close() error { return l.r.Close() }
