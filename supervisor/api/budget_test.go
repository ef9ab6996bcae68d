package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// heap is the daemon's live heap after a collection (the tests serve the daemon in
// this process).
func heap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// metric reads one sample of /metrics (name with its labels, as printed).
func (d *daemon) metric(t *testing.T, sample string) float64 {
	t.Helper()
	_, body := d.do(t, "GET", "/metrics", "")
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var f float64
			fmt.Sscanf(v, "%g", &f)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", sample)
	return 0
}

// A SQL statement's result is its HTTP answer: nothing of it is kept afterwards
// (15 SELECTs of 20 MB each had been kept for an hour: 372 MB of heap).
func TestSQLResultsNotKept(t *testing.T) {
	d, ws, _ := sqlDaemon(t, setup{})
	before := heap()
	const rows = 2000 // of 2,000 hex digits: 4 MB of JSON each time
	for i := 0; i < 10; i++ {
		code, m := d.sql(t, map[string]any{"workspace": ws, "db": "t.db", "max_rows": rows,
			"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 2000) SELECT hex(randomblob(1000)) FROM c"})
		if code != 200 || len(m["rows"].([]any)) != rows {
			t.Fatalf("select %d: %d %v", i, code, m["code"])
		}
	}
	grew := heap() - before
	kept := d.metric(t, `sandcell_kept_bytes{runs="finished"}`)
	t.Logf("after 10 SELECTs of 4 MB: heap grew %d KiB, kept %g bytes", grew>>10, kept)
	if kept > 64<<10 {
		t.Errorf("%g bytes kept for finished runs after only SQL statements", kept)
	}
	if grew > 8<<20 {
		t.Errorf("the heap grew by %d MiB", grew>>20)
	}
}

// A run's output is held once while it runs (it was held twice: the capture buffer
// and the copy for the event stream), and what is kept shows in /metrics.
func TestOutputHeldOnce(t *testing.T) {
	d := start(t, setup{})
	before := heap()
	const size = 48 << 20
	resp, b := d.do(t, "POST", "/v1/runs", `{"code": "import os, time\nos.write(1, b'x' * (48 << 20))\nopen('/ws/written', 'w').close()\ntime.sleep(30)", "wait": false, "limits": {"max_output_bytes": 67108864, "memory_mib": 256}}`)
	var v wire.View
	if resp.StatusCode != 202 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("start: %d %s", resp.StatusCode, b)
	}
	defer d.do(t, "DELETE", "/v1/runs/"+v.ID, "")
	deadline := time.Now().Add(30 * time.Second)
	for d.metric(t, `sandcell_kept_bytes{runs="running"}`) < size {
		if time.Now().After(deadline) {
			t.Fatal("the output did not arrive")
		}
		time.Sleep(50 * time.Millisecond)
	}
	grew := heap() - before
	t.Logf("48 MiB of output in flight: heap grew %d MiB", grew>>20)
	if grew > size*3/2 {
		t.Errorf("48 MiB of output in flight grew the heap by %d MiB: held more than once", grew>>20)
	}
}

// 300,000 one-byte writes with a reader following the event stream make a few
// events, not one per write (they had made up to 149,000), and every byte arrives.
func TestTinyWritesMerge(t *testing.T) {
	d := start(t, setup{})
	resp, b := d.do(t, "POST", "/v1/runs", `{"code": "import os, time\ntime.sleep(0.3)\nfor i in range(300000):\n    os.write(1, b'x')", "wait": false}`)
	var v wire.View
	if resp.StatusCode != 202 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("start: %d %s", resp.StatusCode, b)
	}
	ev := d.events(t, v.ID)
	defer ev.Body.Close()
	events, bytes := 0, 0
	sc := bufio.NewScanner(ev.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "event: stdout" {
			events++
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok && events > 0 && !strings.Contains(data, `"result"`) {
			var e struct{ Data string }
			if json.Unmarshal([]byte(data), &e) == nil {
				bytes += len(e.Data)
			}
		}
		if line == "event: result" {
			break
		}
	}
	t.Logf("300000 one-byte writes: %d events", events)
	if bytes != 300000 {
		t.Fatalf("%d bytes in the events", bytes)
	}
	if events > 3000 {
		t.Fatalf("%d events for 300000 one-byte writes", events)
	}
}

// A workspace holding 20,000 names, past its quota (made here on the host: a run is
// ended once it is measured past, but it may pass the quota between two measures,
// and a daemon before this one did not measure), is listed a page at a time and
// counted only up to the quota (one request had listed all 20,015 names: 57 MiB of
// JSON, 375 MiB allocated), and the next run is refused for the quota.
func TestListingBounded(t *testing.T) {
	d := start(t, setup{})
	id := d.newWorkspace(t)
	for i := 0; i < 20000; i++ {
		if err := os.WriteFile(filepath.Join(d.workspaces, id, "files", fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, body := d.do(t, "GET", "/v1/workspaces/"+id, "")
	runtime.ReadMemStats(&after)
	var w struct {
		Files []struct{ Path string } `json:"files"`
		Next  string                  `json:"next"`
		Usage struct {
			Files   int  `json:"files"`
			AtLeast bool `json:"at_least"`
		} `json:"usage"`
		OverQuota bool `json:"over_quota"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &w) != nil {
		t.Fatalf("get: %d %.300s", resp.StatusCode, body)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("20,000 names: a page of %d, %d bytes of JSON, %d KiB allocated", len(w.Files), len(body), allocated>>10)
	if len(w.Files) != 1000 || w.Next != "f00999" || !w.OverQuota || !w.Usage.AtLeast || w.Usage.Files != 101 {
		t.Fatalf("page: %d names, next %q, usage %+v, over %v", len(w.Files), w.Next, w.Usage, w.OverQuota)
	}
	if allocated > 32<<20 {
		t.Errorf("one listing allocated %d MiB", allocated>>20)
	}
	resp, body = d.do(t, "GET", "/v1/workspaces/"+id+"?after=f19990&limit=100", "")
	w.Files, w.Next = nil, ""
	if resp.StatusCode != 200 || json.Unmarshal(body, &w) != nil || len(w.Files) != 9 || w.Next != "" {
		t.Fatalf("last page: %d %d names, next %q", resp.StatusCode, len(w.Files), w.Next)
	}
	if resp, _ := d.do(t, "GET", "/v1/workspaces/"+id+"?limit=0", ""); resp.StatusCode != 400 {
		t.Fatalf("limit=0: %d", resp.StatusCode)
	}
	if resp, body := d.do(t, "POST", "/v1/runs", `{"workspace":"`+id+`","code":"print(1)"}`); resp.StatusCode != 507 {
		t.Fatalf("a run in the full workspace: %d %s", resp.StatusCode, body)
	}
}

// A reader that stops reading an event stream holds one event's worth of the
// output, not copies of it (8 MiB of control bytes had become 48 MiB of JSON per
// reader, held while the write blocked).
func TestStalledEventReaders(t *testing.T) {
	d := start(t, setup{})
	v := d.run(t, `{"code": "import os\nos.write(1, b'\\x01' * (8 << 20))", "limits": {"max_output_bytes": 16777216}}`)
	if len(v.Result.Stdout) != 8<<20 {
		t.Fatalf("run: %d bytes", len(v.Result.Stdout))
	}
	before := heap()
	var streams []io.Closer
	for i := 0; i < 3; i++ {
		resp := d.events(t, v.ID) // never read
		streams = append(streams, resp.Body)
	}
	time.Sleep(time.Second)
	grew := heap() - before
	for _, s := range streams {
		s.Close()
	}
	t.Logf("3 stalled readers of 8 MiB of output: heap grew %d KiB", grew>>10)
	if grew > 8<<20 {
		t.Fatalf("3 stalled readers grew the heap by %d MiB", grew>>20)
	}
}

// The daemon's soft memory limit follows its budgets (without one, 17 results of
// 64 MiB left a resident size of 800 MB against a kept budget of 256 MiB: the
// collector's garbage and idle heap), unless GOMEMLIMIT says otherwise.
func TestMemoryLimitFromBudgets(t *testing.T) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		t.Skip("GOMEMLIMIT is set: the daemon keeps it")
	}
	d := start(t, setup{})
	limit := debug.SetMemoryLimit(-1)
	want := d.cfg.Runs.MaxRetainedOutputBytes + int64(d.cfg.Concurrency())*(2*d.cfg.Limits.Max.MaxOutputBytes+2*16<<20) + 256<<20
	if limit != want || limit != d.cfg.MemoryLimit() {
		t.Fatalf("soft memory limit %d MiB, want %d MiB", limit>>20, want>>20)
	}
}
