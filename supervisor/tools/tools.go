// Package tools defines the agent tools once: their names, what they do, their
// arguments as JSON Schema with their bounds, and how a result reads to an agent.
// The MCP server (package mcpserver) serves them as MCP tools, and GET /v1/tools
// lists the same definitions with the function-calling shapes agent frameworks take
// (OpenAI's "function" tools, Anthropic's "input_schema" tools). A test keeps the
// MCP tools/list and /v1/tools equal.
//
// Every tool acts through the daemon's API as the caller who invoked it, so the
// daemon's roles, policy, quotas, approvals and audit apply to a tool exactly as to
// the request it becomes.
package tools

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// The tools' names.
const (
	RunPython = "run_python"
	RunCell   = "run_cell"
	RunSQL    = "run_sql"
	ListFiles = "list_files"
	ReadFile  = "read_file"
	WriteFile = "write_file"
)

// The bounds of tool arguments, in bytes unless said. The schemas state them
// (maxLength), and an argument past one is refused before anything runs; the
// daemon's own limits (runs.max_request_bytes, the workspace quota, the policy's
// maximum timeout) apply after them.
const (
	MaxCodeBytes   = 256 << 10 // run_python's code
	MaxStdinBytes  = 256 << 10 // run_python's stdin
	MaxArgs        = 64        // run_python's args, in arguments
	MaxArgBytes    = 4 << 10   // each of them
	MaxPathBytes   = 1024      // every path in the workspace
	MaxSQLBytes    = 64 << 10  // run_sql's statement
	MaxWriteBytes  = 768 << 10 // write_file's content (its encoded form for base64)
	MaxReadBytes   = 1 << 20   // what read_file returns of a file
	MaxTimeoutMS   = 600_000   // run_python's timeout_ms; the policy's maximum may be lower
	MaxShownOutput = 16 << 10  // of each stream, what the text of a result shows
	// MaxMessageBytes bounds one MCP message over HTTP: the largest arguments with
	// room for the envelope and JSON's escapes.
	MaxMessageBytes = 1 << 20
)

// RunPythonArgs are run_python's arguments.
type RunPythonArgs struct {
	Code      string   `json:"code,omitempty" jsonschema:"Python 3.13 source to run (one of code and path)"`
	Path      string   `json:"path,omitempty" jsonschema:"a .py file in the workspace to run instead of code"`
	Args      []string `json:"args,omitempty" jsonschema:"the program's arguments (sys.argv[1:])"`
	Stdin     string   `json:"stdin,omitempty" jsonschema:"the program's standard input (text)"`
	TimeoutMS int64    `json:"timeout_ms,omitempty" jsonschema:"wall-clock limit in milliseconds (default: the daemon's; at most its maximum)"`
	Workspace string   `json:"workspace,omitempty" jsonschema:"workspace id (default: the one this session's caller works in, named in every result)"`
	Approval  string   `json:"approval,omitempty" jsonschema:"where runs need approval: the id of one an approver gave for exactly this call"`
	Backend   string   `json:"backend,omitempty" jsonschema:"where the code runs: wasm (default: the standard library and pure-Python packages) or native (Debian's CPython with numpy, pandas, matplotlib, scipy, scikit-learn, seaborn, statsmodels), where the daemon offers it to this caller"`
	// SaveOutput keeps the run's whole output in the workspace, as SaveOutput.stdout
	// and SaveOutput.stderr, for read_file, where the answer's text clips it.
	SaveOutput string `json:"save_output,omitempty" jsonschema:"also keep the whole output as the workspace files SAVE_OUTPUT.stdout and SAVE_OUTPUT.stderr (the answer shows at most 16 KiB of each)"`
}

// RunCellArgs are run_cell's arguments.
type RunCellArgs struct {
	Code      string `json:"code" jsonschema:"Python 3.13 source to run in this session's interpreter; a last expression's value is shown (apart from the output, under value) as the interactive interpreter shows it"`
	Stdin     string `json:"stdin,omitempty" jsonschema:"the cell's standard input (text)"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"wall-clock limit in milliseconds (default: the daemon's; at most its maximum); a cell past it is rolled back"`
	// Restart starts a fresh interpreter for this session first: what earlier cells
	// defined is gone (the workspace's files stay).
	Restart bool `json:"restart,omitempty" jsonschema:"start a fresh interpreter first (what earlier cells defined is gone; files in the workspace stay)"`
	// Approval is the id of an approval an approver gave for exactly this cell.
	Approval string `json:"approval,omitempty" jsonschema:"where code needs approval: the id of one an approver gave for exactly this call"`
	// Backend is the interpreter's, when this call starts one (the first, or a
	// restart); a session keeps the backend it started with.
	Backend string `json:"backend,omitempty" jsonschema:"the interpreter's backend when this call starts one (the first call, or restart): wasm (default) or native (numpy, pandas, matplotlib, scipy, scikit-learn, seaborn, statsmodels; a native cell past its time or CPU limit is rolled back to a fork taken before it)"`
}

// RunSQLArgs are run_sql's arguments.
type RunSQLArgs struct {
	SQL       string          `json:"sql" jsonschema:"one SQLite statement"`
	DB        string          `json:"db" jsonschema:"the database file's path in the workspace"`
	Params    json.RawMessage `json:"params,omitempty" jsonschema:"values bound to the statement's parameters: an array (?) or an object (:name)"`
	MaxRows   int             `json:"max_rows,omitempty" jsonschema:"rows returned at most (default 1000)"`
	Workspace string          `json:"workspace,omitempty" jsonschema:"workspace id (default: the one this session's caller works in, named in every result)"`
	Approval  string          `json:"approval,omitempty" jsonschema:"for a write held for approval: the id of one an approver gave for exactly this call"`
}

// ListFilesArgs are list_files' arguments.
type ListFilesArgs struct {
	After     string `json:"after,omitempty" jsonschema:"list the names after this one (the next of a previous answer)"`
	Workspace string `json:"workspace,omitempty" jsonschema:"workspace id (default: the one this session's caller works in, named in every result)"`
}

// ReadFileArgs are read_file's arguments.
type ReadFileArgs struct {
	Path      string `json:"path" jsonschema:"the file's path in the workspace"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (default; UTF-8) or base64"`
	Workspace string `json:"workspace,omitempty" jsonschema:"workspace id (default: the one this session's caller works in, named in every result)"`
}

// WriteFileArgs are write_file's arguments.
type WriteFileArgs struct {
	Path      string `json:"path" jsonschema:"the file's path in the workspace (created or replaced)"`
	Content   string `json:"content" jsonschema:"the file's whole content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Workspace string `json:"workspace,omitempty" jsonschema:"workspace id (default: the one this session's caller works in, named in every result)"`
}

// Definition is one tool as agents see it.
type Definition struct {
	Name        string             `json:"name"`
	Title       string             `json:"title"`
	Description string             `json:"description"`
	InputSchema *jsonschema.Schema `json:"inputSchema"`
	// ReadOnly: the tool changes nothing (MCP's readOnlyHint).
	ReadOnly bool `json:"readOnly"`
	// Args is a pointer to the tool's argument type.
	Args any `json:"-"`
}

// Definitions returns the tools, in a stable order.
func Definitions() []Definition {
	defs := []Definition{
		{Name: RunPython, Title: "Run Python in the sandbox", Args: &RunPythonArgs{},
			Description: "Run Python 3.13 (the standard library; no network, no processes, no host files) in a fresh " +
				"sandboxed interpreter whose working directory is the workspace, /ws. Give code, or the path of a .py " +
				"file in the workspace. Files the program writes under /ws stay for later calls; nothing else does. " +
				"With backend \"native\" (where the daemon offers it) the interpreter has numpy, pandas, matplotlib, " +
				"scipy, scikit-learn, seaborn and statsmodels; figures left open, and objects given to display(), come " +
				"back as images or text. " +
				"Where the daemon holds runs for approval, the person at the client is asked to confirm the code. " +
				"The answer leads with how the run ended (exit status, reason, time), then its output; output past " +
				MiB(MaxShownOutput) + " per stream keeps its head and tail."},
		{Name: RunCell, Title: "Run a cell in a persistent Python interpreter", Args: &RunCellArgs{},
			Description: "Run Python 3.13 in this MCP session's own sandboxed interpreter, which keeps its state " +
				"from one call to the next (variables, imports, loaded data), like a notebook; its working directory " +
				"is the workspace, /ws, the same as run_python's. The answer leads with what became of the state: " +
				"preserved (what the cell did is kept), rolled_back (the cell reached its time, CPU or memory limit: " +
				"the interpreter is back to its state before the cell), or lost (it could not even be restored: the " +
				"next call starts a fresh interpreter, which the answer says). Then how the cell ended and its " +
				"output, as run_python's. Where the daemon holds code for approval, the person at the client is " +
				"asked to confirm each cell."},
		{Name: RunSQL, Title: "Run one SQL statement", Args: &RunSQLArgs{},
			Description: "Run one SQLite statement on a database file in the workspace. Reads run at once; a statement " +
				"that writes may be held for a person's approval (the answer then says so and gives the approval id)."},
		{Name: ListFiles, Title: "List the workspace", Args: &ListFilesArgs{}, ReadOnly: true,
			Description: "List the workspace's files and directories (path, type, size), a page at a time."},
		{Name: ReadFile, Title: "Read a workspace file", Args: &ReadFileArgs{}, ReadOnly: true,
			Description: "Read a file of the workspace, as UTF-8 text or as base64, up to " + MiB(MaxReadBytes) + "."},
		{Name: WriteFile, Title: "Write a workspace file", Args: &WriteFileArgs{},
			Description: "Create or replace a file of the workspace with the content given (text, or base64), within " +
				"the workspace's quota."},
	}
	for i := range defs {
		defs[i].InputSchema = schema(defs[i].Args)
	}
	// In name order, as MCP's tools/list gives them.
	sort.Slice(defs, func(i, j int) bool { return defs[i].Name < defs[j].Name })
	return defs
}

// MiB says n bytes for a reader: "16 KiB", "1 MiB".
func MiB(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// bounds are the limits each argument's schema states, by JSON member name.
func bounds(s *jsonschema.Schema) {
	max := func(n int) *int { return &n }
	num := func(n float64) *float64 { return &n }
	for name, p := range s.Properties {
		switch name {
		case "code":
			p.MaxLength = max(MaxCodeBytes)
		case "stdin":
			p.MaxLength = max(MaxStdinBytes)
		case "args":
			p.Types, p.Type = nil, "array" // not null
			p.MaxItems = max(MaxArgs)
			p.Items.MaxLength = max(MaxArgBytes)
		case "path", "db", "after", "save_output":
			p.MaxLength = max(MaxPathBytes)
		case "workspace", "approval":
			p.MaxLength = max(64)
		case "sql":
			p.MaxLength, p.MinLength = max(MaxSQLBytes), max(1)
		case "content":
			p.MaxLength = max(MaxWriteBytes)
		case "timeout_ms":
			p.Minimum, p.Maximum = num(1), num(MaxTimeoutMS)
		case "max_rows":
			p.Minimum, p.Maximum = num(1), num(100_000)
		case "encoding":
			p.Enum = []any{"text", "base64"}
		case "backend":
			p.Enum = []any{"wasm", "native"}
		case "params":
			s.Properties[name] = &jsonschema.Schema{Types: []string{"array", "object"}, Description: p.Description}
		}
	}
	s.AdditionalProperties = &jsonschema.Schema{Not: &jsonschema.Schema{}}
}

func schema(args any) *jsonschema.Schema {
	s, err := jsonschema.ForType(reflect.TypeOf(args).Elem(), &jsonschema.ForOptions{})
	if err != nil {
		panic(err) // the argument types above are fixed: a test builds every schema
	}
	bounds(s)
	return s
}

// FunctionCalling returns the tools in the shapes agent frameworks take: "openai"
// (Chat Completions' {"type": "function", "function": {name, description,
// parameters}}) and "anthropic" (Messages' {name, description, input_schema}).
func FunctionCalling(defs []Definition) map[string]any {
	var openai, anthropic []map[string]any
	for _, d := range defs {
		openai = append(openai, map[string]any{"type": "function", "function": map[string]any{
			"name": d.Name, "description": d.Description, "parameters": d.InputSchema}})
		anthropic = append(anthropic, map[string]any{"name": d.Name, "description": d.Description,
			"input_schema": d.InputSchema})
	}
	return map[string]any{"openai": openai, "anthropic": anthropic}
}

// Listing is the body of GET /v1/tools.
type Listing struct {
	// Available says whether the tools are offered now; Reason says why not (the
	// kill switch, an unverified sandbox, a daemon stopping). While they are not,
	// MCP's tools/list is empty.
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// Tools are the definitions, offered or not.
	Tools []Definition `json:"tools"`
	// FunctionCalling holds the same tools in other frameworks' shapes.
	FunctionCalling map[string]any `json:"function_calling"`
}

// NewListing is the listing of the tools, with why they are not offered ("": they
// are), and the guest tools their code may call (see WithGuestTools).
func NewListing(reason, guestTools string) Listing {
	defs := WithGuestTools(guestTools)
	return Listing{Available: reason == "", Reason: reason, Tools: defs, FunctionCalling: FunctionCalling(defs)}
}

// WithGuestTools returns the definitions with run_python's and run_cell's
// descriptions saying which of the operator's tools their code may call through
// sandcell.tools: summary, one line a tool (as the tool broker's Summary gives it);
// "" leaves them as Definitions has them.
func WithGuestTools(summary string) []Definition {
	defs := Definitions()
	if summary == "" {
		return defs
	}
	for i := range defs {
		if defs[i].Name == RunPython || defs[i].Name == RunCell {
			defs[i].Description += " The code may call these tools of the operator's as Python functions, " +
				"`from sandcell.tools import GROUP` then `GROUP.NAME(...)` (sandcell.tools.help() lists them; a call " +
				"marked [writes] may wait for a person's approval; failures raise sandcell.tools.ToolError):\n" + summary
		}
	}
	return defs
}

// Clip returns b as text for an agent: whole when it is at most max bytes, else its
// head and its tail with a line between them saying how many bytes were cut.
func Clip(b []byte, max int) string {
	if len(b) <= max {
		return string(b)
	}
	head, tail := b[:max/2], b[len(b)-max/2:]
	return fmt.Sprintf("%s\n[... %d bytes cut ...]\n%s", head, len(b)-len(head)-len(tail), tail)
}

// RunText is the text of a run's result an agent reads: first how it ended, then its
// output, each stream clipped to MaxShownOutput.
func RunText(v wire.View) string {
	var b strings.Builder
	r := v.Result
	if r == nil {
		fmt.Fprintf(&b, "run %s: %s\n", v.ID, v.State)
		return b.String()
	}
	fmt.Fprintf(&b, "exit %d (%s) in %.0f ms", r.ExitCode, r.Reason, r.ElapsedMS)
	for _, d := range r.Diagnostics {
		fmt.Fprintf(&b, "; %s", d)
	}
	b.WriteString("\n")
	stdout, stderr := r.Streams() // held in pieces or as one slice each
	for _, s := range []struct {
		name string
		out  []byte
		cut  bool
	}{{"stdout", stdout.Bytes(), r.StdoutTruncated}, {"stderr", stderr.Bytes(), r.StderrTruncated}} {
		if len(s.out) == 0 && !s.cut {
			continue
		}
		fmt.Fprintf(&b, "--- %s", s.name)
		if s.cut {
			b.WriteString(" (stopped at the run's output limit)")
		}
		fmt.Fprintf(&b, " ---\n%s", Clip(s.out, MaxShownOutput))
		if !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
	}
	return b.String()
}
