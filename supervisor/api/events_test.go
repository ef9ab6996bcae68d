package api_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/supervisor/wire"
)

type sseEvent struct{ id, event, data string }

// readEvents parses a text/event-stream body, calling each for every event; each
// returns false to stop reading.
func readEvents(t *testing.T, resp *http.Response, each func(sseEvent) bool) {
	t.Helper()
	sc := bufio.NewScanner(resp.Body)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.event != "" && !each(ev) {
				return
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[6:]
		}
	}
}

func (d *daemon) events(t *testing.T, id string, headers ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://sandcell/v1/runs/"+id+"/events", nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

// Output arrives while the run is still going, in order, then the result.
func TestRunEvents(t *testing.T) {
	d := start(t, setup{})
	code := `import sys, time
print('first', flush=True)
time.sleep(1)
sys.stderr.write('warn\n'); sys.stderr.flush()
sys.stdout.buffer.write(b'\xff\xfe'); sys.stdout.flush()
print('last')`
	body, _ := json.Marshal(map[string]any{"code": code, "wait": false})
	resp, b := d.do(t, "POST", "/v1/runs", string(body))
	var v wire.View
	if resp.StatusCode != 202 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	stream := d.events(t, v.ID)
	defer stream.Body.Close()
	var got []string
	streams := map[string]string{}
	var result wire.View
	readEvents(t, stream, func(ev sseEvent) bool {
		if ev.event == "result" {
			if err := json.Unmarshal([]byte(ev.data), &result); err != nil {
				t.Fatalf("result: %v %s", err, ev.data)
			}
			return false
		}
		var out struct{ Data, Encoding string }
		if err := json.Unmarshal([]byte(ev.data), &out); err != nil {
			t.Fatalf("%s: %v %s", ev.event, err, ev.data)
		}
		if len(got) == 0 {
			// The first line is streamed while the program sleeps.
			_, b := d.do(t, "GET", "/v1/runs/"+v.ID, "")
			if !strings.Contains(string(b), `"state":"running"`) {
				t.Errorf("first chunk arrived after the run: %s", b)
			}
		}
		if out.Encoding == "base64" {
			raw, _ := base64.StdEncoding.DecodeString(out.Data)
			out.Data = string(raw)
		}
		if ev.id != strconv.Itoa(len(got)) {
			t.Errorf("event %d has id %s", len(got), ev.id)
		}
		got = append(got, ev.event)
		streams[ev.event] += out.Data
		return true
	})
	// Each stream in order (the two streams are separate pipes: their relative order
	// is not kept).
	if got[0] != "stdout" || streams["stdout"] != "first\n\xff\xfelast\n" || streams["stderr"] != "warn\n" {
		t.Fatalf("events %q: %q", got, streams)
	}
	if result.State != wire.Done || result.Result == nil || string(result.Result.Stdout) != "first\n\xff\xfelast\n" {
		t.Fatalf("result: %+v", result)
	}
	// After the end, the whole output is replayed; Last-Event-ID resumes after an id.
	stream = d.events(t, v.ID, "Last-Event-ID", "1")
	defer stream.Body.Close()
	var resumed []string
	readEvents(t, stream, func(ev sseEvent) bool { resumed = append(resumed, ev.id+ev.event); return true })
	want := []string{}
	for i, e := range got[2:] {
		want = append(want, strconv.Itoa(i+2)+e)
	}
	if strings.Join(resumed, ",") != strings.Join(append(want, "result"), ",") {
		t.Fatalf("resumed: %v, events %v", resumed, got)
	}
	resp, b = d.do(t, "GET", "/v1/runs/"+v.ID+"/events", "", "Last-Event-ID", "x")
	wantProblem(t, resp, b, 400, "bad_request")
	resp, b = d.do(t, "GET", "/v1/runs/nope/events", "")
	wantProblem(t, resp, b, 404, "not_found")
}
