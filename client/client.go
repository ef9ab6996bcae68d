// Package client talks to a Sandcell daemon over its Unix socket (see docs/api.md, "The
// daemon"). Errors from the daemon are *wire.Problem values carrying its stable code.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// Client is a connection pool to one daemon.
type Client struct {
	http *http.Client
}

// New returns a client for the daemon listening on the Unix socket at path.
func New(path string) *Client { return &Client{http: HTTP(path)} }

// NewHTTP returns a client that sends each request through hc (its transport
// decides where requests go; the URL's host is "sandcell").
func NewHTTP(hc *http.Client) *Client { return &Client{http: hc} }

// HTTP returns an http.Client whose every connection goes to the Unix socket at path,
// whatever host a URL names.
func HTTP(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
}

// Run submits req and waits for the run to end (unless req.Wait is false). Cancelling
// ctx closes the request, and the daemon then cancels the run.
func (c *Client) Run(ctx context.Context, req wire.RunRequest) (wire.View, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return wire.View{}, err
	}
	var v wire.View
	return v, c.do(ctx, http.MethodPost, "/v1/runs", body, &v)
}

// Get returns the run with id.
func (c *Client) Get(ctx context.Context, id string) (wire.View, error) {
	var v wire.View
	return v, c.do(ctx, http.MethodGet, "/v1/runs/"+id, nil, &v)
}

// Cancel cancels the run with id and returns its final state.
func (c *Client) Cancel(ctx context.Context, id string) (wire.View, error) {
	var v wire.View
	return v, c.do(ctx, http.MethodDelete, "/v1/runs/"+id, nil, &v)
}

// SQL runs one statement (POST /v1/sql) and returns the answer's JSON (columns,
// rows, changes, classification; see docs/api.md). A statement held for approval is
// a *wire.Problem with code approval_required and approval_id in its Extensions.
func (c *Client) SQL(ctx context.Context, req wire.SQLRequest) (json.RawMessage, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out json.RawMessage
	return out, c.do(ctx, http.MethodPost, "/v1/sql", body, &out)
}

// CreateWorkspace creates a workspace owned by the caller.
func (c *Client) CreateWorkspace(ctx context.Context) (wire.Workspace, error) {
	var w wire.Workspace
	return w, c.do(ctx, http.MethodPost, "/v1/workspaces", nil, &w)
}

// Workspace returns workspace id with a page of its names (after, limit: as
// GET /v1/workspaces/{id} takes them; "" and 0 for the first page of the default size).
func (c *Client) Workspace(ctx context.Context, id, after string, limit int) (wire.Workspace, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/workspaces/" + url.PathEscape(id)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var w wire.Workspace
	return w, c.do(ctx, http.MethodGet, path, nil, &w)
}

// ReadFile returns at most max bytes of a workspace file and its whole size.
func (c *Client) ReadFile(ctx context.Context, id, path string, max int64) ([]byte, int64, error) {
	resp, err := c.send(ctx, http.MethodGet, filesPath(id, path), nil, "")
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, max))
	return b, resp.ContentLength, err
}

// OpenFile returns a workspace file's content as it is read from the daemon, and its
// size (-1 when the daemon did not say); the caller closes it.
func (c *Client) OpenFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	resp, err := c.send(ctx, http.MethodGet, filesPath(id, path), nil, "")
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// PutFile writes a workspace file (created or replaced) from r, sent as it is read:
// nothing holds the whole file. The workspace's quota bounds it (a *wire.Problem
// quota_exceeded, and nothing written).
func (c *Client) PutFile(ctx context.Context, id, path string, r io.Reader) error {
	resp, err := c.sendReader(ctx, http.MethodPut, filesPath(id, path), r, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// WriteFile writes data as a workspace file (created or replaced).
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte) error {
	resp, err := c.send(ctx, http.MethodPut, filesPath(id, path), data, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ConfirmApproval decides the caller's own pending approval id, as the person at its
// MCP client answered (POST /v1/approvals/{id}/confirm): a *wire.Problem forbidden
// where the daemon's policy does not let this caller confirm its requests.
func (c *Client) ConfirmApproval(ctx context.Context, id string, approve bool) error {
	return c.ConfirmGrant(ctx, id, approve, 0)
}

// ConfirmGrant is ConfirmApproval for a program's tool call: approved with grant
// n > 1, it covers the run's next calls to the same tool, n in all.
func (c *Client) ConfirmGrant(ctx context.Context, id string, approve bool, n int) error {
	decision := "deny"
	if approve {
		decision = "approve"
	}
	m := map[string]any{"decision": decision}
	if approve && n > 1 {
		m["grant"] = n
	}
	body, _ := json.Marshal(m)
	var out json.RawMessage
	return c.do(ctx, http.MethodPost, "/v1/approvals/"+url.PathEscape(id)+"/confirm", body, &out)
}

// Approval returns approval id as GET /v1/approvals/{id} gives it (the caller's own,
// or any for an approver).
func (c *Client) Approval(ctx context.Context, id string) (json.RawMessage, error) {
	var out json.RawMessage
	return out, c.do(ctx, http.MethodGet, "/v1/approvals/"+url.PathEscape(id), nil, &out)
}

// Tools returns GET /v1/tools: the agent tools' definitions, and whether they are
// offered now.
func (c *Client) Tools(ctx context.Context) (json.RawMessage, error) {
	var out json.RawMessage
	return out, c.do(ctx, http.MethodGet, "/v1/tools", nil, &out)
}

// OpenSession opens an interpreter session (POST /v1/sessions).
func (c *Client) OpenSession(ctx context.Context, req wire.SessionRequest) (wire.SessionView, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return wire.SessionView{}, err
	}
	var v wire.SessionView
	return v, c.do(ctx, http.MethodPost, "/v1/sessions", body, &v)
}

// Cell runs one cell in session id (POST /v1/sessions/{id}/cells); the answer says
// what became of the session's state. A lost session is a *wire.Problem
// session_lost (410), a busy one session_busy (409).
func (c *Client) Cell(ctx context.Context, id string, req wire.CellRequest) (wire.CellAnswer, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return wire.CellAnswer{}, err
	}
	var a wire.CellAnswer
	return a, c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/cells", body, &a)
}

// CellStream is Cell with the output given to out as the worker produces it (the
// cells endpoint's server-sent events): out(stream, data), stream "stdout" or
// "stderr", in order, on the calling goroutine (a slow out slows the stream, which
// the daemon may then end: the answer holds the whole output either way). A failure
// after the output began is the *wire.Problem the stream ends with.
func (c *Client) CellStream(ctx context.Context, id string, req wire.CellRequest, out func(stream string, data []byte)) (wire.CellAnswer, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return wire.CellAnswer{}, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sandcell/v1/sessions/"+url.PathEscape(id)+"/cells", bytes.NewReader(body))
	if err != nil {
		return wire.CellAnswer{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	resp, err := c.http.Do(hr)
	if err != nil {
		return wire.CellAnswer{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return wire.CellAnswer{}, err
		}
		return wire.CellAnswer{}, problem(resp, b)
	}
	var a wire.CellAnswer
	if ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";"); ct != "text/event-stream" {
		// A daemon that answers whole (no output came before the answer).
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return a, err
		}
		return a, json.Unmarshal(b, &a)
	}
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	var event string
	var data []byte
	for {
		line, err := readLine(r, maxEventBytes)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // the stream ends with its answer
			}
			return a, fmt.Errorf("sandcell daemon: the cell's event stream: %w", err)
		}
		switch {
		case len(line) == 0: // an event's end
			switch event {
			case "stdout", "stderr":
				var chunk struct{ Data, Encoding string }
				if err := json.Unmarshal(data, &chunk); err != nil {
					return a, fmt.Errorf("sandcell daemon: a %s event: %w", event, err)
				}
				b := []byte(chunk.Data)
				if chunk.Encoding == "base64" {
					if b, err = base64.StdEncoding.DecodeString(chunk.Data); err != nil {
						return a, fmt.Errorf("sandcell daemon: a %s event: %w", event, err)
					}
				}
				out(event, b)
			case "answer":
				return a, json.Unmarshal(data, &a)
			case "error":
				return a, problem(resp, data)
			}
			event, data = "", nil
		default: // a field: "name: value" (the space optional), data lines joined by "\n"
			name, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(name) {
			case "event":
				event = string(value)
			case "data":
				if data == nil {
					data = []byte{}
				} else {
					data = append(data, '\n')
				}
				if len(data)+len(value) > maxEventBytes {
					return a, fmt.Errorf("sandcell daemon: the cell's event stream: an event of more than %d bytes", maxEventBytes)
				}
				data = append(data, value...)
			}
		}
	}
}

// maxEventBytes bounds one line of a cell's event stream: the answer's line holds
// the whole result (its output up to the cell's output limit, JSON-escaped).
const maxEventBytes = 256 << 20

// readLine reads one line without its end, of at most max bytes.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		if len(line)+len(part) > max {
			return nil, fmt.Errorf("a line of more than %d bytes", max)
		}
		line = append(line, part...)
		switch err {
		case nil:
			return bytes.TrimRight(line, "\r\n"), nil
		case bufio.ErrBufferFull:
			continue
		default:
			return nil, err
		}
	}
}

// Sessions lists the caller's sessions (GET /v1/sessions).
func (c *Client) Sessions(ctx context.Context) ([]wire.SessionView, error) {
	var out struct {
		Sessions []wire.SessionView `json:"sessions"`
	}
	return out.Sessions, c.do(ctx, http.MethodGet, "/v1/sessions", nil, &out)
}

// ForkSession makes a new session from session id's state, with a private copy of
// its workspace (POST /v1/sessions/{id}/fork).
func (c *Client) ForkSession(ctx context.Context, id string) (wire.SessionView, error) {
	var v wire.SessionView
	return v, c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/fork", nil, &v)
}

// DeleteWorkspace deletes workspace id and everything in it (DELETE
// /v1/workspaces/{id}); a *wire.Problem workspace_busy while a run or statement uses it.
func (c *Client) DeleteWorkspace(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/workspaces/"+url.PathEscape(id), nil, nil)
}

// CloseSession ends session id (DELETE /v1/sessions/{id}).
func (c *Client) CloseSession(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil, nil)
}

func filesPath(id, path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/v1/workspaces/" + url.PathEscape(id) + "/files/" + strings.Join(segs, "/")
}

// send sends a request and returns the answer when it is not a problem.
func (c *Client) send(ctx context.Context, method, path string, body []byte, contentType string) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	return c.sendReader(ctx, method, path, r, contentType)
}

// sendReader is send with the body read from r as the request goes (nil: none).
func (c *Client) sendReader(ctx context.Context, method, path string, r io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://sandcell"+path, r)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	return nil, problem(resp, b)
}

// problem decodes an error answer.
func problem(resp *http.Response, b []byte) error {
	p := &wire.Problem{}
	if json.Unmarshal(b, p) != nil || p.Code == "" {
		return fmt.Errorf("sandcell daemon: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	json.Unmarshal(b, &p.Extensions)
	for _, own := range []string{"type", "title", "status", "detail", "code"} {
		delete(p.Extensions, own)
	}
	return p
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	ct := ""
	if body != nil {
		ct = "application/json"
	}
	resp, err := c.send(ctx, method, path, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil // an answer without a body (204)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}
