package api_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/sessions"
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

// heapPeak samples the heap (its objects, live or not yet collected:
// MemStats.HeapAlloc) every millisecond until the function it returns is called,
// which returns the highest sample.
func heapPeak() func() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	done, peak := make(chan struct{}), make(chan uint64)
	go func() {
		var most uint64
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			most = max(most, sample[0].Value.Uint64())
			select {
			case <-done:
				peak <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-peak }
}

// peakRSS returns this process's peak resident size since the last resetPeakRSS
// (VmHWM, proc(5)), in bytes.
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kib << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// resetPeakRSS makes VmHWM the resident size now (proc(5), /proc/PID/clear_refs).
func resetPeakRSS(t *testing.T) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Logf("peak RSS not reset: %v", err)
	}
}

// outputLine is 64 bytes of UTF-8 with characters JSON escapes; outputProgram prints
// it size/64 times, in blocks of 1 MiB, to stdout and, when both, to stderr too.
const outputLine = "éééééééééééééééééééé\"<&>\t\x01xxxxxxxxxxxxxxxxx\n"

func outputProgram(size int, both bool) string {
	code := fmt.Sprintf("import sys\nblock = ('é' * 20 + '\"<&>\\t\\x01' + 'x' * 17 + '\\n').encode() * 16384\n"+
		"for _ in range(%d):\n    sys.stdout.buffer.write(block)\n", size>>20)
	if both {
		code += "    sys.stderr.buffer.write(block)\n"
	}
	b, _ := json.Marshal(map[string]any{"code": code, "limits": map[string]any{"max_output_bytes": size}})
	return string(b)
}

// postTo starts a run with body and waits for its answer, written to a file (not
// held in this process, where the daemon's heap is measured), and returns the file.
func (d *daemon) postTo(t *testing.T, body string) string { return d.postPathTo(t, "/v1/runs", body) }

// postPathTo is postTo for the endpoint at path.
func (d *daemon) postPathTo(t *testing.T, path, body string) string {
	resp, err := d.client.Post("http://sandcell"+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	f, err := os.CreateTemp(t.TempDir(), "answer")
	if err != nil {
		t.Error(err)
		return ""
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil || resp.StatusCode != 200 {
		t.Errorf("answer: %d %v", resp.StatusCode, err)
	}
	return f.Name()
}

// checkAnswer reads the run an answer file holds and checks its streams are n
// bytes of outputLine each (stderr empty unless both), or, when discardable, that
// the kept budget discarded them (a run that ends while another holds the rest of
// the budget in flight loses its output at once).
func checkAnswer(t *testing.T, path string, n int, both, discardable bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	var v wire.View
	if err != nil || json.Unmarshal(b, &v) != nil || v.Result == nil {
		t.Fatalf("answer: %v %.300s", err, b)
	}
	want := strings.Repeat(outputLine, n/len(outputLine))
	wantErr := ""
	if both {
		wantErr = want
	}
	r := v.Result
	if discardable && r.Reason == "exited" && len(r.Stdout)+len(r.Stderr) == 0 &&
		strings.Contains(strings.Join(r.Diagnostics, ";"), "output discarded") {
		t.Logf("run %s: its output was discarded at its end", v.ID)
		return
	}
	if r.Reason != "exited" || r.StdoutTruncated || string(r.Stdout) != want || string(r.Stderr) != wantErr {
		t.Fatalf("run %s: %s, %d and %d bytes (truncated %v %v) %v", v.ID, r.Reason, len(r.Stdout), len(r.Stderr),
			r.StdoutTruncated, r.StderrTruncated, r.Diagnostics)
	}
}

// A run's output is held once, and answered from where it is held: 64 MiB of text
// with characters to escape, printed by a real run and answered as JSON, grows the
// daemon's heap by about its size and allocates about its size. It had grown the
// heap by 2.7-3.0 times the output and allocated 7.5 times it: the output grown by
// appending to one buffer (each growth a copy, the old one left as garbage), then
// escaped for JSON through a copy of every piece.
func TestOutputMemoryPerByte(t *testing.T) {
	d := start(t, setup{})
	const size = 64 << 20 // the policy's most output of a stream
	body := outputProgram(size, false)
	debug.FreeOSMemory() // what earlier tests freed is not counted as resident
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resetPeakRSS(t)
	rssBefore := peakRSS(t)
	stop := heapPeak()
	answer := d.postTo(t, body)
	peak := stop()
	runtime.ReadMemStats(&after)
	rss := peakRSS(t)
	if t.Failed() {
		t.FailNow()
	}
	grew := int64(peak) - int64(before.HeapAlloc)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("64 MiB of output and its answer: heap %d MiB, peak %d MiB: %.2f bytes per byte of output; "+
		"allocated %d MiB: %.2f per byte; peak RSS %d MiB from %d MiB (the soft limit is %d MiB)",
		before.HeapAlloc>>20, peak>>20, float64(grew)/size, allocated>>20, float64(allocated)/size,
		rss>>20, rssBefore>>20, d.cfg.MemoryLimit()>>20)
	checkAnswer(t, answer, size, false, false)
	perByte(t, "64 MiB of output", grew, int64(allocated), size)
}

// A cell's output is held once too: its most (sessions.MaxCellOutputBytes, 16 MiB)
// grows the heap by about its size and allocates about it. It had been appended to
// one buffer, each growth a copy.
func TestCellOutputMemoryPerByte(t *testing.T) {
	d := start(t, setup{})
	const size = sessions.MaxCellOutputBytes
	id := d.openSession(t, `{"limits": {"max_output_bytes": 16777216}}`)
	var run map[string]any
	json.Unmarshal([]byte(outputProgram(size, false)), &run)
	body, _ := json.Marshal(map[string]any{"code": run["code"]})
	debug.FreeOSMemory()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := heapPeak()
	answer := d.postPathTo(t, "/v1/sessions/"+id+"/cells", string(body))
	peak := stop()
	runtime.ReadMemStats(&after)
	if t.Failed() {
		t.FailNow()
	}
	grew := int64(peak) - int64(before.HeapAlloc)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("a cell's 16 MiB of output and its answer: %.2f bytes of heap per byte, %.2f allocated",
		float64(grew)/size, float64(allocated)/size)
	b, err := os.ReadFile(answer)
	var a wire.CellAnswer
	if err != nil || json.Unmarshal(b, &a) != nil {
		t.Fatalf("answer: %v %.300s", err, b)
	}
	if r := a.Result; r.Reason != "exited" || r.StdoutTruncated || string(r.Stdout) != strings.Repeat(outputLine, size/len(outputLine)) {
		t.Fatalf("cell: %s, %d bytes (truncated %v) %v", r.Reason, len(r.Stdout), r.StdoutTruncated, r.Diagnostics)
	}
	perByte(t, "a cell's 16 MiB of output", grew, int64(allocated), size)
}

// perByte fails the test unless what (size bytes of output) grew the heap by at
// most 1.5 bytes per byte of output and allocated at most that.
func perByte(t *testing.T, what string, grew, allocated, size int64) {
	t.Helper()
	if grew > size*3/2 {
		t.Errorf("%s grew the heap by %d MiB (%.2f per byte, at most 1.5)", what, grew>>20, float64(grew)/float64(size))
	}
	if allocated > size*3/2 {
		t.Errorf("%s allocated %d MiB (%.2f per byte, at most 1.5)", what, allocated>>20, float64(allocated)/float64(size))
	}
}

// A reader following a run's events costs no copies of its output either: 64 MiB
// of text, streamed as events while the run goes, then the result, grow the heap
// by about the output's size and allocate about it. Each event had been a string
// copy of its piece, its JSON and a formatted copy of that.
func TestEventsMemoryPerByte(t *testing.T) {
	d := start(t, setup{})
	const size = 64 << 20
	var req map[string]any
	json.Unmarshal([]byte(outputProgram(size, false)), &req)
	req["wait"] = false
	body, _ := json.Marshal(req)
	debug.FreeOSMemory()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := heapPeak()
	resp, b := d.do(t, "POST", "/v1/runs", string(body))
	var v wire.View
	if resp.StatusCode != 202 || json.Unmarshal(b, &v) != nil {
		stop()
		t.Fatalf("start: %d %s", resp.StatusCode, b)
	}
	events := d.events(t, v.ID)
	f, err := os.Create(filepath.Join(t.TempDir(), "events"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(f, events.Body) // the stream ends after the result
	events.Body.Close()
	f.Close()
	peak := stop()
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	grew := int64(peak) - int64(before.HeapAlloc)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("64 MiB of output followed as events: heap %d MiB, peak %d MiB: %.2f bytes per byte of output; "+
		"allocated %d MiB: %.2f per byte", before.HeapAlloc>>20, peak>>20, float64(grew)/size, allocated>>20,
		float64(allocated)/size)
	// Every byte arrived, in order, and the result (its data line as long as the
	// output, past what readEvents reads).
	stream, err := os.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var got strings.Builder
	var result wire.View
	lines := bufio.NewReader(stream)
	for event := ""; ; {
		line, err := lines.ReadString('\n')
		if err != nil {
			break
		}
		line = strings.TrimSuffix(line, "\n")
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
		}
		data, ok := strings.CutPrefix(line, "data: ")
		switch {
		case !ok:
		case event == "result":
			json.Unmarshal([]byte(data), &result)
		default:
			var e struct{ Data, Encoding string }
			json.Unmarshal([]byte(data), &e)
			if e.Encoding == "base64" {
				raw, _ := base64.StdEncoding.DecodeString(e.Data)
				e.Data = string(raw)
			}
			got.WriteString(e.Data)
		}
	}
	if want := strings.Repeat(outputLine, size/len(outputLine)); got.String() != want || result.Result == nil ||
		string(result.Result.Stdout) != want {
		t.Fatalf("events: %d bytes, result %v", got.Len(), result.Result != nil)
	}
	perByte(t, "64 MiB of output followed as events", grew, int64(allocated), size)
}

// The daemon's resident size stays within its soft memory limit (config's
// MemoryLimit: the kept budget, two streams at the most output per worker, 256 MiB
// for the rest) with its workers at the most output they may make: two rounds of
// two runs at once, each 64 MiB on stdout and on stderr, answered as JSON, the
// second round's while the first's results are kept.
func TestMemoryWithinSoftLimit(t *testing.T) {
	d := start(t, setup{})
	const size = 64 << 20
	body := outputProgram(size, true)
	limit := d.cfg.MemoryLimit()
	debug.FreeOSMemory() // what earlier tests freed is not counted as resident
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resetPeakRSS(t)
	rssBefore := peakRSS(t)
	stop := heapPeak()
	var answers []string
	for round := 0; round < 2; round++ {
		got := make(chan string, 2)
		for i := 0; i < 2; i++ {
			go func() { got <- d.postTo(t, body) }()
		}
		answers = append(answers, <-got, <-got)
	}
	peak := stop()
	runtime.ReadMemStats(&after)
	rss := peakRSS(t)
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("2 rounds of 2 runs at once, 128 MiB of output each: heap %d MiB, peak %d MiB; allocated %d MiB; "+
		"peak RSS %d MiB from %d MiB; the soft limit is %d MiB", before.HeapAlloc>>20, peak>>20,
		(after.TotalAlloc-before.TotalAlloc)>>20, rss>>20, rssBefore>>20, limit>>20)
	for _, a := range answers {
		checkAnswer(t, a, size, true, true)
	}
	if rss > limit {
		t.Errorf("peak RSS %d MiB, over the soft limit of %d MiB", rss>>20, limit>>20)
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
