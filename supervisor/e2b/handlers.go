package e2b

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// API is the handler of E2B's API, mounted at the prefix E2B_API_URL names (the
// prefix stripped); the API has authenticated its caller (Options.Caller).
func (s *Server) API() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("POST /v2/sandboxes", s.create)
	m.HandleFunc("POST /sandboxes", s.create)
	m.HandleFunc("GET /sandboxes/{id}", s.info)
	m.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	m.HandleFunc("GET /sandboxes", s.list)
	m.HandleFunc("GET /v2/sandboxes", s.list)
	m.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	m.HandleFunc("/", s.notOffered)
	return m
}

// Sandbox is the handler of a sandbox's own services (envd's file transfer and the
// code interpreter), mounted at the prefix E2B_SANDBOX_URL names (stripped). Each
// request is authenticated by its sandbox's access token.
func (s *Server) Sandbox() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	// POST /files is envd's upload, GET /files its download.
	m.HandleFunc("POST /files", s.upload)
	m.HandleFunc("GET /files", s.download)
	m.HandleFunc("POST /execute", s.execute)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		connectError(w, r, "a Sandcell sandbox runs Python code (runCode) and moves files (files.write, files.read); "+
			"it has no shell, commands, PTY, filesystem service, other languages or network: "+r.URL.Path+" is not offered")
	})
	return withToken(s, m)
}

// withToken admits a request carrying a sandbox's access token. GET /health without
// one is the daemon's; with one (or a sandbox's id), that sandbox's.
func withToken(s *Server, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && r.Header.Get("X-Access-Token") == "" && r.Header.Get("E2b-Sandbox-Id") == "" {
			next.ServeHTTP(w, r) // the daemon's
			return
		}
		if r.URL.Path == "/health" {
			// A sandbox's: 502 where it is not running, as E2B's isRunning reads it.
			sb := s.byToken(r)
			if sb == nil {
				envdError(w, http.StatusBadGateway, "the sandbox is not running")
				return
			}
			if ok, why := s.alive(r.Context(), sb); !ok {
				envdError(w, http.StatusBadGateway, "the sandbox is not running: "+why)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		sb := s.byToken(r)
		if sb == nil {
			envdError(w, http.StatusNotFound, "sandbox not found: no sandbox has this access token (X-Access-Token); it was killed or has ended")
			return
		}
		if s.o.Authenticated != nil {
			s.o.Authenticated(r)
		}
		if ok, why := s.alive(r.Context(), sb); !ok {
			envdError(w, http.StatusNotFound, "sandbox "+sb.id+" not found: "+why+" (its workspace is deleted)")
			return
		}
		next.ServeHTTP(w, r.WithContext(withSandbox(r.Context(), sb)))
	})
}

// createRequest is the body of POST /v2/sandboxes as the SDKs send it (the members
// this package reads; the rest must be absent or their defaults).
type createRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             int               `json:"timeout"` // seconds
	EnvVars             map[string]string `json:"envVars"`
	Metadata            map[string]string `json:"metadata"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Secure              *bool             `json:"secure"`
	AutoPause           *bool             `json:"autoPause"`
	Network             json.RawMessage   `json:"network"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	who, key, ok := s.o.Caller(r)
	if !ok {
		apiError(w, http.StatusUnauthorized, "present your Sandcell token as the API key (E2B_API_KEY)")
		return
	}
	var req createRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil && err != io.EOF {
		apiError(w, http.StatusBadRequest, "the body is not a sandbox request: "+err.Error())
		return
	}
	life, err := timeout(req.Timeout)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	session := wire.SessionRequest{Env: req.EnvVars}
	if req.TemplateID == NativeTemplate {
		session.Backend, session.Limits.MemoryMiB = "native", NativeMemoryMiB
	}
	switch {
	case req.TemplateID != "" && req.TemplateID != Template && req.TemplateID != NativeTemplate && req.TemplateID != "base":
		apiError(w, http.StatusBadRequest, fmt.Sprintf("template %q: Sandcell offers %q (the wasm backend: Python 3.13 and its "+
			"pure-Python libraries) and %q (the native backend: numpy, pandas, matplotlib, scipy, scikit-learn, where the "+
			"operator allows it)", req.TemplateID, Template, NativeTemplate))
		return
	case req.AllowInternetAccess != nil && *req.AllowInternetAccess:
		apiError(w, http.StatusBadRequest, "allow_internet_access: a Sandcell sandbox has no network")
		return
	case req.AutoPause != nil && *req.AutoPause:
		apiError(w, http.StatusBadRequest, "autoPause: not offered (a session idle past the operator's idle timeout ends)")
		return
	case len(req.Network) > 0 && string(req.Network) != "null" || len(req.MCP) > 0 && string(req.MCP) != "null" ||
		len(req.VolumeMounts) > 0 && string(req.VolumeMounts) != "null":
		apiError(w, http.StatusBadRequest, "network, mcp and volumeMounts: not offered")
		return
	}
	b := s.o.Backend(who)
	ctx := r.Context()
	s.prune(ctx, b, key)
	ws, err := b.CreateWorkspace(ctx)
	if err != nil {
		backendError(w, err)
		return
	}
	session.Workspace = ws.ID
	sv, err := b.OpenSession(ctx, session)
	if err != nil {
		b.DeleteWorkspace(ctx, ws.ID)
		backendError(w, err)
		return
	}
	token, sum := newToken()
	sb := &sandbox{id: sv.ID, workspace: ws.ID, who: who, key: key, token: token, tokenSum: sum, created: time.Now(),
		template: Template}
	if session.Backend == "native" {
		sb.template = NativeTemplate
	}
	s.mu.Lock()
	s.sandboxes[sv.ID] = sb
	s.mu.Unlock()
	s.expireIn(sb, life)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"sandboxID": sv.ID, "templateID": sb.template, "clientID": "sandcell",
		"alias": sb.template, "envdVersion": EnvdVersion, "envdAccessToken": token, "domain": nil})
}

// callersSandbox returns the sandbox r names, if its caller created it; otherwise it
// answers 404 (another caller's sandbox does not exist for this one) and returns nil.
func (s *Server) callersSandbox(w http.ResponseWriter, r *http.Request) *sandbox {
	_, key, ok := s.o.Caller(r)
	sb := s.owned(key, r.PathValue("id"))
	if !ok || sb == nil {
		apiError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return nil
	}
	return sb
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	sb := s.callersSandbox(w, r)
	if sb == nil {
		return
	}
	if ok, why := s.alive(r.Context(), sb); !ok {
		apiError(w, http.StatusNotFound, "sandbox "+sb.id+" not found: "+why)
		return
	}
	s.mu.Lock()
	d := describe(sb)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(d)
}

// describe is E2B's description of a sandbox: endAt is when it is killed unless its
// timeout is set again (its session may end sooner, idle); s.mu is held.
func describe(sb *sandbox) map[string]any {
	return map[string]any{"sandboxID": sb.id, "templateID": sb.template, "alias": sb.template,
		"clientID": "sandcell", "startedAt": sb.created.UTC().Format(time.RFC3339Nano), "envdVersion": EnvdVersion,
		"state": "running", "metadata": map[string]string{}, "cpuCount": 1, "memoryMB": 0, "diskSizeMB": 0,
		"endAt": sb.end.UTC().Format(time.RFC3339Nano)}
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sb := s.callersSandbox(w, r)
	if sb == nil {
		return
	}
	if err := s.drop(r.Context(), sb); err != nil {
		backendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// list answers the caller's sandboxes.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	_, key, _ := s.o.Caller(r)
	out := []map[string]any{}
	s.mu.Lock()
	for _, sb := range s.sandboxes {
		if sb.key == key {
			out = append(out, describe(sb))
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// connect answers a live sandbox of the caller's as its creation did (its access
// token again), as E2B's Sandbox.connect expects.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	sb := s.callersSandbox(w, r)
	if sb == nil {
		return
	}
	if ok, why := s.alive(r.Context(), sb); !ok {
		apiError(w, http.StatusNotFound, "sandbox "+sb.id+" not found: "+why)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"sandboxID": sb.id, "templateID": sb.template, "clientID": "sandcell",
		"alias": sb.template, "envdVersion": EnvdVersion, "envdAccessToken": sb.token, "domain": nil})
}

// setTimeout sets when the sandbox is killed: its body's timeout (seconds) from now.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	sb := s.callersSandbox(w, r)
	if sb == nil {
		return
	}
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil || req.Timeout == nil {
		apiError(w, http.StatusBadRequest, "the body is not a timeout: {\"timeout\": seconds}")
		return
	}
	life, err := timeout(*req.Timeout)
	if err != nil || *req.Timeout == 0 {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("timeout %d s: a sandbox lives from 1 s to %d s", *req.Timeout, int(MaxTimeout.Seconds())))
		return
	}
	if ok, why := s.alive(r.Context(), sb); !ok {
		apiError(w, http.StatusNotFound, "sandbox "+sb.id+" not found: "+why)
		return
	}
	s.expireIn(sb, life)
	w.WriteHeader(http.StatusNoContent)
}

// notOffered answers the rest of E2B's API in its own shape.
func (s *Server) notOffered(w http.ResponseWriter, r *http.Request) {
	apiError(w, http.StatusNotImplemented, r.Method+" "+r.URL.Path+": not offered by Sandcell, which creates, lists, "+
		"connects to and kills sandboxes (templates, pause, resume, snapshots, metrics and logs are not offered)")
}

// workspacePath maps a path in the sandbox to the workspace's: the sandbox's home
// (/home/user, E2B's working directory) and /ws (the guest's name for it) are the
// workspace; a relative path is taken from there. Anything else does not exist in a
// Sandcell sandbox.
func workspacePath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("a path is required")
	}
	if strings.HasPrefix(p, "~/") {
		p = "/home/user/" + p[2:]
	}
	if !strings.HasPrefix(p, "/") {
		p = "/home/user/" + p
	}
	p = path.Clean(p)
	for _, root := range []string{"/home/user/", "/ws/"} {
		if rel, ok := strings.CutPrefix(p, root); ok && rel != "" {
			return rel, nil
		}
	}
	return "", fmt.Errorf("%s: a Sandcell sandbox's files are its workspace, /home/user (the code sees it as /ws, and runs in it)", p)
}

// entryInfo is envd's description of a file written.
func entryInfo(p string) map[string]string {
	return map[string]string{"name": path.Base(p), "type": "file", "path": "/home/user/" + p}
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	b := s.o.Backend(sb.who)
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	written := []map[string]string{}
	// put streams data to the workspace file name: nothing holds a whole file.
	put := func(name string, data io.Reader) bool {
		rel, err := workspacePath(name)
		if err != nil {
			envdError(w, http.StatusBadRequest, err.Error())
			return false
		}
		if err := b.PutFile(r.Context(), sb.workspace, rel, data); err != nil {
			backendEnvdError(w, err)
			return false
		}
		written = append(written, entryInfo(rel))
		return true
	}
	if r.Header.Get("Content-Encoding") != "" {
		envdError(w, http.StatusUnsupportedMediaType, "Content-Encoding: send the file as it is (no gzip)")
		return
	}
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				envdError(w, http.StatusBadRequest, "the multipart body: "+err.Error())
				return
			}
			name := r.URL.Query().Get("path")
			if name != "" && len(written) > 0 {
				envdError(w, http.StatusBadRequest, "one path (?path=) names one file: send each file its own part, named by its filename")
				return
			}
			if name == "" {
				// The part's filename as sent (Part.FileName keeps only its last
				// element): E2B's SDK names each file by its whole path.
				_, p, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				name = p["filename"]
			}
			if !put(name, part) {
				return
			}
		}
	} else if !put(r.URL.Query().Get("path"), r.Body) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(written)
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	rel, err := workspacePath(r.URL.Query().Get("path"))
	if err != nil {
		envdError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, size, err := s.o.Backend(sb.who).OpenFile(r.Context(), sb.workspace, rel)
	if err != nil {
		backendEnvdError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", fmt.Sprint(size))
	}
	io.Copy(w, f)
}

// connectError answers a call of envd's process and filesystem services (Connect
// RPC) as unimplemented: a unary call's error is its JSON body with status 501; a
// streaming call's (application/connect+json) is the stream's end message, a frame
// flagged 2 (Connect protocol, "Streaming-Response").
func connectError(w http.ResponseWriter, r *http.Request, msg string) {
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/connect+") {
		end, _ := json.Marshal(map[string]any{"error": map[string]string{"code": "unimplemented", "message": msg}})
		frame := make([]byte, 5, 5+len(end))
		frame[0] = 2
		binary.BigEndian.PutUint32(frame[1:], uint32(len(end)))
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(http.StatusOK)
		w.Write(append(frame, end...))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotImplemented)
	json.NewEncoder(w).Encode(map[string]string{"code": "unimplemented", "message": msg})
}

// apiError answers as E2B's API does: {"code", "message"}.
func apiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// envdError answers as envd does.
func envdError(w http.ResponseWriter, status int, msg string) {
	apiError(w, status, msg)
}

// statusOf is the status to answer for an error of the backend (its problem's; a
// daemon that could not answer, 502).
func statusOf(err error) (int, string) {
	if p, ok := problemOf(err); ok {
		return p.Status, p.Code + ": " + p.Detail
	}
	return http.StatusBadGateway, err.Error()
}

func backendError(w http.ResponseWriter, err error) {
	status, msg := statusOf(err)
	apiError(w, status, msg)
}

func backendEnvdError(w http.ResponseWriter, err error) {
	status, msg := statusOf(err)
	envdError(w, status, msg)
}
