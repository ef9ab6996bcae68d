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

// connectTimeout bounds starting a server and listing its tools; a failed
// connection is not tried again for retryAfter (its error answers meanwhile), so a
// server that does not start costs one attempt a while, not one a call.
const (
	connectTimeout = 15 * time.Second
	retryAfter     = 10 * time.Second
)

// The most tools a source's listing may hold (a server paging without end is
// refused, never held), and the most bytes of a tool's description and schema.
const (
	maxTools         = 512
	maxToolSpecBytes = 64 << 10
	maxListingPages  = 64
)

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
	err   error     // the last connection's failure,
	at    time.Time // at this time
	// connecting is closed when the connection under way ends (nil: none).
	connecting chan struct{}
	// closed: the source was reloaded away or the daemon stops; it connects no
	// more. active counts the calls under way, the last of which closes it.
	closed bool
	active int
}

func newSource(name string, cfg config.Tool) *source {
	return &source{name: name, cfg: cfg.WithDefaults()}
}

// session returns the source's MCP session and its tools, connecting first if
// needed (one connection at a time; the lock is not held while it is made), or the
// last failure's error while it is recent.
func (s *source) session(ctx context.Context) (*mcp.ClientSession, []tool, error) {
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return nil, nil, errors.New("the source was reloaded or is closing")
		case s.cfg.Path != "":
			// A database: nothing to connect to; its one tool, query.
			if s.tools == nil {
				s.tools = databaseTools(s.name, s.cfg.Writable)
			}
			defer s.mu.Unlock()
			return nil, s.tools, nil
		case s.sess != nil:
			defer s.mu.Unlock()
			return s.sess, s.tools, nil
		case s.err != nil && time.Since(s.at) < retryAfter:
			defer s.mu.Unlock()
			return nil, nil, s.err
		case s.connecting != nil:
			wait := s.connecting
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		s.connecting = done
		s.mu.Unlock()

		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connectTimeout)
		c, err := s.connect(cctx)
		cancel()
		s.mu.Lock()
		s.connecting = nil
		close(done)
		if err == nil && s.closed {
			err = errors.New("the source was reloaded or is closing")
		}
		if err != nil {
			s.err, s.at = err, time.Now()
			c.close()
			s.mu.Unlock()
			return nil, nil, err
		}
		s.sess, s.cmd, s.tools, s.err = c.sess, c.cmd, c.tools, nil
		s.mu.Unlock()
	}
}

// conn is one connection to a source's server, while it is made.
type conn struct {
	sess  *mcp.ClientSession
	cmd   *exec.Cmd
	tools []tool
}

// close ends the connection and the server's process group.
func (c conn) close() {
	if c.sess != nil {
		go c.sess.Close() //nolint:errcheck // a hung server must not hold the caller
	}
	if c.cmd != nil && c.cmd.Process != nil {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// connect starts (stdio) or reaches (HTTP) the server, initialises a session and
// lists its tools (at most maxTools); what it made so far is in the conn even when
// it fails, for the caller to close.
func (s *source) connect(ctx context.Context) (conn, error) {
	var c conn
	var transport mcp.Transport
	if len(s.cfg.Command) > 0 {
		cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range s.cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		// Its own process group, killed whole when the source ends or the daemon
		// stops; a daemon killed closes its stdin, on which an MCP stdio server
		// ends. (No parent-death signal: Linux sends it when the thread that
		// started the server ends, which the Go runtime may do at any time.) Its
		// stderr is the daemon's (the journal).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return c, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return c, err
		}
		if err := cmd.Start(); err != nil {
			return c, fmt.Errorf("start %s: %w", s.cfg.Command[0], err)
		}
		c.cmd = cmd
		go cmd.Wait() //nolint:errcheck // reaped; its end is the session's
		transport = &mcp.IOTransport{Reader: stdout, Writer: stdin, MaxLineLength: int(s.cfg.ResultBytes) + envelope}
	} else {
		token := ""
		if s.cfg.TokenFile != "" {
			b, err := os.ReadFile(s.cfg.TokenFile)
			if err != nil {
				return c, fmt.Errorf("read the token: %w", err)
			}
			token = strings.TrimSpace(string(b))
		}
		transport = &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, MaxRetries: -1, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{Transport: &bounded{token: token, max: s.cfg.ResultBytes + envelope},
				// The token is the configured server's alone: no redirect is followed.
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "sandcell", Version: "1"}, nil)
	sess, err := client.Connect(ctx, transport, nil)
	if err != nil {
		return c, fmt.Errorf("connect: %w", err)
	}
	c.sess = sess
	seen := map[string]bool{}
	var cursor string
	for page := 0; ; page++ {
		if page == maxListingPages {
			return c, fmt.Errorf("its tool listing goes on past %d pages", maxListingPages)
		}
		res, err := sess.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
		if err != nil {
			return c, fmt.Errorf("list its tools: %w", err)
		}
		for _, t := range res.Tools {
			if len(c.tools) == maxTools {
				return c, fmt.Errorf("it lists more than %d tools", maxTools)
			}
			if t == nil || len(s.cfg.Allow) > 0 && !slices.Contains(s.cfg.Allow, t.Name) {
				continue
			}
			schema, _ := json.Marshal(t.InputSchema)
			if len(schema)+len(t.Description) > maxToolSpecBytes {
				return c, fmt.Errorf("its tool %q is described in more than %d bytes", t.Name, maxToolSpecBytes)
			}
			name := identifier(t.Name)
			if seen[name] {
				continue // two of its names are one Python name: the first is offered
			}
			seen[name] = true
			readOnly := t.Annotations != nil && t.Annotations.ReadOnlyHint
			writes := !readOnly
			switch {
			case slices.Contains(s.cfg.Writes, t.Name):
				writes = true
			case slices.Contains(s.cfg.Reads, t.Name):
				writes = false
			}
			c.tools = append(c.tools, tool{server: t.Name, spec: protocol.ToolSpec{Name: s.name + "." + name,
				Description: t.Description, InputSchema: schema, Writes: writes}})
		}
		if res.NextCursor == "" {
			return c, nil
		}
		cursor = res.NextCursor
	}
}

// call calls the server's tool with args (a JSON object) within the source's
// timeout, and returns its result as the guest gets it (see result), or an error
// the guest raises as ToolError. A call that fails the connection (the server
// crashed, hung up, or answered past the bound) closes the session: the next call
// connects again.
func (s *source) call(ctx context.Context, sess *mcp.ClientSession, name string, args json.RawMessage) (json.RawMessage, error) {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
	defer s.done()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout.Duration)
	defer cancel()
	res, err := sess.CallTool(cctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		var rpc *jsonrpc.Error
		switch {
		case ctx.Err() != nil:
			// The run ended: its request is given up, the connection kept (other
			// runs' calls are on it).
			return nil, err
		case cctx.Err() != nil:
			err = fmt.Errorf("no answer within %s", s.cfg.Timeout.Duration)
			s.drop(sess) // the server hangs: start it again
		case !errors.As(err, &rpc):
			s.drop(sess) // the connection failed (a crash, garbage): start again
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

// close ends the source (reloaded away, or the daemon stops): it connects no more,
// and its session and server end now, or with the last call under way.
func (s *source) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.active == 0 {
		s.closeLocked()
	}
}

// kill ends the source's session and server now, calls under way or not.
func (s *source) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.closeLocked()
}

// done ends a call: the last one of a closed source closes it.
func (s *source) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.closed && s.active == 0 {
		s.closeLocked()
	}
}

func (s *source) closeLocked() {
	conn{sess: s.sess, cmd: s.cmd}.close()
	s.sess, s.cmd = nil, nil
	if s.cfg.Path == "" {
		s.tools = nil
	}
}

// identifier is name as a Python name: every character but ASCII letters, digits
// and '_' made '_', and "t_" before one that would begin with a digit or '_' (no
// dunder name, which the guest's module could not hold), or be empty.
func identifier(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' || b[0] == '_' {
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
