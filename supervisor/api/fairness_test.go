package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/wire"
)

var (
	aliceSecret, aliceToken = api.NewToken("alice", []api.Role{api.RoleRunner})
	bobSecret, bobToken     = api.NewToken("bob", []api.Role{api.RoleRunner})
)

// tcpDo sends one request over TCP with a bearer token and returns the status and
// the answer's members.
func tcpDo(t *testing.T, base, secret, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// One token cannot take every worker and queue place: past its share (running plus
// queued, wait:false included) it gets 429 caller_limit, and another token's run is
// still admitted and gets the next free worker before the first token's queued runs.
func TestFairShareBetweenTokens(t *testing.T) {
	d := start(t, setup{concurrency: 2, queue: 8, perCaller: 4,
		access: &api.Access{Tokens: api.Tokens{aliceToken, bobToken}}})
	base := d.listenTCP(t)
	slow := `{"code": "import time; time.sleep(30)", "wait": false, "limits": {"timeout_ms": 30000}}`
	var ids []string
	for i := 0; i < 4; i++ {
		status, m := tcpDo(t, base, aliceSecret, "POST", "/v1/runs", slow)
		if status != 202 {
			t.Fatalf("alice's run %d: %d %v", i, status, m)
		}
		ids = append(ids, m["id"].(string))
	}
	defer func() {
		for _, id := range ids {
			tcpDo(t, base, aliceSecret, "DELETE", "/v1/runs/"+id, "")
		}
	}()
	if status, m := tcpDo(t, base, aliceSecret, "POST", "/v1/runs", slow); status != 429 || m["code"] != wire.CodeCallerLimit {
		t.Fatalf("alice's fifth run: %d %v", status, m)
	}
	// Bob's run is admitted, and waits for a worker.
	status, m := tcpDo(t, base, bobSecret, "POST", "/v1/runs", slow)
	if status != 202 {
		t.Fatalf("bob's run: %d %v", status, m)
	}
	bob := m["id"].(string)
	defer tcpDo(t, base, bobSecret, "DELETE", "/v1/runs/"+bob, "")
	state := func(secret, id string) any {
		_, m := tcpDo(t, base, secret, "GET", "/v1/runs/"+id, "")
		return m["state"]
	}
	if st := state(bobSecret, bob); st != "queued" {
		t.Fatalf("bob's run is %v", st)
	}
	// One of alice's running runs ends: the worker goes to bob, not to her queued runs.
	for _, id := range ids {
		if state(aliceSecret, id) == "running" {
			tcpDo(t, base, aliceSecret, "DELETE", "/v1/runs/"+id, "")
			break
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for state(bobSecret, bob) != "running" {
		if time.Now().After(deadline) {
			t.Fatal("bob's run did not get the freed worker")
		}
		time.Sleep(10 * time.Millisecond)
	}
	queued := 0
	for _, id := range ids {
		if state(aliceSecret, id) == "queued" {
			queued++
		}
	}
	if queued != 2 {
		t.Fatalf("%d of alice's runs queued, want 2 (bob's run went first)", queued)
	}
}

// Four client addresses holding 64 idle keep-alive connections each (after one
// unauthenticated /livez each) leave no slot free; a probe from a fifth address is
// still answered at once (the longest-idle connection is closed for it), the
// unauthenticated idle connections are closed within seconds, and a connection that
// presented a valid token keeps the ordinary idle timeout.
func TestProbesWithIdleConnections(t *testing.T) {
	d := start(t, setup{access: &api.Access{Tokens: api.Tokens{aliceToken}}})
	addr := d.serveTCP(t)
	type kept struct {
		c net.Conn
		r *bufio.Reader
	}
	request := func(k kept, path, secret string) (int, error) {
		auth := ""
		if secret != "" {
			auth = "Authorization: Bearer " + secret + "\r\n"
		}
		if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: sandcell\r\n%s\r\n", path, auth); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(k.r, nil)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	dial := func(from string) kept {
		dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := dl.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return kept{c, bufio.NewReader(c)}
	}
	var mu sync.Mutex
	var idle []kept
	var wg sync.WaitGroup
	for a := 2; a <= 5; a++ {
		for i := 0; i < 64; i++ {
			wg.Add(1)
			go func(from string) {
				defer wg.Done()
				k := dial(from)
				if status, err := request(k, "/livez", ""); err != nil || status != 200 {
					t.Errorf("/livez from %s: %d %v", from, status, err)
					return
				}
				mu.Lock()
				idle = append(idle, k)
				mu.Unlock()
			}(fmt.Sprintf("127.0.0.%d", a))
		}
	}
	wg.Wait()
	if len(idle) != 256 {
		t.Fatalf("%d idle connections", len(idle))
	}
	authed := dial("127.0.0.6") // 257th: it takes the longest-idle one's slot
	if status, err := request(authed, "/v1/info", aliceSecret); err != nil || status != 200 {
		t.Fatalf("/v1/info with a token: %d %v", status, err)
	}
	start := time.Now()
	probe := dial("127.0.0.1")
	probe.c.SetDeadline(time.Now().Add(3 * time.Second))
	if status, err := request(probe, "/readyz", ""); err != nil || status != 200 {
		t.Fatalf("/readyz with every slot held: %d %v after %s", status, err, time.Since(start))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("/readyz took %s", took)
	}
	// The unauthenticated idle connections are closed by the daemon within seconds.
	time.Sleep(7 * time.Second)
	open := 0
	for _, k := range idle {
		k.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := k.r.ReadByte(); err != io.EOF && !strings.Contains(fmt.Sprint(err), "reset") {
			open++
		}
	}
	if open > 0 {
		t.Fatalf("%d unauthenticated idle connections still open after 7 s", open)
	}
	if status, err := request(authed, "/v1/info", aliceSecret); err != nil || status != 200 {
		t.Fatalf("the authenticated connection was closed when idle: %d %v", status, err)
	}
}

// Connections that announce a body and never send it (4 addresses, 64 each, no
// token) are answered 401 and closed at once, not held for the read timeout: a probe
// is answered at once.
func TestProbesWithSlowBodies(t *testing.T) {
	d := start(t, setup{access: &api.Access{Tokens: api.Tokens{aliceToken}}})
	addr := d.serveTCP(t)
	fromFourAddresses(t, addr, func(c net.Conn) {
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: sandcell\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n")
	})
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET /readyz HTTP/1.1\r\nHost: sandcell\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz behind 256 slow bodies: %v %v after %s", resp, err, time.Since(start))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("/readyz took %s", took)
	}
}

// fromFourAddresses opens 64 connections to addr from each of 127.0.0.2-5 (the
// per-address bound of serveTCP, so 256 in all) and gives each to use.
func fromFourAddresses(t *testing.T, addr string, use func(net.Conn)) {
	t.Helper()
	var wg sync.WaitGroup
	for a := 2; a <= 5; a++ {
		for i := 0; i < 64; i++ {
			wg.Add(1)
			go func(from string) {
				defer wg.Done()
				dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
				if c, err := dl.Dial("tcp", addr); err == nil {
					use(c)
				}
			}(fmt.Sprintf("127.0.0.%d", a))
		}
	}
	wg.Wait()
}

// serveTCP serves the daemon on a loopback port through ListenTCP as the daemon
// does (256 connections, 64 per address) and returns the address.
func (d *daemon) serveTCP(t *testing.T) string {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go d.server.Serve(api.ListenTCP(raw, 256, 64))
	return raw.Addr().String()
}

// Callers with valid access who keep every connection in the middle of a slowly sent
// body (a token's holder from four addresses over TCP; one uid on the Unix socket)
// do not keep the probes waiting: a new connection takes a probe slot, where
// /readyz is answered at once and anything else is 429 connection_limit; not even
// while another address floods the daemon with connections that send nothing.
func TestProbesWhileCallersHoldEveryConnection(t *testing.T) {
	d := start(t, setup{access: &api.Access{Admins: api.Principals{UIDs: map[int]bool{os.Getuid(): true}},
		Tokens: api.Tokens{aliceToken}}})
	addr := d.serveTCP(t)
	hold := func(c net.Conn, token string) {
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: sandcell\r\n%sContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n{", token)
	}
	fromFourAddresses(t, addr, func(c net.Conn) { hold(c, "Authorization: Bearer "+aliceSecret+"\r\n") })
	for i := 0; i < 64; i++ {
		if c, err := net.Dial("unix", d.socket); err == nil {
			hold(c, "")
		}
	}
	time.Sleep(300 * time.Millisecond)
	// Meanwhile one address opens connections that send nothing, as fast as it can.
	flood, flooded := make(chan struct{}), make(chan struct{})
	defer func() { close(flood); <-flooded }()
	go func() {
		defer close(flooded)
		dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: time.Second}
		for {
			select {
			case <-flood:
				return
			default:
			}
			if c, err := dl.Dial("tcp", addr); err == nil {
				time.AfterFunc(2*time.Second, func() { c.Close() })
			}
			time.Sleep(time.Millisecond)
		}
	}()
	ask := func(network, addr, path string) (*http.Response, []byte, time.Duration) {
		t.Helper()
		start := time.Now()
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		time.Sleep(10 * time.Millisecond) // a TLS handshake's time, say
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: sandcell\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s %s behind every connection held: %v after %s", network, path, err, time.Since(start))
		}
		body, _ := io.ReadAll(resp.Body)
		return resp, body, time.Since(start)
	}
	for _, l := range [][2]string{{"tcp", addr}, {"unix", d.socket}} {
		for i := 0; i < 3; i++ { // each connection is closed after its answer: its slot is free again
			resp, body, took := ask(l[0], l[1], "/readyz")
			if resp.StatusCode != 200 || took > 2*time.Second || !resp.Close {
				t.Fatalf("%s /readyz: %d %s after %s, closed: %v", l[0], resp.StatusCode, body, took, resp.Close)
			}
		}
		resp, body, _ := ask(l[0], l[1], "/v1/runs")
		wantProblem(t, resp, body, 429, wire.CodeConnLimit)
	}
}

// A uid that holds every connection it may have, each in the middle of a slowly sent
// body, does not silence its own probes (systemd's and an operator's share a uid
// with the daemon's callers): /readyz and /livez are answered at once on a probe
// slot, anything else is 429 connection_limit; not even while the uid also holds
// its four probe slots with connections that send nothing (the one idle the longest
// is closed for a new one once a second old).
func TestProbesWhileOneUIDHoldsItsConnections(t *testing.T) {
	d := start(t, setup{perUID: 8})
	for i := 0; i < 8+4; i++ {
		c, err := net.Dial("unix", d.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if i < 8 {
			fmt.Fprint(c, "POST /v1/runs HTTP/1.1\r\nHost: sandcell\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n{")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond) // the idle ones are past probeGrace
	for i := 0; i < 3; i++ {
		for _, path := range []string{"/readyz", "/livez"} {
			start := time.Now()
			resp, body := d.do(t, "GET", path, "")
			if resp.StatusCode != 200 || time.Since(start) > 2*time.Second {
				t.Fatalf("%s while the uid holds its connections: %d %s after %s", path, resp.StatusCode, body, time.Since(start))
			}
		}
	}
	resp, body := d.do(t, "GET", "/v1/runs", "")
	wantProblem(t, resp, body, 429, wire.CodeConnLimit)
}

// Every audit record of a TCP caller's request names its token, whatever the kind:
// runs, workspaces and files, statements, approvals.
func TestAuditNamesTheToken(t *testing.T) {
	d := start(t, setup{access: &api.Access{Tokens: api.Tokens{aliceToken, approverToken}}})
	base := d.listenTCP(t)
	status, m := tcpDo(t, base, aliceSecret, "POST", "/v1/workspaces", "")
	ws, _ := m["id"].(string)
	if status != 201 || ws == "" {
		t.Fatalf("workspace: %d %v", status, m)
	}
	if status, m = tcpDo(t, base, aliceSecret, "PUT", "/v1/workspaces/"+ws+"/files/a.txt", "x"); status/100 != 2 {
		t.Fatalf("upload: %d %v", status, m)
	}
	if status, m = tcpDo(t, base, aliceSecret, "POST", "/v1/runs", `{"workspace":"`+ws+`","code":"import sqlite3\nc = sqlite3.connect('t.db')\nc.execute('CREATE TABLE t (x)')\nc.commit()"}`); status != 200 {
		t.Fatalf("run: %d %v", status, m)
	}
	if status, m = tcpDo(t, base, aliceSecret, "POST", "/v1/sql", `{"workspace":"`+ws+`","db":"t.db","sql":"SELECT 1"}`); status != 200 {
		t.Fatalf("read: %d %v", status, m)
	}
	write := `{"workspace":"` + ws + `","db":"t.db","sql":"INSERT INTO t VALUES (1)"`
	status, m = tcpDo(t, base, aliceSecret, "POST", "/v1/sql", write+"}")
	id, _ := m["approval_id"].(string)
	if status != 403 || id == "" {
		t.Fatalf("write: %d %v", status, m)
	}
	approveOverTCP(t, base, id)
	if status, m = tcpDo(t, base, aliceSecret, "POST", "/v1/sql", write+`,"approval":"`+id+`"}`); status != 200 {
		t.Fatalf("approved write: %d %v", status, m)
	}
	if status, m = tcpDo(t, base, aliceSecret, "DELETE", "/v1/workspaces/"+ws+"/files/a.txt", ""); status/100 != 2 {
		t.Fatalf("delete: %d %v", status, m)
	}
	evs, _ := d.store.Events(t.Context(), d.since, "", 1000)
	kinds := map[string]bool{}
	for _, e := range evs {
		var detail map[string]any
		json.Unmarshal(e.Detail, &detail)
		want := "alice"
		if e.Kind == "approval.decided" {
			want = approverToken.Name
		}
		if detail["token"] != want || e.UID != -1 {
			t.Errorf("%s by uid %d names token %v, not %s", e.Kind, e.UID, detail["token"], want)
		}
		kinds[string(e.Kind)] = true
	}
	for _, k := range []string{"workspace.created", "run.requested", "run.admitted", "run.finished", "sql.requested",
		"sql.finished", "approval.requested", "approval.decided", "approval.redeemed"} {
		if !kinds[k] {
			t.Errorf("no %s record: %v", k, kinds)
		}
	}
}
