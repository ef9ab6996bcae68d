package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	sandcellclient "github.com/sandcell/sandcell/client"
)

// dataProgram uses the native backend's stack as agents' programs do: a DataFrame,
// a fitted model, a statistic, a figure saved to the workspace.
const dataProgram = `import numpy as np, pandas as pd, matplotlib.pyplot as plt, scipy.stats, sklearn.linear_model, seaborn, statsmodels.api
df = pd.DataFrame({"a": [1, 2, 3], "b": [2.0, 4.1, 5.9]})
m = sklearn.linear_model.LinearRegression().fit(df[["a"]], df["b"])
plt.plot(df.a, df.b); plt.savefig("/ws/fig.png")
print(df.sum().to_dict(), round(float(m.coef_[0]), 2), round(float(scipy.stats.pearsonr(df.a, df.b)[0]), 3), np.__version__[:2])
`

const dataOutput = "{'a': 6.0, 'b': 12.0} 1.95 0.999 2."

// The native backend through the daemon, as each kind of caller reaches it: the API
// over the socket, the CLI locally and through the daemon, and MCP's run_python over
// streamable HTTP with a token. Policy's native.runners names who may.
func TestNativeBackend(t *testing.T) {
	d := startMCPDaemon(t)
	client := sandcellclient.HTTP(d.sock)
	if n := getNativeInfo(t, client); !n.Offered {
		t.Fatalf("native backend not offered: %+v", n)
	}

	status, b, run := postNativeRun(t, client, 1024)
	if status != 200 || !strings.HasPrefix(run.Result.Stdout, dataOutput) || run.Result.Enforcement.Backend != "native" {
		t.Fatalf("native run: %d %s", status, b)
	}

	// The figure left open is a display: in the result, and an event of the run's stream.
	body, _ := json.Marshal(map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])", "backend": "native", "wait": false})
	resp, err := client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	var started struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&started)
	resp.Body.Close()
	resp, err = client.Get("http://sandcell/v1/runs/" + started.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "event: display\ndata: {\"type\":\"image/png\",\"path\":\"displays/") ||
		!strings.Contains(string(b), "\"width\":640,\"height\":480") {
		t.Fatalf("events: %s", b)
	}

	// Fuel is the wasm engine's: refused on the native backend.
	resp, err = client.Post("http://sandcell/v1/runs", "application/json",
		strings.NewReader(`{"code":"1","backend":"native","limits":{"fuel":1000}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("native run with fuel: %d", resp.StatusCode)
	}

	// A native run in a named workspace leaves a warm native worker for the next
	// one there, which finds the stack imported.
	resp, err = client.Post("http://sandcell/v1/workspaces", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ws struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&ws)
	resp.Body.Close()
	warmStats := func() struct{ Idle, Hits int } { return getNativeInfo(t, client).Warm }
	for i, want := range []string{"False\n", "True\n"} {
		body, _ := json.Marshal(map[string]any{"code": "import sys; print('pandas' in sys.modules)", "backend": "native",
			"workspace": ws.ID})
		resp, err = client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		json.Unmarshal(b, &run)
		if resp.StatusCode != 200 || run.Result.Stdout != want {
			t.Fatalf("native run %d in a workspace: %d %s", i, resp.StatusCode, b)
		}
		for deadline := time.Now().Add(90 * time.Second); i == 0 && warmStats().Idle == 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no warm native worker: %+v", warmStats())
			}
		}
	}
	if st := warmStats(); st.Hits != 1 {
		t.Fatalf("warm native workers: %+v", st)
	}

	if r := cli(t, "", "run", "--socket", d.sock, "--backend", "native", "-c", "import pandas; print(pandas.__version__[:2])"); r.code != 0 || r.stdout != "2.\n" {
		t.Fatalf("run --socket --backend native: %+v", r)
	}
	if r := cli(t, "", "run", "--backend", "native", "--memory", "1024", "-c", dataProgram); r.code != 0 || !strings.HasPrefix(r.stdout, dataOutput) {
		t.Fatalf("run --backend native: %+v", r)
	}

	// A session on the native backend: state across cells, a DataFrame's value as
	// text and its HTML as a display, a cell past its time rolled back; no fork.
	post := func(path, body string) (int, []byte) {
		t.Helper()
		resp, err := client.Post("http://sandcell"+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, b := post("/v1/sessions", `{"backend":"native"}`)
	var sess struct{ ID string }
	json.Unmarshal(b, &sess)
	if code != 201 || sess.ID == "" {
		t.Fatalf("native session: %d %s", code, b)
	}
	if code, b := post("/v1/sessions/"+sess.ID+"/cells", `{"code":"import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})"}`); code != 200 {
		t.Fatalf("cell 1: %d %s", code, b)
	}
	code, b = post("/v1/sessions/"+sess.ID+"/cells", `{"code":"df.assign(b=df.a * 2)"}`)
	var ans struct {
		State  string
		Value  string
		Result struct {
			Displays []struct{ Type, Text string }
		}
	}
	json.Unmarshal(b, &ans)
	if code != 200 || ans.State != "preserved" || !strings.Contains(ans.Value, "a  b") || len(ans.Result.Displays) != 2 ||
		ans.Result.Displays[0].Type != "text/html" || !strings.Contains(ans.Result.Displays[0].Text, "<table") {
		t.Fatalf("cell 2: %d %s", code, b)
	}
	code, b = post("/v1/sessions/"+sess.ID+"/cells", `{"code":"df = None\nimport time\ntime.sleep(60)","limits":{"timeout_ms":500}}`)
	if json.Unmarshal(b, &ans); code != 200 || ans.State != "rolled_back" {
		t.Fatalf("a cell past its time: %d %s", code, b)
	}
	code, b = post("/v1/sessions/"+sess.ID+"/cells", `{"code":"int(df.a.sum())"}`)
	if json.Unmarshal(b, &ans); code != 200 || ans.State != "preserved" || ans.Value != "3" {
		t.Fatalf("after the rollback: %d %s", code, b)
	}
	if code, b := post("/v1/sessions/"+sess.ID+"/fork", ``); code != 400 {
		t.Fatalf("fork of a native session: %d %s", code, b)
	}

	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: d.url, HTTPClient: bearer(d.token)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python",
		Arguments: map[string]any{"code": "import numpy; print(int(numpy.arange(10).sum()))", "backend": "native"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "\n45\n") {
		t.Fatalf("MCP run_python on the native backend: %+v %v", res, err)
	}
	// run_cell's interpreter on the native backend; a figure comes back as an image.
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_cell",
		Arguments: map[string]any{"code": "import numpy as np\nv = np.arange(4)", "backend": "native"}})
	if err != nil || res.IsError {
		t.Fatalf("MCP run_cell on the native backend: %+v %v", res, err)
	}
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_cell",
		Arguments: map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot(v)\nint(v.sum())"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "--- value ---\n6\n") || len(res.Content) != 3 {
		t.Fatalf("MCP run_cell, second cell: %+v %v", res, err)
	}
	if img, ok := res.Content[1].(*mcp.ImageContent); !ok || img.MIMEType != "image/png" || len(img.Data) < 1000 {
		t.Fatalf("MCP run_cell's figure: %+v", res.Content[1])
	}
}

// A caller that native.runners does not name is refused the native backend (403),
// and keeps the wasm one.
func TestNativeBackendPolicy(t *testing.T) {
	d := startMCPDaemon(t, "[native]", `runners = ["token:someone-else"]`)
	client := sandcellclient.HTTP(d.sock)
	for backend, want := range map[string]int{"native": 403, "wasm": 200} {
		resp, err := client.Post("http://sandcell/v1/runs", "application/json",
			strings.NewReader(`{"code":"print(1)","backend":`+strconv.Quote(backend)+`}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: %d %s, want %d", backend, resp.StatusCode, b, want)
		}
	}
}

// bearer is an HTTP client that sends token as its bearer token.
func bearer(token string) *http.Client {
	return &http.Client{Transport: bearerTransport{token}}
}

type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// A daemon whose policy requires gVisor for native code: its self-test's native
// canary and probes run under runsc, every native run does (its contract says so),
// and a native session, which runsc cannot serve yet, is refused with the reason.
func TestNativeBackendGVisor(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("no runsc (apt-get install runsc): the gvisor layer is not offered here")
	}
	d := startMCPDaemon(t, "[native]", `require = ["gvisor", "seccomp", "rlimits", "capabilities", "no_new_privs", "userns", "netns", "mntns", "pidns", "ipcns", "utsns"]`)
	client := sandcellclient.HTTP(d.sock)
	if n := getNativeInfo(t, client); !n.Offered || n.GVisor == nil || !strings.HasPrefix(n.GVisor.Version, "runsc") {
		t.Fatalf("native backend under gVisor: %+v", n)
	}

	status, b, run := postNativeRun(t, client, 2048)
	r := run.Result
	if status != 200 || r.Reason != "exited" || !strings.Contains(r.Stdout, dataOutput) || r.Enforcement.GVisor == nil || !r.Enforcement.GVisor.Active {
		t.Fatalf("run under gVisor: %d %s", status, b)
	}

	resp, err := client.Post("http://sandcell/v1/sessions", "application/json", strings.NewReader(`{"backend":"native"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "backend_unavailable") || !strings.Contains(string(b), "gvisor") {
		t.Fatalf("a native session under a policy requiring gVisor: %d %s", resp.StatusCode, b)
	}
}

// nativeInfo is GET /v1/info's backends.native.
type nativeInfo struct {
	Offered bool   `json:"offered"`
	WhyNot  string `json:"why_not"`
	GVisor  *struct {
		Version string `json:"version"`
	} `json:"gvisor"`
	Warm struct{ Idle, Hits int } `json:"warm"`
}

// getNativeInfo returns the daemon's backends.native.
func getNativeInfo(t *testing.T, client *http.Client) nativeInfo {
	t.Helper()
	resp, err := client.Get("http://sandcell/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		Backends map[string]nativeInfo `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info.Backends["native"]
}

// nativeRun is what the native tests read of a run's view.
type nativeRun struct {
	Result struct {
		Stdout, Stderr string
		Reason         string
		Enforcement    struct {
			Backend string
			GVisor  *struct{ Active bool }
		}
	}
}

// postNativeRun runs the data program on the native backend with memory MiB and
// returns the HTTP status, the body and the view.
func postNativeRun(t *testing.T, client *http.Client, memory int) (int, []byte, nativeRun) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": dataProgram, "backend": "native", "limits": map[string]any{"memory_mib": memory}})
	resp, err := client.Post("http://sandcell/v1/runs", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var run nativeRun
	json.Unmarshal(b, &run)
	return resp.StatusCode, b, run
}
