package tools

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// Every tool has a schema of type object that states its bounds and refuses
// members it does not know; every framework's shape lists every tool.
func TestDefinitions(t *testing.T) {
	defs := Definitions()
	if len(defs) != 6 {
		t.Fatalf("%d tools", len(defs))
	}
	for i, d := range defs {
		if i > 0 && defs[i-1].Name >= d.Name {
			t.Errorf("not in name order: %s, %s", defs[i-1].Name, d.Name)
		}
		b, _ := json.Marshal(d.InputSchema)
		if d.InputSchema.Type != "object" || !strings.Contains(string(b), `"additionalProperties":false`) || d.Description == "" {
			t.Errorf("%s: %s", d.Name, b)
		}
		for name, p := range d.InputSchema.Properties {
			if p.Type == "string" && p.MaxLength == nil && p.Enum == nil {
				t.Errorf("%s.%s has no maxLength", d.Name, name)
			}
		}
	}
	run, _ := json.Marshal(defs[3].InputSchema)
	for _, want := range []string{`"maxLength":262144`, `"maximum":600000`, `"maxItems":64`} {
		if defs[3].Name != RunPython || !strings.Contains(string(run), want) {
			t.Errorf("run_python's schema lacks %s: %s", want, run)
		}
	}
	fc := FunctionCalling(defs)
	if len(fc["openai"].([]map[string]any)) != 6 || len(fc["anthropic"].([]map[string]any)) != 6 {
		t.Fatalf("%v", fc)
	}
	l := NewListing("the kill switch is on", "")
	if l.Available || len(l.Tools) != 6 {
		t.Fatalf("%+v", l)
	}
}

// A result leads with how the run ended; long output keeps its head and its tail
// and says how much was cut.
func TestRunText(t *testing.T) {
	long := strings.Repeat("a", 40<<10) + "END"
	v := wire.View{ID: "r1", State: wire.Done, Result: &protocol.Result{ExitCode: 1, Reason: protocol.Exited, ElapsedMS: 12.4,
		Stdout: []byte(long), Stderr: []byte("Traceback\n"), StdoutTruncated: true}}
	text := RunText(v)
	if !strings.HasPrefix(text, "exit 1 (exited) in 12 ms\n--- stdout (stopped at the run's output limit) ---\n") ||
		!strings.Contains(text, "[... 24579 bytes cut ...]") || !strings.Contains(text, "aEND\n--- stderr ---\nTraceback\n") {
		t.Fatalf("%.300s ... %s", text, text[len(text)-200:])
	}
	if got := Clip([]byte("short"), 16); got != "short" {
		t.Fatal(got)
	}
}
