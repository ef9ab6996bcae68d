package api

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// sseKeepAlive is how often a comment line is sent on an idle event stream, so
// proxies and clients with read timeouts keep it open.
const sseKeepAlive = 15 * time.Second

// eventPiece bounds the output one event carries, in bytes: a larger chunk goes as
// several events, of which only the last has the chunk's id, so what encoding an
// event costs (a control byte is six in JSON) is bounded per event, not per chunk,
// and a reader that stops reading holds one piece, not copies of the whole output.
const eventPiece = 16 << 10

// writeChunk writes chunk id of stream as events of at most eventPiece bytes each
// (split at character boundaries where the text is UTF-8). An event's data is its
// piece as text when that is valid UTF-8, {"data": text}, otherwise base64, {"data":
// base64, "encoding": "base64"} (a chunk may end inside a character; concatenate
// decoded chunks before decoding text), escaped or encoded from the chunk itself
// into a buffer, w's own when w is a *bufio.Writer: the output is not copied. It
// returns false when the client is gone.
func writeChunk(w io.Writer, id int, stream string, data []byte) bool {
	bw, buffered := w.(*bufio.Writer)
	if !buffered {
		bw = bufio.NewWriterSize(w, 4<<10)
	}
	return writeEvents(bw, id, stream, data) && (buffered || bw.Flush() == nil)
}

// writeEvents is writeChunk into w's buffer (w reports a write that failed at the
// latest when it is flushed).
func writeEvents(w *bufio.Writer, id int, stream string, data []byte) bool {
	for len(data) > 0 {
		n := min(len(data), eventPiece)
		for n < len(data) && n > eventPiece-utf8.UTFMax && !utf8.RuneStart(data[n]) {
			n--
		}
		piece := data[:n]
		data = data[n:]
		if len(data) == 0 {
			w.WriteString("id: ")
			w.Write(strconv.AppendInt(w.AvailableBuffer(), int64(id), 10))
			w.WriteString("\n")
		}
		w.WriteString("event: ")
		w.WriteString(stream)
		w.WriteString("\ndata: {\"data\":\"")
		if utf8.Valid(piece) {
			protocol.WriteJSONText(w, piece)
			w.WriteString(`"}`)
		} else {
			enc := base64.NewEncoder(base64.StdEncoding, w)
			enc.Write(piece)
			enc.Close()
			w.WriteString(`","encoding":"base64"}`)
		}
		if _, err := w.WriteString("\n\n"); err != nil {
			return false
		}
	}
	return true
}

// sseCoalesce is how long the event stream lets output gather before it reads more.
const sseCoalesce = 20 * time.Millisecond

// runEvents answers GET /v1/runs/{id}/events with server-sent events (the WHATWG
// HTML "Server-sent events" format): "stdout" and "stderr" events carrying the
// output from the start of the run, as it is produced, each chunk's last event with
// an id (its index, so a client reconnecting with Last-Event-ID resumes after it; a
// chunk over eventPiece bytes is several events), then a "display" event for each
// of its displays (protocol.Display, in order), then one "result" event with the
// run as GET /v1/runs/{id} shows it, after which the stream ends.
func (s *Server) runEvents(c echo.Context) error {
	run, err := s.o.Service.Get(c.Param("id"))
	if err != nil || !s.visible(c, run) {
		return fail(wire.CodeNotFound, "no run "+c.Param("id"))
	}
	next := 0
	if v := c.Request().Header.Get("Last-Event-ID"); v != "" {
		// An id this stream has sent: chunks only ever grow, so anything at or past
		// their count now was never sent.
		_, count, _, _ := run.Output(1 << 62)
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= count {
			return fail(wire.CodeBadRequest, "Last-Event-ID: an event id this stream has sent")
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
	bw := bufio.NewWriterSize(w, 32<<10) // empty whenever w is written directly
	for {
		chunks, after, done, changed := run.Output(next)
		for i, ch := range chunks {
			if !writeChunk(bw, next+i, ch.Stream, ch.Data) {
				return nil
			}
		}
		next = after
		if done {
			// One data line each: JSON escapes every newline inside strings.
			view := run.View()
			if view.Result != nil {
				for _, d := range view.Result.Displays {
					b, _ := json.Marshal(d)
					bw.WriteString("event: display\ndata: ")
					bw.Write(b)
					bw.WriteString("\n\n")
				}
			}
			bw.WriteString("event: result\ndata: ")
			view.WriteJSON(bw)
			bw.WriteString("\n\n")
			bw.Flush()
			w.Flush()
			return nil
		}
		if bw.Flush() != nil {
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
