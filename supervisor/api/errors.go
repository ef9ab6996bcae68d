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
	"github.com/sandcell/sandcell/supervisor/wire"
)

// problem answers a problem document (wire.NewProblem: the one way one is built).
func problem(c echo.Context, status int, code, detail string) error {
	return problemWith(c, status, code, detail, nil)
}

// problemWith answers a problem with extension members (RFC 9457 section 3.2).
func problemWith(c echo.Context, status int, code, detail string, ext map[string]any) error {
	return c.Blob(status, wire.ContentType, wire.NewProblem(status, code, detail).JSON(ext))
}

func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		code := wire.CodeInternal
		switch he.Code {
		case http.StatusNotFound:
			code = wire.CodeNotFound
		case http.StatusMethodNotAllowed:
			code = wire.CodeMethod
		}
		problem(c, he.Code, code, fmt.Sprint(he.Message))
		return
	}
	problem(c, http.StatusInternalServerError, wire.CodeInternal, "")
}

type badRequest struct {
	status       int
	code, detail string
}

// decode reads a JSON body strictly: at most MaxBodyBytes (413 beyond, before reading
// the rest), UTF-8, no unknown, repeated or differently cased members, one value.
func (s *Server) decode(c echo.Context, v any) *badRequest {
	r := c.Request()
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return &badRequest{http.StatusUnsupportedMediaType, wire.CodeUnsupportedMed, "send application/json"}
		}
	}
	tooLarge := &badRequest{http.StatusRequestEntityTooLarge, wire.CodeBodyTooLarge,
		fmt.Sprintf("at most %d bytes are accepted", s.o.MaxBodyBytes)}
	if r.ContentLength > s.o.MaxBodyBytes {
		return tooLarge
	}
	raw, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.o.MaxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &badRequest{http.StatusRequestTimeout, wire.CodeTimeout, "the body did not arrive within the read timeout"}
	case err != nil:
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, err.Error()}
	case !utf8.Valid(raw):
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, "the body is not valid UTF-8"}
	}
	if code, err := checkKeys(raw); err != nil {
		return &badRequest{http.StatusBadRequest, code, err.Error()}
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
		return &badRequest{http.StatusBadRequest, wire.CodeUnknownField, err.Error()}
	case errors.As(err, &typeErr):
		// Name the member and the JSON type given, not the Go types behind them.
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, fmt.Sprintf(
			"member %q: a JSON %s is not accepted here", typeErr.Field, typeErr.Value)}
	default:
		return &badRequest{http.StatusBadRequest, wire.CodeInvalidJSON, err.Error()}
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
