// Package e2b serves the part of E2B's API and sandbox protocol that E2B's own SDKs
// (the npm packages e2b and @e2b/code-interpreter, and their Python twins) use to
// create a sandbox, move files in and out, run code and kill it, over Sandcell's own
// calls: a sandbox is an interpreter session with a workspace of its own, its code a
// session cell, its files the workspace's. Every call it makes goes through the API
// as the sandbox's creator (Options.Backend): the same roles, limits, approvals and
// audit records as any other caller's.
//
// Two halves, as E2B has them (docs/migrating-from-e2b.md):
//
//   - the API (E2B_API_URL = http(s)://HOST/e2b): POST /v2/sandboxes (and
//     /sandboxes), GET and DELETE /sandboxes/{id}, with the caller's Sandcell bearer
//     token as its API key (X-API-KEY); the API authenticates it (Options.Caller);
//   - the sandbox (E2B_SANDBOX_URL = http(s)://HOST/e2b/sandbox): GET /health, POST
//     and GET /files (envd's file transfer), POST /execute (the code interpreter's
//     NDJSON stream), each authenticated by the sandbox's own access token
//     (X-Access-Token, as the SDK sends envdAccessToken), which only its creator got.
//
// What a Sandcell sandbox does not have (commands and PTYs: envd's process service;
// its filesystem service; contexts of other languages; network; pause, resume,
// snapshots, templates) is answered as E2B answers a call it cannot serve, saying
// what is offered instead.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// EnvdVersion is the envd version this package's sandboxes report: the SDKs choose
// their calls by it (0.4.0 and later: files without a user name; before 0.5.7:
// multipart uploads, which this package reads, rather than octet streams).
const EnvdVersion = "0.4.1"

// The templates offered: Template (E2B's code interpreter's own name) is a session
// on the wasm backend; NativeTemplate one on the native backend, with NativeMemoryMiB
// of memory (where policy lets the caller use it: [native] runners).
const (
	Template        = "code-interpreter-v1"
	NativeTemplate  = "sandcell-native"
	NativeMemoryMiB = 1024
)

// DefaultTimeout is a sandbox's life when its creation names none (E2B's default),
// and MaxTimeout the longest one may be given (E2B's longest, a day): past it, with
// no call of setTimeout, the sandbox is killed as by the API. (Its session also ends
// idle past the operator's [sessions] idle_timeout, whichever comes first.)
const (
	DefaultTimeout = 300 * time.Second
	MaxTimeout     = 24 * time.Hour
)

// MaxDisplayBytes bounds what one execution's answer carries of its displays'
// files, in all (32 MiB, base64 aside): a display past it is named, not carried (read
// its file). Files moved by /files are streamed, never held, and bounded by the
// workspace's quota.
const MaxDisplayBytes = 32 << 20

// Backend is what a sandbox's calls go through: Sandcell's API as one caller
// (client.Client over the API's own handler). Errors are *wire.Problem where the API
// answered one.
type Backend interface {
	CreateWorkspace(ctx context.Context) (wire.Workspace, error)
	DeleteWorkspace(ctx context.Context, id string) error
	OpenSession(ctx context.Context, req wire.SessionRequest) (wire.SessionView, error)
	Sessions(ctx context.Context) ([]wire.SessionView, error)
	// CellStream runs a cell, giving out its output as it comes (stream "stdout" or
	// "stderr"); the answer holds the whole output too.
	CellStream(ctx context.Context, id string, req wire.CellRequest, out func(stream string, data []byte)) (wire.CellAnswer, error)
	CloseSession(ctx context.Context, id string) error
	PutFile(ctx context.Context, id, path string, r io.Reader) error
	OpenFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error)
}

// Options wire a Server to the API.
type Options struct {
	// Caller returns the caller the API authenticated for an API request (its
	// X-API-KEY taken as its bearer token), as an opaque identity, and a key naming
	// it (equal keys: the same caller); false when there is none.
	Caller func(r *http.Request) (who any, key string, ok bool)
	// Backend returns the API as caller who: every call of a sandbox is made by its
	// creator.
	Backend func(who any) Backend
	// Authenticated tells the API that r's connection presented a valid credential (a
	// sandbox's access token), so it is kept open as a token's is.
	Authenticated func(r *http.Request)
}

// Server keeps the sandboxes: which session and workspace each is, who created it,
// and the digest of its access token.
type Server struct {
	o  Options
	mu sync.Mutex
	// by sandbox ID (the session's ID)
	sandboxes map[string]*sandbox
}

type sandbox struct {
	id, workspace string
	who           any
	key           string // the creator's
	token         string // returned again by a connect
	tokenSum      [32]byte
	created       time.Time
	template      string
	// end is when the sandbox is killed unless its timeout is set again, by expiry;
	// both guarded by Server.mu.
	end    time.Time
	expiry *time.Timer
	// cells serialises /execute: a session runs one cell at a time, and E2B's SDK
	// expects a second call to wait, not to fail session_busy.
	cells sync.Mutex
	// stop cancels the cell running (nil: none), so that a kill need not wait for it;
	// guarded by Server.mu.
	stop context.CancelFunc
}

// New returns a Server without sandboxes.
func New(o Options) *Server {
	return &Server{o: o, sandboxes: map[string]*sandbox{}}
}

// newToken returns a new access token and its digest.
func newToken() (string, [32]byte) {
	b := make([]byte, 32)
	rand.Read(b)
	t := "sca_" + hex.EncodeToString(b)
	return t, sha256.Sum256([]byte(t))
}

// byToken returns the sandbox whose access token r carries (and, where r names a
// sandbox in E2b-Sandbox-Id, that one), or nil.
func (s *Server) byToken(r *http.Request) *sandbox {
	t := r.Header.Get("X-Access-Token")
	if t == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(t))
	id := r.Header.Get("E2b-Sandbox-Id")
	s.mu.Lock()
	defer s.mu.Unlock()
	if id != "" {
		if sb := s.sandboxes[id]; sb != nil && subtle.ConstantTimeCompare(sb.tokenSum[:], sum[:]) == 1 {
			return sb
		}
		return nil
	}
	for _, sb := range s.sandboxes {
		if subtle.ConstantTimeCompare(sb.tokenSum[:], sum[:]) == 1 {
			return sb
		}
	}
	return nil
}

// owned returns caller key's sandbox id, or nil.
func (s *Server) owned(key, id string) *sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil && sb.key == key {
		return sb
	}
	return nil
}

// drop ends sandbox sb: its cell under way cancelled, its session closed, its
// workspace deleted, and it is forgotten. What cannot be closed or deleted (already
// gone) is not an error; anything else is returned, and the sandbox stays.
func (s *Server) drop(ctx context.Context, sb *sandbox) error {
	s.mu.Lock()
	if sb.stop != nil {
		sb.stop()
	}
	if sb.expiry != nil {
		sb.expiry.Stop()
	}
	s.mu.Unlock()
	sb.cells.Lock() // the cell under way has returned
	defer sb.cells.Unlock()
	b := s.o.Backend(sb.who)
	if err := b.CloseSession(ctx, sb.id); err != nil && !gone(err) {
		return err
	}
	s.mu.Lock()
	delete(s.sandboxes, sb.id)
	s.mu.Unlock()
	if err := b.DeleteWorkspace(ctx, sb.workspace); err != nil && !gone(err) {
		return err
	}
	return nil
}

// expireIn sets sb to be killed after d (from now), replacing the time set before.
func (s *Server) expireIn(sb *sandbox, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb.end = time.Now().Add(d)
	if sb.expiry == nil {
		sb.expiry = time.AfterFunc(d, func() { s.drop(context.Background(), sb) })
		return
	}
	sb.expiry.Reset(d)
}

// timeout is E2B's timeout in seconds as a duration: DefaultTimeout for 0, an error
// past MaxTimeout or below 0.
func timeout(seconds int) (time.Duration, error) {
	switch {
	case seconds == 0:
		return DefaultTimeout, nil
	case seconds < 0 || time.Duration(seconds)*time.Second > MaxTimeout:
		return 0, fmt.Errorf("timeout %d s: a sandbox lives from 1 s to %d s", seconds, int(MaxTimeout.Seconds()))
	}
	return time.Duration(seconds) * time.Second, nil
}

// alive says whether sb's session still holds its state; where it does not (ended
// idle, closed through the API, lost), it drops sb and says why.
func (s *Server) alive(ctx context.Context, sb *sandbox) (bool, string) {
	live, err := s.o.Backend(sb.who).Sessions(ctx)
	if err != nil {
		return true, "" // the next call says what is wrong
	}
	why := "its session has ended"
	for _, v := range live {
		if v.ID == sb.id {
			if v.State != "lost" {
				return true, ""
			}
			why = "its session was lost: " + v.Lost
		}
	}
	s.drop(context.WithoutCancel(ctx), sb)
	return false, why
}

// gone says err is the API's "no such session or workspace" (or "lost").
func gone(err error) bool {
	p, ok := problemOf(err)
	return ok && (p.Status == 404 || p.Status == 410)
}

// prune drops the caller's sandboxes whose sessions are gone (ended idle, lost, closed
// through the API), so that the table holds at most the sessions that exist.
func (s *Server) prune(ctx context.Context, b Backend, key string) {
	live, err := b.Sessions(ctx)
	if err != nil {
		return
	}
	exists := map[string]bool{}
	for _, v := range live {
		exists[v.ID] = v.State != "lost"
	}
	var ended []*sandbox
	s.mu.Lock()
	for id, sb := range s.sandboxes {
		if sb.key == key && !exists[id] {
			ended = append(ended, sb)
		}
	}
	s.mu.Unlock()
	for _, sb := range ended {
		s.drop(ctx, sb)
	}
}

// problemOf returns err's problem, if the API answered one.
func problemOf(err error) (*wire.Problem, bool) {
	var p *wire.Problem
	return p, errors.As(err, &p)
}
