package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// debianPython is the interpreter the client tests run under: Debian's, with the
// test dependencies make test installs from Debian's archive (python3-httpx,
// python3-pytest, python3-pytest-asyncio, python3-build, python3-setuptools,
// python3-wheel), never
// whatever python3 comes first on PATH.
const debianPython = "/usr/bin/python3"

// The Python client (clients/python) as a user gets it: its wheel built, and its
// tests (pytest, importing the package from the wheel) run against a real daemon
// over the socket and over TCP with tokens.
func TestPythonClient(t *testing.T) {
	src, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(debianPython, "-c", "import httpx, pytest, pytest_asyncio, build, setuptools, wheel").CombinedOutput(); err != nil {
		t.Fatalf("the Python client's test dependencies are missing (make test installs them from Debian): %v\n%s", err, out)
	}
	// Built from a copy: a build leaves its work files beside the sources.
	tree := t.TempDir()
	if err := os.CopyFS(tree, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	build := exec.Command(debianPython, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, tree)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the wheel: %v\n%s", err, out)
	}
	wheels, _ := filepath.Glob(filepath.Join(dist, "sandcell-*-py3-none-any.whl"))
	if len(wheels) != 1 {
		t.Fatalf("wheels built: %v", wheels)
	}
	d := startMCPDaemon(t, clientTestConfig)
	cmd := exec.Command(debianPython, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=strict",
		filepath.Join(src, "tests"))
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONPATH="+wheels[0], "PYTHONDONTWRITEBYTECODE=1",
		"SANDCELL_SOCKET="+d.sock, "SANDCELL_TEST_URL="+strings.TrimSuffix(d.url, "/mcp"),
		"SANDCELL_TEST_TOKEN="+d.token, "SANDCELL_TEST_APPROVER_TOKEN="+d.approverToken,
		"SANDCELL_TEST_RETRY_TOKEN="+d.otherToken, "SANDCELL_TEST_NATIVE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("pytest: %v", err)
	}
	// The tests imported the package from the wheel, not from the source tree.
	check := exec.Command(debianPython, "-c", "import sandcell; print(sandcell.__file__)")
	check.Env = append(os.Environ(), "PYTHONPATH="+wheels[0])
	if where, err := check.Output(); err != nil || !strings.HasPrefix(string(where), wheels[0]) {
		t.Fatalf("sandcell imported from %q (%v), not the wheel", where, err)
	}
}

// The TypeScript client (clients/typescript) and the agent frameworks' providers
// (clients/providers) as a user gets them: each built with the pinned TypeScript,
// packed as npm would publish it, and its tests (node --test) run against a real
// daemon over the socket and over TCP with tokens. The providers' tests drive each
// framework's own agent loop with the framework's own scripted model.
func TestTypeScriptClient(t *testing.T) {
	root, err := filepath.Abs("../../clients")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "node_modules", "typescript")); err != nil {
		t.Fatalf("the TypeScript packages' build dependencies are not installed (make ts-client, as make test does): %v", err)
	}
	npm := func(t *testing.T, dir string, args ...string) string {
		cmd := exec.Command("npm", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The client first: the providers are built against it.
	packages := []struct{ dir, name, test string }{
		{"typescript", "sandcell", "test/client.test.mjs"},
		{"providers/ai-sdk", "sandcell-ai-sdk", "test/ai-sdk.test.mjs"},
		{"providers/deepagents", "sandcell-deepagents", "test/deepagents.test.mjs"},
	}
	for _, p := range packages {
		npm(t, filepath.Join(root, p.dir), "run", "build", "--silent")
	}
	d := startMCPDaemon(t, clientTestConfig)
	// A second daemon holds code for approval, which this uid may confirm: the
	// providers' reports of held code and their runs of it once approved.
	held := startMCPDaemon(t, "[approvals]\nrequired = [\"run\"]\nelicitation = [\"socket\"]")
	for _, p := range packages {
		t.Run(p.name, func(t *testing.T) {
			dir := filepath.Join(root, p.dir)
			var packed []struct {
				Name, Version string
				Files         []struct{ Path string }
			}
			if err := json.Unmarshal([]byte(npm(t, dir, "pack", "--dry-run", "--json", "--silent")), &packed); err != nil || len(packed) != 1 {
				t.Fatalf("npm pack: %v %+v", err, packed)
			}
			if packed[0].Name != p.name || packed[0].Version == "" {
				t.Errorf("packed %s %s, want %s at a version", packed[0].Name, packed[0].Version, p.name)
			}
			files := map[string]bool{}
			for _, f := range packed[0].Files {
				files[f.Path] = true
			}
			for _, want := range []string{"package.json", "README.md", "LICENSE", "dist/index.js", "dist/index.d.ts"} {
				if !files[want] {
					t.Errorf("the package lacks %s: %v", want, files)
				}
			}
			cmd := exec.Command("node", "--test", p.test)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "SANDCELL_SOCKET="+d.sock, "SANDCELL_TEST_URL="+strings.TrimSuffix(d.url, "/mcp"),
				"SANDCELL_TEST_TOKEN="+d.token, "SANDCELL_TEST_APPROVER_TOKEN="+d.approverToken,
				"SANDCELL_TEST_RETRY_TOKEN="+d.otherToken, "SANDCELL_TEST_NATIVE=1", "SANDCELL_TEST_APPROVALS_SOCKET="+held.sock)
			out, err := cmd.CombinedOutput()
			t.Logf("node --test:\n%s", out)
			if err != nil {
				t.Fatalf("node --test: %v", err)
			}
		})
	}
}

// clientTestConfig is the clients' tests' daemon configuration beyond startMCPDaemon's:
// a caller has at most two runs (to meet Retry-After), and a program may be given
// GREETING in its environment.
const clientTestConfig = "[runs]\nmax_per_caller = 2\n[sandbox]\nenv_allow = [\"GREETING\"]"

// E2B's own SDK (@e2b/code-interpreter and e2b from npm, test/e2b-client) pointed at
// the daemon by its own configuration: a sandbox created, files written and read,
// code run with its output, results and errors, what is not offered refused clearly,
// the sandbox killed.
func TestE2BSDK(t *testing.T) {
	dir, err := filepath.Abs("../../test/e2b-client")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter")); err != nil {
		t.Fatalf("E2B's SDK is not installed (make e2b-client, as make test does): %v", err)
	}
	d := startMCPDaemon(t, clientTestConfig)
	base := strings.TrimSuffix(d.url, "/mcp")
	cmd := exec.Command("node", "e2b.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+base+"/e2b", "E2B_SANDBOX_URL="+base+"/e2b/sandbox",
		"E2B_API_KEY="+d.token, "SANDCELL_URL="+base, "SANDCELL_TEST_NATIVE=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("%v\n%s", err, out)
	}
}
