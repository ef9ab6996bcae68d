package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// sseKeepAlive is how often a comment line is sent on an idle event stream, so
// proxies and clients with read timeouts keep it open.
const sseKeepAlive = 15 * time.Second

// outputEvent is the data of a "stdout" or "stderr" event: the chunk as text when it
// is valid UTF-8, otherwise base64 with encoding "base64" (a chunk may end inside a
// character; concatenate decoded chunks before decoding text).
type outputEvent struct {
	Data     string `json:"data"`
	Encoding string `json:"encoding,omitempty"`
}

// runEvents answers GET /v1/runs/{id}/events with server-sent events (the WHATWG
// HTML "Server-sent events" format): "stdout" and "stderr" events carrying the
// output from the start of the run, as it is produced, each with an id (its index,
// so a client reconnecting with Last-Event-ID resumes after it), then one "result"
// event with the run as GET /v1/runs/{id} shows it, after which the stream ends.
// sseCoalesce is how long the event stream lets output gather before it reads more.
const sseCoalesce = 20 * time.Millisecond

func (s *Server) runEvents(c echo.Context) error {
	run, err := s.o.Service.Get(c.Param("id"))
	if err != nil || !s.visible(c, run) {
		return problem(c, http.StatusNotFound, CodeNotFound, "no run "+c.Param("id"))
	}
	next := 0
	if v := c.Request().Header.Get("Last-Event-ID"); v != "" {
		// An id this stream has sent: chunks only ever grow, so anything at or past
		// their count now was never sent.
		_, count, _, _ := run.Output(1 << 62)
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= count {
			return problem(c, http.StatusBadRequest, CodeBadRequest, "Last-Event-ID: an event id this stream has sent")
		}
		next = n + 1
	}
	w := c.Response()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ctx := c.Request().Context()
	keepAlive := time.NewTicker(sseKeepAlive)
	defer keepAlive.Stop()
	for {
		chunks, after, done, changed := run.Output(next)
		for i, ch := range chunks {
			ev := outputEvent{Data: string(ch.Data)}
			if !utf8.Valid(ch.Data) {
				ev = outputEvent{Data: base64.StdEncoding.EncodeToString(ch.Data), Encoding: "base64"}
			}
			b, _ := json.Marshal(ev)
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", next+i, ch.Stream, b); err != nil {
				return nil
			}
		}
		next = after
		if done {
			// One data line: JSON escapes every newline inside strings.
			fmt.Fprint(w, "event: result\ndata: ")
			run.View().WriteJSON(w)
			fmt.Fprint(w, "\n\n")
			w.Flush()
			return nil
		}
		w.Flush()
		select {
		case <-changed:
			// Let more output gather into the same chunks (a chunk not yet read
			// grows), unless the run has ended: events follow bytes, not writes.
			select {
			case <-run.Done():
			case <-time.After(sseCoalesce):
			}
		case <-keepAlive.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return nil
			}
			w.Flush()
		case <-ctx.Done():
			return nil
		}
	}
}
