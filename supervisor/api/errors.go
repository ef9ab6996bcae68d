package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/sqltool"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// apiError is a handler's refusal: what the caller is told (status, stable code,
// detail, extension members, Retry-After) and what the audit log is told. Handlers
// return one (fail, or any error that problemOf maps); errorHandler, the one edge,
// records the refusal and writes the problem document.
type apiError struct {
	status       int
	code, detail string
	ext          map[string]any
	// kind is the record of the refusal: "" means the route's (refusalKinds), if it
	// has one; record holds its members beyond status, code and detail.
	kind   store.Kind
	record map[string]any
	// recorded: no record here. The handler has written the outcome's record
	// itself, or the audit log is what failed, or the refusal is one of a flood
	// counted into the next record.
	recorded bool
}

func (e *apiError) Error() string { return e.code + ": " + e.detail }

// fail is the refusal of code, with its status (statusOf).
func fail(code, detail string) *apiError {
	return &apiError{status: statusOf(code), code: code, detail: detail}
}

// failf is fail with a formatted detail.
func failf(code, format string, a ...any) *apiError { return fail(code, fmt.Sprintf(format, a...)) }

// with adds extension members to the problem document.
func (e *apiError) with(ext map[string]any) *apiError { e.ext = ext; return e }

// audited says the refusal needs no record from the edge (see recorded).
func (e *apiError) audited() *apiError { e.recorded = true; return e }

// statusOf is the HTTP status of each code (wire.Codes): the one table. sql_error's
// status depends on SQLite's error (sqlStatus) and is set where it is made.
func statusOf(code string) int {
	switch code {
	case wire.CodeInvalidJSON, wire.CodeUnknownField, wire.CodeBadRequest, wire.CodeLimitExceeded, wire.CodeSQLError:
		return http.StatusBadRequest
	case wire.CodeUnauthorized:
		return http.StatusUnauthorized
	case wire.CodeForbidden, wire.CodeStatementRefused, wire.CodeApprovalRequired, wire.CodeApprovalUnavailable:
		return http.StatusForbidden
	case wire.CodeNotFound:
		return http.StatusNotFound
	case wire.CodeMethod:
		return http.StatusMethodNotAllowed
	case wire.CodeTimeout:
		return http.StatusRequestTimeout
	case wire.CodeUnsafeFile, wire.CodeApprovalInvalid, wire.CodeWorkspaceBusy, wire.CodeSessionBusy:
		return http.StatusConflict
	case wire.CodeSessionLost:
		return http.StatusGone
	case wire.CodeBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case wire.CodeUnsupportedMed:
		return http.StatusUnsupportedMediaType
	case wire.CodeQueueFull, wire.CodeCallerLimit, wire.CodeConnLimit, wire.CodeTooManyPending, wire.CodeSessionLimit:
		return http.StatusTooManyRequests
	case wire.CodeDisabled, wire.CodeNotReady, wire.CodeNotAlive, wire.CodeStopping, wire.CodeAuditDown, wire.CodeBackendUnavailable:
		return http.StatusServiceUnavailable
	case wire.CodeQuota:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// retryAfter is the Retry-After of a code's answer, in seconds, or "": a refusal
// that passes with time says when to try again.
func retryAfter(code string) string {
	switch code {
	case wire.CodeQueueFull, wire.CodeCallerLimit, wire.CodeConnLimit:
		return "1"
	case wire.CodeTooManyPending, wire.CodeSessionLimit:
		return "60"
	}
	return ""
}

// problemOf maps an error to its refusal: an *apiError as it is; the errors of the
// parts the API drives (the run manager, workspaces, the SQL tool), each to its code
// with the error's own words; echo's own (no route, wrong method); anything else is
// internal_error.
func problemOf(err error) *apiError {
	var e *apiError
	if errors.As(err, &e) {
		return e
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return fail(wire.CodeNotFound, fmt.Sprint(he.Message))
		case http.StatusMethodNotAllowed:
			return fail(wire.CodeMethod, fmt.Sprint(he.Message))
		}
		return &apiError{status: he.Code, code: wire.CodeInternal, detail: fmt.Sprint(he.Message)}
	}
	for _, m := range []struct {
		target error
		code   string
	}{
		{runs.ErrQueueFull, wire.CodeQueueFull},
		{runs.ErrCallerLimit, wire.CodeCallerLimit},
		{runs.ErrStopping, wire.CodeStopping},
		{sessions.ErrStopping, wire.CodeStopping},
		{sessions.ErrNotFound, wire.CodeNotFound},
		{sessions.ErrBusy, wire.CodeSessionBusy},
		{sessions.ErrLimit, wire.CodeSessionLimit},
		{sessions.ErrLost, wire.CodeSessionLost},
		{sandbox.ErrBadRequest, wire.CodeBadRequest},
		{sandbox.ErrUnavailable, wire.CodeBackendUnavailable},
		{workspace.ErrBadPath, wire.CodeBadRequest},
		{workspace.ErrNotFound, wire.CodeNotFound},
		{workspace.ErrUnsafe, wire.CodeUnsafeFile},
		{workspace.ErrTooManyEntries, wire.CodeUnsafeFile},
		{workspace.ErrChanged, wire.CodeWorkspaceBusy},
		{workspace.ErrQuota, wire.CodeQuota},
		{workspace.ErrAttached, wire.CodeForbidden},
		{errWorkspaceBusy, wire.CodeWorkspaceBusy},
		{sqltool.ErrBadRequest, wire.CodeBadRequest},
	} {
		if errors.Is(err, m.target) {
			return fail(m.code, err.Error())
		}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// A body (an upload's, say) stalled past the server's read timeout.
		return fail(wire.CodeTimeout, "the body did not arrive within runs.request_timeout")
	}
	return fail(wire.CodeInternal, err.Error())
}

// AsProblem is the problem document err would be answered with (the same table as
// the API's own answers), for a program that serves the API's tools without a
// daemon (`sandcell mcp --workspace`).
func AsProblem(err error) *wire.Problem {
	e := problemOf(err)
	p := wire.NewProblem(e.status, e.code, e.detail)
	return &p
}

// Refusal is the problem document of code with detail, with the code's status.
func Refusal(code, detail string) *wire.Problem {
	p := wire.NewProblem(statusOf(code), code, detail)
	return &p
}

// refusalKinds is the record a refusal of each route gets when the handler has not
// recorded its outcome: a request that could have run code or a statement leaves a
// trace even when it did not.
func refusalKinds(route string) store.Kind {
	switch {
	case route == "POST /v1/runs":
		return store.RunRefused
	case route == "POST /v1/sql":
		return store.SQLRefused
	case strings.Contains(route, " /v1/workspaces"):
		return store.WorkspaceRefused
	case strings.HasSuffix(route, " /mcp"):
		return store.MCPRefused
	case strings.Contains(route, " /v1/sessions"):
		return store.SessionRefused
	}
	return ""
}

// errorHandler is the API's one error edge (echo's HTTPErrorHandler): every error a
// handler or middleware returns becomes a problem document here, and a refusal not
// yet recorded is recorded here.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	e := problemOf(err)
	kind := e.kind
	if kind == "" {
		kind = refusalKinds(c.Request().Method + " " + c.Path())
	}
	if kind != "" && !e.recorded {
		d := map[string]any{"status": e.status, "code": e.code, "detail": e.detail,
			"method": c.Request().Method, "path": c.Request().URL.Path}
		for k, v := range e.record {
			if _, own := d[k]; !own {
				d[k] = v
			}
		}
		// If it cannot be recorded, the caller still gets its answer (at once, when
		// nothing of the request was recorded and the log is known to be down).
		s.recordRefusal(c.Request().Context(), kind, d)
	}
	if ra := retryAfter(e.code); ra != "" {
		c.Response().Header().Set("Retry-After", ra)
	}
	wire.WriteProblem(c.Response(), wire.NewProblem(e.status, e.code, e.detail), e.ext)
}

// decode reads a JSON body strictly: at most MaxBodyBytes (413 beyond, before reading
// the rest), UTF-8, no unknown, repeated or differently cased members, one value.
func (s *Server) decode(c echo.Context, v any) error {
	r := c.Request()
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return fail(wire.CodeUnsupportedMed, "send application/json")
		}
	}
	tooLarge := failf(wire.CodeBodyTooLarge, "at most %d bytes are accepted", s.o.MaxBodyBytes)
	if r.ContentLength > s.o.MaxBodyBytes {
		return tooLarge
	}
	raw, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.o.MaxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return problemOf(err)
	case err != nil:
		return fail(wire.CodeInvalidJSON, err.Error())
	case !utf8.Valid(raw):
		return fail(wire.CodeInvalidJSON, "the body is not valid UTF-8")
	}
	if code, err := checkKeys(raw); err != nil {
		return fail(code, err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("more than one JSON value in the body")
	}
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return fail(wire.CodeUnknownField, err.Error())
	case errors.As(err, &typeErr):
		// Name the member and the JSON type given, not the Go types behind them.
		return failf(wire.CodeInvalidJSON, "member %q: a JSON %s is not accepted here", typeErr.Field, typeErr.Value)
	default:
		return fail(wire.CodeInvalidJSON, err.Error())
	}
}

// checkKeys refuses what encoding/json would quietly accept: a member name given
// twice in any object (the last would win), a member of the request's own objects
// (the body and its "limits") in other letter case ("CODE" for "code"), and an
// escaped lone surrogate in any string (it would become U+FFFD, so the code run would
// not be the code sent).
//
// A recased member is CodeUnknownField; the others are CodeInvalidJSON.
func checkKeys(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	type frame struct {
		object, schema bool
		keys           map[string]bool
		key            bool   // the next string token is a member name
		last           string // the last member name
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", nil // io.EOF, or a syntax error, which is the decoder's to report
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				schema := top == nil || (top.schema && len(stack) == 1 && top.last == "limits")
				stack = append(stack, &frame{object: true, schema: schema, keys: map[string]bool{}, key: true})
				continue
			case '[':
				stack = append(stack, &frame{})
				continue
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if top != nil && top.object && top.key {
				if top.keys[t] {
					return wire.CodeInvalidJSON, fmt.Errorf("member %q is given twice", t)
				}
				if top.schema && t != strings.ToLower(t) {
					return wire.CodeUnknownField, fmt.Errorf("member %q: the request's member names are lower case", t)
				}
				top.keys[t], top.key, top.last = true, false, t
				continue
			}
			// U+FFFD that the body did not spell (as the character or as \ufffd) came
			// from a lone surrogate.
			if strings.ContainsRune(t, utf8.RuneError) && !bytes.Contains(raw, []byte("\uFFFD")) &&
				!bytes.Contains(bytes.ToLower(raw), []byte(`\ufffd`)) {
				return wire.CodeInvalidJSON, errors.New("a string holds an escaped lone surrogate, which is not a character")
			}
		}
		// A value ended: in an object, the next string is a member name again.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].key = true
		}
	}
}
