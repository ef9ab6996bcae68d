// Package toolbroker is the daemon's tool broker ("code mode"): the tools the
// operator declares ([tools.NAME], MCP servers the daemon connects to as a client),
// offered to guests through the sandbox's tools channel (sandbox.Tools), each call
// checked, approved where it writes, made, and audited.
//
// A call goes through, in this order: the tool exists and the caller holds one of
// its roles (else ToolDenied); the run's limits for its source (calls, the
// arguments' bytes; else ToolLimit); for a tool that writes where approval is on,
// a person's decision (the approvals queue, action "tool.call": the run's wall
// clock is held while it waits, at most approvals.ttl; ApprovalDeclined unless
// approved), or a grant an earlier decision gave the run for the same tool; the
// tool itself, within its timeout, its result bounded by result_bytes before it is
// read whole (ToolError on failure, ToolLimit past the bound). Each call ends in
// exactly one tool.called record, whatever the decision.
//
// It imports the approvals, audit and identity packages and the sandbox's; never
// runs, sessions, the API or the daemon, which give it each run's Scope.
package toolbroker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/audit"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/store"
)

// Action is the approvals' action of a tool call.
const Action = "tool.call"

// Options are what a Broker needs of the daemon.
type Options struct {
	// Approvals holds the calls that wait for a person.
	Approvals *approvals.Queue
	// Audit records each call (tool.called) and each approval asked.
	Audit *audit.Writer
	// SQL runs a database source's statements; nil: such sources fail their calls.
	SQL SQL
}

// Decisions are what becomes of a call, as its tool.called record and the metrics
// say: allowed (made; it needs no approval), approved (a person approved it),
// granted (an earlier approval's grant covered it), declined (not approved, or no
// approval could be asked), denied (no such tool for the caller), limit (a limit of
// the run's calls), failed (the source could not be reached, or the arguments are
// not an object). A call allowed, approved or granted may still fail at its tool:
// its record then has an error.
func Decisions() []string {
	return []string{"allowed", "approved", "granted", "declined", "denied", "limit", "failed"}
}

// Broker holds the declared sources of tools. Its methods are safe for concurrent
// use.
type Broker struct {
	o      Options
	counts map[string]*atomic.Int64 // calls by decision
	// waiting: a run's call waiting for a person (run ID -> waiting), for its
	// view (Waiting).
	waiting sync.Map
	mu      sync.Mutex
	// sources by name; a reload replaces the map (calls under way keep theirs).
	sources map[string]*source
	cfgs    map[string]config.Tool
}

// New returns a broker offering the tools of cfgs (none connected yet: each source
// connects when first listed or called; Start connects them all).
func New(o Options, cfgs map[string]config.Tool) *Broker {
	b := &Broker{o: o, counts: map[string]*atomic.Int64{}}
	for _, d := range Decisions() {
		b.counts[d] = new(atomic.Int64)
	}
	b.Reload(cfgs)
	return b
}

// Waiting returns the approval a call of run id waits for, and the call's tool;
// ok false when none waits.
func (b *Broker) Waiting(runID string) (approval, tool string, ok bool) {
	v, ok := b.waiting.Load(runID)
	if !ok {
		return "", "", false
	}
	w := v.([2]string)
	return w[0], w[1], true
}

// Calls returns how many calls ended in decision (one of Decisions) since New.
func (b *Broker) Calls(decision string) int64 {
	if n := b.counts[decision]; n != nil {
		return n.Load()
	}
	return 0
}

// Reload makes cfgs the declared tools: a source whose declaration changed (or
// that is gone) is closed, a new one connects when first needed.
func (b *Broker) Reload(cfgs map[string]config.Tool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	next := map[string]*source{}
	for name, cfg := range cfgs {
		if old, ok := b.sources[name]; ok && same(b.cfgs[name], cfg) {
			next[name] = old
			continue
		}
		next[name] = newSource(name, cfg)
	}
	for name, old := range b.sources {
		if next[name] != old {
			old.close()
		}
	}
	b.sources, b.cfgs = next, maps.Clone(cfgs)
}

func same(a, b config.Tool) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// Start connects every source in the background (a server that starts slowly is
// ready by its first call).
func (b *Broker) Start(ctx context.Context) {
	for _, s := range b.current() {
		go s.session(ctx) //nolint:errcheck // a failure is said when the source is listed or called
	}
}

// Close ends every source's session and server (the daemon stops).
func (b *Broker) Close() {
	for _, s := range b.current() {
		s.kill()
	}
}

func (b *Broker) current() map[string]*source {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sources
}

// Source is a declared source of tools as GET /v1/tools shows it.
type Source struct {
	Name  string              `json:"name"`
	Roles []string            `json:"roles"`
	Tools []protocol.ToolSpec `json:"tools"`
	// Error says why its tools cannot be listed now (the server does not start,
	// answer, or list them).
	Error string `json:"error,omitempty"`
}

// List returns the declared sources, by name, with their tools (connecting a
// source not yet connected): those a caller holding the roles allows says yes to
// may call (every source when allows is nil).
func (b *Broker) List(ctx context.Context, allows func(role string) bool) []Source {
	out := []Source{}
	srcs := b.current()
	for _, name := range slices.Sorted(maps.Keys(srcs)) {
		s := srcs[name]
		if allows != nil && !allowed(allows, s) {
			continue
		}
		src := Source{Name: name, Roles: s.cfg.Roles, Tools: []protocol.ToolSpec{}}
		if _, tools, err := s.session(ctx); err != nil {
			src.Error = err.Error()
		} else {
			for _, t := range tools {
				src.Tools = append(src.Tools, t.spec)
			}
		}
		out = append(out, src)
	}
	return out
}

// Summary lists the tools of the sources connected now (see SummaryOf), for the
// agent tools' descriptions (tools.WithGuestTools). It connects nothing: a source
// not yet connected (Start connects them all) is left out until it is.
func (b *Broker) Summary() string {
	var srcs []Source
	cur := b.current()
	for _, name := range slices.Sorted(maps.Keys(cur)) {
		s := cur[name]
		if !slices.Contains(s.cfg.Roles, "runner") {
			continue // the descriptions are every caller's: only what every runner may call
		}
		s.mu.Lock()
		src := Source{Name: name}
		for _, t := range s.tools {
			src.Tools = append(src.Tools, t.spec)
		}
		s.mu.Unlock()
		srcs = append(srcs, src)
	}
	return SummaryOf(srcs)
}

// maxSummary bounds a summary (it is in two tools' descriptions): past it, the
// rest are counted, for sandcell.tools.help() to list.
const maxSummary = 8 << 10

// SummaryOf lists the tools of srcs one line each: "- NAME.TOOL [writes]: the first
// line of its description", at most maxSummary bytes.
func SummaryOf(srcs []Source) string {
	var lines []string
	size, left := 0, 0
	for _, src := range srcs {
		for _, t := range src.Tools {
			if size > maxSummary {
				left++
				continue
			}
			line := "- " + t.Name
			if t.Writes {
				line += " [writes]"
			}
			if d, _, _ := strings.Cut(strings.TrimSpace(t.Description), "\n"); d != "" {
				line += ": " + d
			}
			if len(line) > 300 {
				line = line[:300] + "..."
			}
			lines = append(lines, line)
			size += len(line) + 1
		}
	}
	if left > 0 {
		lines = append(lines, fmt.Sprintf("- and %d more (sandcell.tools.help() lists them)", left))
	}
	return strings.Join(lines, "\n")
}

// allowed says whether a caller holding the roles allows says yes to may call s's
// tools.
func allowed(allows func(role string) bool, s *source) bool {
	return slices.ContainsFunc(s.cfg.Roles, allows)
}

// Scope is who a run's (or a cell's) calls are made for, as the daemon knows it.
type Scope struct {
	Caller identity.Caller
	// Allows says whether the caller holds a role ("runner", "approver", "admin"),
	// as the API found when it admitted the run or cell.
	Allows func(role string) bool
	// RunID is the run's ID, or "" for a session's cell, whose session Session
	// names.
	RunID   string
	Session string
	// Program is the code that makes the calls, shown to an approver.
	Program string
}

// For returns the Tools that answer the calls of one run or cell: its own limits
// and grants, counted from zero.
func (b *Broker) For(scope Scope) sandbox.Tools {
	nonce := make([]byte, 8)
	rand.Read(nonce)
	return &calls{b: b, scope: scope, used: map[string]int{}, grants: map[string]grant{}, nonce: hex.EncodeToString(nonce)}
}

// calls is one run's (or cell's) sandbox.Tools.
type calls struct {
	b     *Broker
	scope Scope

	mu     sync.Mutex
	used   map[string]int   // calls made, by source
	asked  int              // approvals asked
	nonce  string           // this run's or cell's own, in its approvals' digests
	tried  int              // calls tried, whatever became of them
	grants map[string]grant // by tool (SOURCE.TOOL): what a decision left
}

// grant is what a decision covering several calls has left.
type grant struct {
	approval string
	left     int
}

// MaxCallBytes is the most bytes a call of this run's may need: the largest
// argument_bytes of its sources (sandbox.CallBound: a guest's larger frame is
// refused unread).
func (c *calls) MaxCallBytes() int {
	n := 0
	for _, s := range c.b.current() {
		n = max(n, int(s.cfg.ArgumentBytes))
	}
	return n
}

// Call answers one of the guest's calls (see the package doc).
func (c *calls) Call(ctx context.Context, call protocol.ToolCall, clock sandbox.Clock) protocol.ToolAnswer {
	if call.List {
		var specs []protocol.ToolSpec
		for _, src := range c.b.List(ctx, c.scope.Allows) {
			specs = append(specs, src.Tools...)
		}
		if specs == nil {
			specs = []protocol.ToolSpec{}
		}
		return protocol.ToolAnswer{Tools: specs}
	}
	// Calls of every kind count against a bound of their own, so that a guest's
	// refused calls cannot grow the audit log without end: past it, the run's calls
	// are refused, and the first refusal alone is recorded.
	c.mu.Lock()
	c.tried++
	tried := c.tried
	c.mu.Unlock()
	if bound := c.maxTries(); tried > bound {
		answer := failure(protocol.ToolErrorLimit, fmt.Sprintf("this run has tried %d tool calls, the most it may (its calls are refused from here, and no longer recorded one by one)", bound))
		if tried > bound+1 {
			return answer
		}
		call.Tool = "(any)"
		defer func() {
			c.b.counts["limit"].Add(1)
			c.record(ctx, map[string]any{"tool": call.Tool, "decision": "limit", "error": answer.Error.Message})
		}()
		return answer
	}
	began := time.Now()
	name := call.Tool
	if len(name) > 200 {
		name = name[:200] + "... (sha256 " + digest([]byte(call.Tool)) + ")"
	}
	rec := map[string]any{"tool": name, "arguments_sha256": digest(call.Arguments)}
	answer := c.call(ctx, call, clock, rec)
	rec["ms"] = float64(time.Since(began).Microseconds()) / 1000
	if n := c.b.counts[fmt.Sprint(rec["decision"])]; n != nil {
		n.Add(1)
	}
	if answer.Error != nil {
		msg := answer.Error.Class + ": " + answer.Error.Message
		if len(msg) > 1000 { // (a guest's name or a server's text: the record keeps its head)
			msg = msg[:1000] + "..."
		}
		rec["error"] = msg
	} else {
		rec["result_sha256"] = digest(answer.Result)
	}
	if err := c.record(ctx, rec); err != nil && answer.Error == nil {
		// A call the log cannot record is not answered as made: the guest does
		// not learn its result (it was made: the record says so when it can).
		return failure(protocol.ToolErrorFailed, "the audit log cannot record the call")
	}
	return answer
}

// record writes the call's tool.called record.
func (c *calls) record(ctx context.Context, rec map[string]any) error {
	if c.b.o.Audit == nil {
		return nil
	}
	if c.scope.RunID == "" {
		rec["session"], rec["code_sha256"] = c.scope.Session, digest([]byte(c.scope.Program))
	}
	return c.b.o.Audit.Record(context.WithoutCancel(ctx), store.ToolCalled, c.scope.Caller, c.scope.RunID, rec)
}

// maxTries is how many calls a run (or cell) may try: its sources' calls together,
// and as many again for calls refused before they count against a source's.
func (c *calls) maxTries() int {
	n := 0
	for _, s := range c.b.current() {
		n += s.cfg.Calls
	}
	return 2*n + 64
}

// call decides and makes call, setting rec's decision.
func (c *calls) call(ctx context.Context, call protocol.ToolCall, clock sandbox.Clock, rec map[string]any) protocol.ToolAnswer {
	srcName, _, _ := strings.Cut(call.Tool, ".")
	s := c.b.current()[srcName]
	var t *tool
	var sess *mcp.ClientSession
	if s != nil && allowed(c.scope.Allows, s) {
		se, tools, err := s.session(ctx)
		if err != nil {
			rec["decision"] = "failed"
			return failure(protocol.ToolErrorFailed, fmt.Sprintf("the tools of %s cannot be reached: %v", srcName, err))
		}
		for i := range tools {
			if tools[i].spec.Name == call.Tool {
				t = &tools[i]
			}
		}
		sess = se
	}
	if t == nil {
		rec["decision"] = "denied"
		return failure(protocol.ToolErrorDenied, fmt.Sprintf("%s is not a tool this caller may call (sandcell.tools.help() lists them)", call.Tool))
	}
	if len(call.Arguments) == 0 {
		call.Arguments = json.RawMessage("{}")
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(call.Arguments, &obj) != nil || obj == nil {
		rec["decision"] = "failed"
		return failure(protocol.ToolErrorFailed, "the arguments are not a JSON object")
	}
	if n := int64(len(call.Arguments)); n > s.cfg.ArgumentBytes {
		rec["decision"] = "limit"
		return failure(protocol.ToolErrorLimit, fmt.Sprintf("the arguments are %d bytes, more than %s allows (%d)", n, srcName, s.cfg.ArgumentBytes))
	}
	held := t.spec.Writes && *s.cfg.Approval // the call needs a decision
	c.mu.Lock()
	if c.used[srcName] >= s.cfg.Calls {
		c.mu.Unlock()
		rec["decision"] = "limit"
		return failure(protocol.ToolErrorLimit, fmt.Sprintf("this run has made the %d calls %s allows", s.cfg.Calls, srcName))
	}
	c.used[srcName]++
	g := c.grants[call.Tool]
	if held && g.left > 0 {
		c.grants[call.Tool] = grant{approval: g.approval, left: g.left - 1}
	}
	c.mu.Unlock()

	rec["decision"] = "allowed"
	if s.cfg.Path != "" {
		// A database's query: whether it writes is the statement's to say.
		c.mu.Lock()
		if held && g.left > 0 {
			c.grants[call.Tool] = g // (given back: the statement may only read)
		}
		c.mu.Unlock()
		return c.query(ctx, s, call, clock, rec)
	}
	switch {
	case held && g.left > 0:
		rec["decision"], rec["approval"] = "granted", g.approval
	case held:
		if answer, ok := c.approve(ctx, call, clock, rec); !ok {
			return answer
		}
	}
	res, err := s.call(ctx, sess, t.server, call.Arguments)
	switch {
	case err != nil && ctx.Err() != nil:
		return failure(protocol.ToolErrorFailed, "the run ended during the call")
	case err != nil:
		return failure(protocol.ToolErrorFailed, fmt.Sprintf("%s: %v", call.Tool, err))
	case int64(len(res)) > s.cfg.ResultBytes:
		return failure(protocol.ToolErrorLimit, fmt.Sprintf("the result is %d bytes, more than %s allows (%d)", len(res), srcName, s.cfg.ResultBytes))
	}
	return protocol.ToolAnswer{Result: res}
}

// approveOrGrant is approve, unless an earlier decision's grant covers call (which
// it then uses): ok true when call may be made.
func (c *calls) approveOrGrant(ctx context.Context, call protocol.ToolCall, clock sandbox.Clock, rec map[string]any) (protocol.ToolAnswer, bool) {
	c.mu.Lock()
	g := c.grants[call.Tool]
	if g.left > 0 {
		c.grants[call.Tool] = grant{approval: g.approval, left: g.left - 1}
	}
	c.mu.Unlock()
	if g.left > 0 {
		rec["decision"], rec["approval"] = "granted", g.approval
		return protocol.ToolAnswer{}, true
	}
	return c.approve(ctx, call, clock, rec)
}

// approve asks a person to approve call and waits (the run's clock held) for the
// decision: ok true when it may be made; otherwise the answer says why not.
func (c *calls) approve(ctx context.Context, call protocol.ToolCall, clock sandbox.Clock, rec map[string]any) (protocol.ToolAnswer, bool) {
	q := c.b.o.Approvals
	if q == nil {
		rec["decision"] = "declined"
		return failure(protocol.ToolErrorDeclined, "the tool writes and no approver can be asked"), false
	}
	subject := map[string]any{"tool": call.Tool, "arguments": call.Arguments, "writes": true,
		"program_sha256": digest([]byte(c.scope.Program)), "program": c.scope.Program}
	if c.scope.RunID != "" {
		subject["run"] = c.scope.RunID
	} else {
		subject["session"] = c.scope.Session
	}
	d := digest(append([]byte(call.Tool+"\x00"), call.Arguments...))
	// Two calls alike are two approvals: the digest names this call of the run.
	c.mu.Lock()
	c.asked++
	d = fmt.Sprintf("%s/%s%s/%s/%d", d, c.scope.RunID, c.scope.Session, c.nonce, c.asked)
	c.mu.Unlock()
	ap, err := q.Request(Action, c.scope.Caller, subject, d, "")
	if err != nil {
		rec["decision"] = "declined"
		return failure(protocol.ToolErrorDeclined, "the call needs an approval, and none can be asked: "+err.Error()), false
	}
	rec["approval"] = ap.ID
	if c.b.o.Audit != nil {
		_ = c.b.o.Audit.Record(context.WithoutCancel(ctx), store.ApprovalRequested, c.scope.Caller, c.scope.RunID,
			map[string]any{"approval": ap.ID, "action": Action, "tool": call.Tool, "arguments_sha256": digest(call.Arguments)})
	}
	release := clock.Hold()
	if c.scope.RunID != "" {
		c.b.waiting.Store(c.scope.RunID, [2]string{ap.ID, call.Tool})
	}
	got, err := q.Wait(ctx, ap.ID)
	if c.scope.RunID != "" {
		c.b.waiting.Delete(c.scope.RunID)
	}
	release()
	switch {
	case err != nil:
		rec["decision"] = "declined"
		q.Withdraw(ap.ID) // nobody waits for it now
		return failure(protocol.ToolErrorDeclined, "the run ended while the call waited for its approval"), false
	case got.State != approvals.Approved:
		rec["decision"] = "declined"
		return failure(protocol.ToolErrorDeclined, fmt.Sprintf("the call was not approved (approval %s: %s)", ap.ID, got.State)), false
	}
	if _, err := q.Redeem(ap.ID, c.scope.Caller, got.Digest); err != nil {
		rec["decision"] = "declined"
		return failure(protocol.ToolErrorDeclined, "the approval could not be used: "+err.Error()), false
	}
	rec["decision"] = "approved"
	if got.Grant > 1 {
		c.mu.Lock()
		c.grants[call.Tool] = grant{approval: ap.ID, left: got.Grant - 1}
		c.mu.Unlock()
		rec["grant"] = got.Grant
	}
	return protocol.ToolAnswer{}, true
}

func failure(class, msg string) protocol.ToolAnswer {
	return protocol.ToolAnswer{Error: &protocol.ToolError{Class: class, Message: msg}}
}

// digest is the SHA-256 of b, in hex.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
