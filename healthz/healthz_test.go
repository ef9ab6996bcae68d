package healthz

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func get(t *testing.T, h http.Handler, url string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", url, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	return rec.Code, body
}

func TestProbes(t *testing.T) {
	r := New()
	r.Add("canary", Readiness)
	r.Add("manager", Liveness)
	live, ready := Handler(r.Live, "not_alive"), Handler(r.Ready, "not_ready")
	// Pending: alive, not ready.
	if code, _ := get(t, live, "/livez"); code != 200 {
		t.Fatalf("livez pending: %d", code)
	}
	code, body := get(t, ready, "/readyz?verbose")
	if code != 503 || body["code"] != "not_ready" || body["detail"] != "canary: not checked yet" || len(body["checks"].([]any)) != 2 {
		t.Fatalf("readyz pending: %d %v", code, body)
	}
	r.Set("canary", nil)
	r.Set("manager", nil)
	if code, body := get(t, ready, "/readyz"); code != 200 || body["checks"] != nil {
		t.Fatalf("readyz ok: %d %v", code, body)
	}
	r.Set("manager", errors.New("wedged"))
	if code, _ := get(t, live, "/livez"); code != 503 {
		t.Fatalf("livez failing: %d", code)
	}
	if code, _ := get(t, ready, "/readyz"); code != 503 || r.Why() != "manager: wedged" {
		t.Fatalf("readyz with a failing liveness check: %d %q", code, r.Why())
	}
	// Recovery keeps the last error for ?verbose.
	r.Set("manager", nil)
	_, body = get(t, ready, "/readyz?verbose")
	checks := body["checks"].([]any)
	if m := checks[1].(map[string]any); m["state"] != "ok" || m["error"] != "wedged" {
		t.Fatalf("after recovery: %v", m)
	}
	// A passing check with something to say: ready, and ?verbose says it.
	r.SetDetail("pool", nil, "runs beneath /x start cold")
	code, body = get(t, ready, "/readyz?verbose")
	checks = body["checks"].([]any)
	if m := checks[2].(map[string]any); code != 200 || m["name"] != "pool" || m["state"] != "ok" || m["detail"] != "runs beneath /x start cold" {
		t.Fatalf("detail: %d %v", code, body)
	}
	r.Set("pool", nil)
	if _, body = get(t, ready, "/readyz?verbose"); body["checks"].([]any)[2].(map[string]any)["detail"] != nil {
		t.Fatalf("detail kept: %v", body)
	}
}
