// Package client talks to a Sandcell daemon over its Unix socket (see docs/api.md, "The
// daemon"). Errors from the daemon are *wire.Problem values carrying its stable code.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// Client is a connection pool to one daemon socket.
type Client struct {
	http *http.Client
}

// New returns a client for the daemon listening on the Unix socket at path.
func New(path string) *Client { return &Client{http: HTTP(path)} }

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

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://sandcell"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 {
		p := &wire.Problem{}
		if json.Unmarshal(b, p) != nil || p.Code == "" {
			return fmt.Errorf("sandcell daemon: %s: %s", resp.Status, bytes.TrimSpace(b))
		}
		return p
	}
	return json.Unmarshal(b, out)
}
