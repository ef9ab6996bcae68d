package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// workspaceInfo is the body of POST /v1/workspaces and GET /v1/workspaces/{id}.
type workspaceInfo struct {
	*workspace.Workspace
	Quota     workspace.Quota  `json:"quota"`
	Usage     *workspace.Usage `json:"usage,omitempty"`
	OverQuota bool             `json:"over_quota"`
	Files     []workspace.File `json:"files,omitempty"`
	// Next, when more names follow, is the after= of the next page.
	Next string `json:"next,omitempty"`
}

// workspace returns the workspace id if the caller may use it (its owner or an
// admin); to others it is not_found, as if it did not exist.
func (s *Server) workspace(c echo.Context, id string) (*workspace.Workspace, error) {
	if s.o.Workspaces == nil {
		return nil, fail(wire.CodeNotFound, "no workspace "+id)
	}
	w, err := s.o.Workspaces.Get(id)
	if err != nil && !errors.Is(err, workspace.ErrNotFound) {
		return nil, err
	}
	peer, ok := PeerFrom(c.Request().Context())
	if err != nil || !ok || ((peer.UID != w.Owner || peer.Token != w.OwnerToken) && !s.access().Allows(peer, RoleAdmin)) {
		return nil, fail(wire.CodeNotFound, "no workspace "+id)
	}
	return w, nil
}

// workspaceFile returns the workspace and the decoded {path} of a files route.
func (s *Server) workspaceFile(c echo.Context) (*workspace.Workspace, string, error) {
	w, err := s.workspace(c, c.Param("id"))
	if err != nil {
		return nil, "", err
	}
	path, err := filePath(c)
	if err != nil {
		return nil, "", fail(wire.CodeBadRequest, err.Error())
	}
	return w, path, nil
}

// filePath is the {path} of a files route, percent-decoded.
func filePath(c echo.Context) (string, error) {
	p := c.Param("*")
	if c.Request().URL.RawPath == "" {
		return p, nil
	}
	return url.PathUnescape(p)
}

// auditWorkspace records a workspace operation and its outcome.
func (s *Server) auditWorkspace(c echo.Context, kind store.Kind, id string, detail map[string]any, err error) {
	detail["workspace"] = id
	if err != nil {
		detail["error"] = err.Error()
	}
	s.record(c.Request().Context(), kind, "", detail)
}

func (s *Server) createWorkspace(c echo.Context) error {
	if s.o.Workspaces == nil {
		return fail(wire.CodeDisabled, "workspaces are not configured")
	}
	peer, ok := PeerFrom(c.Request().Context())
	if !ok {
		peer.UID = -1
	}
	w, err := s.o.Workspaces.Create(peer.UID, peer.Token)
	id := ""
	if w != nil {
		id = w.ID
	}
	s.auditWorkspace(c, store.WorkspaceCreated, id, map[string]any{}, err)
	if err != nil {
		return problemOf(err).audited() // recorded with its outcome
	}
	c.Response().Header().Set("Location", "/v1/workspaces/"+w.ID)
	return c.JSON(http.StatusCreated, workspaceInfo{Workspace: w, Quota: s.o.Workspaces.Quota()})
}

func (s *Server) getWorkspace(c echo.Context) error {
	w, err := s.workspace(c, c.Param("id"))
	if err != nil {
		return err
	}
	limit := 0
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > workspace.MaxPage {
			return failf(wire.CodeBadRequest, "limit: a number of names from 1 to %d", workspace.MaxPage)
		}
		limit = n
	}
	files, next, err := w.List(c.QueryParam("after"), limit)
	if err != nil {
		return err
	}
	over, u, err := w.OverQuota()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, workspaceInfo{Workspace: w, Quota: s.o.Workspaces.Quota(), Usage: &u, Files: files,
		Next: next, OverQuota: over})
}

func (s *Server) deleteWorkspace(c echo.Context) error {
	w, err := s.workspace(c, c.Param("id"))
	if err != nil {
		return err
	}
	s.wsMu.Lock()
	busy := s.inUse[w.ID] > 0
	if !busy {
		s.deleting[w.ID] = true
	}
	s.wsMu.Unlock()
	if busy {
		return fail(wire.CodeWorkspaceBusy, "a run or statement is using workspace "+w.ID)
	}
	err = s.o.Workspaces.Delete(w.ID)
	s.wsMu.Lock()
	delete(s.deleting, w.ID)
	s.wsMu.Unlock()
	s.auditWorkspace(c, store.WorkspaceDeleted, w.ID, map[string]any{}, err)
	if err != nil {
		return problemOf(err).audited() // recorded with its outcome
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) putFile(c echo.Context) error {
	w, path, err := s.workspaceFile(c)
	if err != nil {
		return err
	}
	q := s.o.Workspaces.Quota()
	if c.Request().ContentLength > q.Bytes {
		return failf(wire.CodeQuota, "a workspace holds at most %d bytes", q.Bytes)
	}
	if err := s.acquire(w.ID); err != nil {
		return acquireError(w.ID, err)
	}
	release := s.releaser(w.ID)
	defer release()
	n, err := w.Write(path, c.Request().Body)
	release()
	s.auditWorkspace(c, store.WorkspaceFileWritten, w.ID, map[string]any{"path": path, "bytes": n}, err)
	if err != nil {
		return problemOf(err).audited() // recorded with its outcome
	}
	return c.JSON(http.StatusCreated, workspace.File{Path: path, Type: "file", Size: n})
}

func (s *Server) getFile(c echo.Context) error {
	w, path, err := s.workspaceFile(c)
	if err != nil {
		return err
	}
	f, size, err := w.Open(path)
	s.auditWorkspace(c, store.WorkspaceFileRead, w.ID, map[string]any{"path": path, "bytes": size}, err)
	if err != nil {
		return problemOf(err).audited() // recorded with its outcome
	}
	defer f.Close()
	h := c.Response().Header()
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("Content-Type", "application/octet-stream")
	c.Response().WriteHeader(http.StatusOK)
	// The size read at open is what is sent, even if the file grows meanwhile.
	_, err = io.Copy(c.Response(), io.LimitReader(f, size))
	return err
}

func (s *Server) deleteFile(c echo.Context) error {
	w, path, err := s.workspaceFile(c)
	if err != nil {
		return err
	}
	if err := s.acquire(w.ID); err != nil {
		return acquireError(w.ID, err)
	}
	release := s.releaser(w.ID)
	defer release()
	err = w.Remove(path)
	release()
	s.auditWorkspace(c, store.WorkspaceFileRemoved, w.ID, map[string]any{"path": path}, err)
	if err != nil {
		return problemOf(err).audited() // recorded with its outcome
	}
	return c.NoContent(http.StatusNoContent)
}

// acquire marks workspace id in use (it cannot be deleted meanwhile): errWorkspaceGone
// when it is being deleted, errWorkspaceBusy while approved code or an approved write holds it alone.
func (s *Server) acquire(id string) error { return s.use(id, false) }

// acquireAlone marks workspace id in use by nothing else (an approved SQL write: no
// run or upload may change the file between the worker's check of its bytes and the
// write); errWorkspaceBusy while anything else uses it.
func (s *Server) acquireAlone(id string) error { return s.use(id, true) }

func (s *Server) use(id string, alone bool) error {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	switch {
	case s.deleting[id]:
		return errWorkspaceGone
	case s.alone[id] != nil:
		return fmt.Errorf("%w: approved code or an approved SQL write holds it alone", errWorkspaceBusy)
	case alone && s.inUse[id] > 0:
		return fmt.Errorf("%w: a run, an open session, a statement or an upload is using it, and an approved write waits for none", errWorkspaceBusy)
	}
	s.inUse[id]++
	if alone {
		s.alone[id] = new(aloneHold)
	}
	return nil
}

// soleUse reports whether the one use of workspace id is the caller's own (its
// acquire, shared or alone), and if so holds it alone until its release: nothing
// else may start in it meanwhile.
func (s *Server) soleUse(id string) bool { return s.takeAlone(id) != nil }

// aloneHold is one holder's mark of a workspace held alone: whoever ends its hold
// ends only its own (a cell's, ended after its session's use had ended and another
// request took the workspace alone, must not end that request's).
type aloneHold struct{ _ byte } // not zero-sized: each new one is a distinct pointer

// takeAlone is soleUse, returning the hold's mark (nil: not taken).
func (s *Server) takeAlone(id string) *aloneHold {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	if s.inUse[id] != 1 {
		return nil
	}
	h := new(aloneHold)
	s.alone[id] = h
	return h
}

// holdAlone holds workspace id alone, as soleUse does, for a user that already has
// it (a session's use): undo gives it back to be shared, keeping the use.
func (s *Server) holdAlone(id string) (undo func(), ok bool) {
	h := s.takeAlone(id)
	if h == nil {
		return nil, false
	}
	return func() {
		s.wsMu.Lock()
		defer s.wsMu.Unlock()
		if s.alone[id] == h {
			delete(s.alone, id)
		}
	}, true
}

// acquireError is the refusal of a failed acquire.
func acquireError(id string, err error) error {
	if errors.Is(err, errWorkspaceBusy) {
		return failf(wire.CodeWorkspaceBusy, "workspace %s: %v", id, err)
	}
	return fail(wire.CodeNotFound, "no workspace "+id)
}

// releaser is release(id) made to run once: a handler defers it and also calls it
// as soon as its work in the workspace is done, before it writes its answer. A
// deferred release alone ends after the answer was sent, and the caller's next
// request could find the workspace still held by its own last one (an approved run
// or write, which must have it alone, refused as busy).
func (s *Server) releaser(id string) func() {
	var once sync.Once
	return func() { once.Do(func() { s.release(id) }) }
}

func (s *Server) release(id string) {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	if s.inUse[id]--; s.inUse[id] <= 0 {
		delete(s.inUse, id)
		delete(s.alone, id)
	}
}

// Why a workspace cannot be acquired.
var (
	errWorkspaceGone = errors.New("the workspace is being deleted")
	errWorkspaceBusy = errors.New("the workspace is busy")
)
