// Package healthz keeps the daemon's named health checks and answers the Kubernetes
// style probes: /livez (is the process working at all; a failure means restart it)
// and /readyz (may it be sent work; a failure means route around it). A check is
// either a liveness or a readiness check; a failing liveness check fails both.
//
// Checks are pushed, not pulled: the component that knows (the start-up self-test,
// the periodic canary, the audit log, the run manager) calls Set with its latest
// result, so a probe never waits for work and never runs a sandbox.
package healthz

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// Kind says which probe a check belongs to.
type Kind int

// The kinds of check.
const (
	// Readiness checks gate /readyz only.
	Readiness Kind = iota
	// Liveness checks gate /livez and /readyz.
	Liveness
)

// State is a check's latest result.
type State string

// The states. A check that has not reported yet is pending, which is not ready.
const (
	OK      State = "ok"
	Failing State = "failing"
	Pending State = "pending"
)

// Check is one named check as the probes report it.
type Check struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"` // "liveness" or "readiness"
	State State  `json:"state"`
	// Detail says more about the latest result: what a passing check has to report
	// (the warm pool's roots that its workers cannot hold, say). Cleared by each Set.
	Detail string `json:"detail,omitempty"`
	// Error is the last failure's message (kept after recovery, with its time).
	Error     string    `json:"error,omitempty"`
	ErrorTime time.Time `json:"error_time,omitzero"`
	// Since is when the check entered its state.
	Since time.Time `json:"since"`
}

// Registry is the set of checks. Its methods are safe for concurrent use.
type Registry struct {
	mu     sync.Mutex
	checks map[string]*Check
	order  []string
}

// New returns an empty registry.
func New() *Registry { return &Registry{checks: map[string]*Check{}} }

// Add declares a check, pending until its first Set. Adding a name twice keeps the
// first.
func (r *Registry) Add(name string, kind Kind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.checks[name]; ok {
		return
	}
	k := "readiness"
	if kind == Liveness {
		k = "liveness"
	}
	r.checks[name] = &Check{Name: name, Kind: k, State: Pending, Since: time.Now().UTC()}
	r.order = append(r.order, name)
}

// Set records check name's latest result: nil is OK, an error is failing with its
// message. Setting an undeclared check declares it as a readiness check.
func (r *Registry) Set(name string, err error) { r.SetDetail(name, err, "") }

// SetDetail is Set with the result's detail (see Check.Detail).
func (r *Registry) SetDetail(name string, err error, detail string) {
	r.Add(name, Readiness)
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.checks[name]
	c.Detail = detail
	now := time.Now().UTC()
	state := OK
	if err != nil {
		state = Failing
		c.Error, c.ErrorTime = err.Error(), now
	}
	if c.State != state {
		c.State, c.Since = state, now
	}
}

// Live reports whether every liveness check is OK (pending counts as live: a
// process still starting is not dead), with every check's state.
func (r *Registry) Live() (bool, []Check) {
	return r.status(func(c *Check) bool { return c.Kind != "liveness" || c.State != Failing })
}

// Ready reports whether every check is OK, with every check's state.
func (r *Registry) Ready() (bool, []Check) {
	return r.status(func(c *Check) bool { return c.State == OK })
}

// Why returns the first check keeping the registry from ready and its error, or "".
func (r *Registry) Why() string {
	if ok, checks := r.Ready(); !ok {
		return firstFailure(checks)
	}
	return ""
}

func (r *Registry) status(pass func(*Check) bool) (bool, []Check) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := true
	out := make([]Check, 0, len(r.order))
	for _, name := range r.order {
		c := r.checks[name]
		ok = ok && pass(c)
		out = append(out, *c)
	}
	return ok, out
}

// Handler serves one probe: 200 {"status":"ok"} when it passes; otherwise 503 with
// an RFC 9457 problem document (application/problem+json) whose "code" is failCode
// and whose detail names the first failing check. With ?verbose (any value) either
// body also lists every check ("checks") with its state, detail and last error.
func Handler(probe func() (bool, []Check), failCode string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, checks := probe()
		var ext map[string]any
		if r.URL.Query().Has("verbose") {
			ext = map[string]any{"checks": slices.Clip(checks)}
		}
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			wire.WriteProblem(w, wire.NewProblem(http.StatusServiceUnavailable, failCode, firstFailure(checks)), ext)
			return
		}
		body := map[string]any{"status": "ok"}
		for k, v := range ext {
			body[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		json.NewEncoder(w).Encode(body)
	})
}

func firstFailure(checks []Check) string {
	for _, c := range checks {
		switch c.State {
		case Failing:
			return c.Name + ": " + c.Error
		case Pending:
			return c.Name + ": not checked yet"
		}
	}
	return ""
}
