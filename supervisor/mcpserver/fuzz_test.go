package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/supervisor/tools"
)

// FuzzToolArguments sends fuzzed arguments to each tool through the official SDK's
// server, as a client's tools/call reaches it (over an in-memory transport): the
// schema each tool advertises is what its handler may rely on. Whatever the input,
// nothing panics, and arguments that reach a handler hold every bound of the
// tool's schema (lengths in characters, as JSON Schema counts them; counts of
// items; numeric ranges; enums), on the typed value the handler gets.
func FuzzToolArguments(f *testing.F) {
	for _, seed := range []string{
		`{"code":"print(1)"}`, `{"code":"x","args":["a","b"],"timeout_ms":1000,"stdin":"in"}`,
		`{"code":"` + strings.Repeat("é", 10) + `","timeout_ms":600000}`, `{"timeout_ms":0}`, `{"timeout_ms":1e400}`,
		`{"timeout_ms":-1}`, `{"timeout_ms":1.5}`, `{"args":null}`, `{"args":[null]}`, `{"code":null}`,
		`{"sql":"SELECT 1","db":"a.db","params":[1,"x",{"base64":"AA=="}],"max_rows":100000}`, `{"sql":""}`,
		`{"params":"x","sql":"s","db":"d"}`, `{"path":"a","content":"b","encoding":"base64"}`, `{"encoding":"hex"}`,
		`{"extra":1}`, `{"CODE":"x"}`, `{"code":"a","code":"b"}`, `[]`, `null`, `"x"`, `{"restart":true,"code":""}`,
		`{"after":"` + strings.Repeat("a", 1025) + `"}`, `{"code":"\ud800"}`, `{"max_rows":100001,"sql":"s","db":"d"}`,
	} {
		for i := range tools.Definitions() {
			f.Add(uint8(i), []byte(seed))
		}
	}
	defs := Definitions("")
	srv := mcp.NewServer(&mcp.Implementation{Name: "fuzz", Version: "1"}, nil)
	reached := make(chan error, 1)
	for _, d := range defs {
		switch d.Name {
		case tools.RunPython:
			mcp.AddTool(srv, d, holds[tools.RunPythonArgs](d, reached))
		case tools.RunCell:
			mcp.AddTool(srv, d, holds[tools.RunCellArgs](d, reached))
		case tools.RunSQL:
			mcp.AddTool(srv, d, holds[tools.RunSQLArgs](d, reached))
		case tools.ListFiles:
			mcp.AddTool(srv, d, holds[tools.ListFilesArgs](d, reached))
		case tools.ReadFile:
			mcp.AddTool(srv, d, holds[tools.ReadFileArgs](d, reached))
		case tools.WriteFile:
			mcp.AddTool(srv, d, holds[tools.WriteFileArgs](d, reached))
		default:
			f.Fatalf("no handler for %s", d.Name)
		}
	}
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		f.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fuzz", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		f.Fatal(err)
	}
	defer cs.Close()
	f.Fuzz(func(t *testing.T, tool uint8, args []byte) {
		if !json.Valid(args) {
			return // not a message a client could send
		}
		d := defs[int(tool)%len(defs)]
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		res, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: d.Name, Arguments: json.RawMessage(args)})
		if callCtx.Err() != nil {
			t.Fatalf("%s %s: no answer in 10 s", d.Name, args)
		}
		select {
		case bad := <-reached:
			if bad != nil {
				t.Fatalf("%s %s reached its handler: %v", d.Name, args, bad)
			}
			if err != nil || res.IsError {
				t.Fatalf("%s %s: the handler answered, the client saw %+v %v", d.Name, args, res, err)
			}
		default:
			if err == nil && !res.IsError {
				t.Fatalf("%s %s: a result without the handler", d.Name, args)
			}
		}
	})
}

// holds is a handler that checks its typed arguments against the tool's schema and
// reports (nil: they hold) on reached.
func holds[In any](d *mcp.Tool, reached chan<- error) mcp.ToolHandlerFor[In, any] {
	schema := d.InputSchema.(*jsonschema.Schema)
	return func(_ context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		reached <- within(schema, reflect.ValueOf(in))
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	}
}

// within checks each field of the struct v against its property in s.
func within(s *jsonschema.Schema, v reflect.Value) error {
	for i := 0; i < v.NumField(); i++ {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		p := s.Properties[name]
		if p == nil {
			return fmt.Errorf("%s: not in the schema", name)
		}
		if err := value(p, v.Field(i)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func value(p *jsonschema.Schema, v reflect.Value) error {
	switch v.Kind() {
	case reflect.String:
		s := v.String()
		if !utf8.ValidString(s) {
			return fmt.Errorf("%q is not UTF-8", s)
		}
		if n := utf8.RuneCountInString(s); p.MaxLength != nil && n > *p.MaxLength || p.MinLength != nil && n < *p.MinLength && s != "" {
			return fmt.Errorf("%d characters, outside the schema's minLength and maxLength", n)
		}
		if p.Enum != nil && s != "" {
			found := false
			for _, e := range p.Enum {
				found = found || e == s
			}
			if !found {
				return fmt.Errorf("%q is not one of %v", s, p.Enum)
			}
		}
	case reflect.Int, reflect.Int64:
		if n := float64(v.Int()); n != 0 && (p.Minimum != nil && n < *p.Minimum || p.Maximum != nil && n > *p.Maximum) {
			return fmt.Errorf("%v outside the schema's minimum and maximum", n)
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.String {
			return nil // params: json.RawMessage, an array or object the daemon checks
		}
		if p.MaxItems != nil && v.Len() > *p.MaxItems {
			return fmt.Errorf("%d items, more than %d", v.Len(), *p.MaxItems)
		}
		for i := 0; i < v.Len(); i++ {
			if err := value(p.Items, v.Index(i)); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
	}
	return nil
}
