package api

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/labstack/echo/v4"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// require admits only callers holding role: a Unix peer by its SO_PEERCRED
// credentials, any other (TCP) by its bearer token, which then identifies it.
func (s *Server) require(roles ...Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ctx := c.Request().Context()
			role := roles[0]
			peer, ok := PeerFrom(ctx)
			if !ok {
				t, found := s.access().Tokens.Authenticate(c.Request())
				if !found {
					c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sandcell"`)
					e := fail(wire.CodeUnauthorized, "present a configured bearer token")
					if !s.denials.Allow() {
						// A flood of them is one record, with the count, when it ends.
						s.skipped.Add(1)
						return e.audited()
					}
					e.kind, e.record = store.AccessDenied, map[string]any{"method": c.Request().Method, "path": c.Path(),
						"role": role, "remote": c.Request().RemoteAddr, "reason": "no valid bearer token",
						"unrecorded_before": s.skipped.Swap(0)}
					return e
				}
				peer, ok = Peer{PID: -1, UID: -1, GID: -1, Token: t.Name}, true
				authenticated(ctx)
				c.Response().Header().Del("Connection")
				c.SetRequest(c.Request().WithContext(context.WithValue(ctx, peerKey{}, peer)))
			}
			allowed := false
			for _, role := range roles {
				allowed = allowed || s.access().Allows(peer, role)
			}
			if !allowed {
				who := peer.who()
				c.Response().Header().Set("Connection", "close") // nor wait for its body
				e := failf(wire.CodeForbidden, "%s is not allowed the %s role", who, role)
				e.kind, e.record = store.AccessDenied, map[string]any{"method": c.Request().Method, "path": c.Path(),
					"role": role, "pid": peer.PID}
				return e
			}
			return next(c)
		}
	}
}

// record appends an audit record of the request of ctx by its caller (uid -1 before
// anyone is known); a TCP caller's token name goes into detail["token"] (see
// audit.Writer.Record). Every record the API writes names its caller this way.
func (s *Server) record(ctx context.Context, kind store.Kind, runID string, detail map[string]any) error {
	if r, ok := ctx.Value(recordedKey{}).(*atomic.Bool); ok {
		r.Store(true)
	}
	return s.o.Audit.Record(ctx, kind, callerOf(ctx), runID, detail)
}

// recordedKey is the context key of a request's *atomic.Bool: set once the request
// has written an audit record.
type recordedKey struct{}

// recordRefusal records the refusal of the request of ctx. A refusal before anything
// of the request was recorded is Auditor.RecordRefusal (only logged while the log is
// down: it waits for no lock); one that ends a request already recorded (run.requested,
// sql.requested, then the queue full, say) is that request's final record, and is
// written as any record is.
func (s *Server) recordRefusal(ctx context.Context, kind store.Kind, detail map[string]any) error {
	if r, ok := ctx.Value(recordedKey{}).(*atomic.Bool); ok && r.Load() {
		return s.record(ctx, kind, "", detail)
	}
	return s.o.Audit.RecordRefusal(ctx, kind, callerOf(ctx), detail)
}

// callerOf is the caller of the request ctx belongs to (uid -1 when there is none).
func callerOf(ctx context.Context) identity.Caller {
	if peer, ok := PeerFrom(ctx); ok {
		return peer.Caller()
	}
	return identity.Caller{UID: -1}
}

// who names the caller in a refusal: its uid, or its token's name.
func (p Peer) who() string {
	if p.Token != "" {
		return fmt.Sprintf("token %q", p.Token)
	}
	return fmt.Sprintf("uid %d", p.UID)
}
