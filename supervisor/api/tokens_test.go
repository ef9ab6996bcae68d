package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/wire"
)

func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	_, tok := api.NewToken("ci", []api.Role{api.RoleRunner})
	good := "[[token]]\nname = \"ci\"\nsha256 = \"" + tok.SHA256 + "\"\nroles = [\"runner\"]\n"
	for name, c := range map[string]struct {
		body string
		mode os.FileMode
		ok   bool
	}{
		"good":           {good, 0o600, true},
		"group-writable": {good, 0o620, false},
		"unknown key":    {good + "extra = 1\n", 0o600, false},
		"bad hash":       {strings.Replace(good, tok.SHA256, "abc", 1), 0o600, false},
		"bad role":       {strings.Replace(good, `"runner"`, `"root"`, 1), 0o600, false},
		"empty":          {"", 0o600, false},
		"repeated":       {good + good, 0o600, false},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		os.WriteFile(p, []byte(c.body), c.mode)
		os.Chmod(p, c.mode)
		ts, err := api.LoadTokens(p)
		if (err == nil) != c.ok || (c.ok && (len(ts) != 1 || ts[0].Name != "ci")) {
			t.Errorf("%s: %v %v", name, ts, err)
		}
	}
}

// Over TCP a caller is its bearer token: none or a wrong one is 401 (audited), the
// token's roles decide the rest, and runs belong to the token that started them.
func TestTCPBearerTokens(t *testing.T) {
	ciSecret, ci := api.NewToken("ci", []api.Role{api.RoleRunner})
	otherSecret, other := api.NewToken("other", []api.Role{api.RoleRunner})
	adminSecret, admin := api.NewToken("ops", []api.Role{api.RoleAdmin})
	access := api.Access{Tokens: api.Tokens{ci, other, admin}, Admins: api.Principals{UIDs: map[int]bool{os.Getuid(): true}}}
	d := start(t, setup{access: &access})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go d.server.Serve(l)
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	base := "http://" + l.Addr().String()
	call := func(method, path, secret, body string) (int, []byte) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, secret := range []string{"", "wrong", ciSecret[:10]} {
		if code, body := call("POST", "/v1/runs", secret, `{"code":"print(1)"}`); code != 401 || !strings.Contains(string(body), `"unauthorized"`) {
			t.Fatalf("secret %q: %d %s", secret, code, body)
		}
	}
	if code, _ := call("GET", "/livez", "", ""); code != 200 {
		t.Fatalf("livez without a token: %d", code)
	}
	code, body := call("POST", "/v1/runs", ciSecret, `{"code":"print(6*7)"}`)
	var v wire.View
	if code != 200 || json.Unmarshal(body, &v) != nil || string(v.Result.Stdout) != "42\n" {
		t.Fatalf("run: %d %s", code, body)
	}
	if code, _ := call("GET", "/v1/runs/"+v.ID, otherSecret, ""); code != 404 {
		t.Fatalf("another token sees the run: %d", code)
	}
	if code, _ := call("GET", "/v1/runs/"+v.ID, ciSecret, ""); code != 200 {
		t.Fatalf("its token: %d", code)
	}
	if code, _ := call("GET", "/v1/audit", ciSecret, ""); code != 403 {
		t.Fatalf("runner reads the audit log: %d", code)
	}
	if code, _ := call("GET", "/v1/runs/"+v.ID, adminSecret, ""); code != 200 {
		t.Fatalf("admin token: %d", code)
	}
	// The Unix socket's admin still sees it; the audit log names the token.
	if resp, _ := d.do(t, "GET", "/v1/runs/"+v.ID, ""); resp.StatusCode != 200 {
		t.Fatalf("unix admin: %d", resp.StatusCode)
	}
	evs, _ := d.store.Events(context.Background(), d.since, "", 100)
	var denied, finished int
	for _, e := range evs {
		switch {
		case e.Kind == "access.denied":
			denied++
		case e.Kind == "run.finished" && strings.Contains(string(e.Detail), `"token":"ci"`):
			finished++
		}
	}
	if denied != 4 || finished != 1 {
		t.Fatalf("audit: %d denied, %d finished by ci", denied, finished)
	}
}
