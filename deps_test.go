package sandcell_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/sandcell/sandcell"

// TestImportRules enforces the one-way imports between packages: framework
// packages each stay inside one package, and the worker (which runs under the
// tightest seccomp filter) links no HTTP server and no database.
func TestImportRules(t *testing.T) {
	imports := goList(t, "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	// Each framework may be imported only by the package named (prefix match).
	owners := map[string]string{
		"github.com/bytecodealliance/wasmtime-go": module + "/sandbox/engine",
		"github.com/labstack/echo":                module + "/supervisor/api",
		"modernc.org/sqlite":                      module + "/supervisor/store",
		"github.com/coreos/go-systemd":            module + "/systemd",
		"github.com/modelcontextprotocol/go-sdk":  module + "/supervisor/mcpserver",
	}
	for pkg, deps := range imports {
		for _, dep := range deps {
			if strings.HasPrefix(dep, module+"/cmd/") {
				t.Errorf("%s imports %s: nothing imports cmd/", pkg, dep)
			}
			// The daemon is the whole program's wiring: only the binary builds one.
			if dep == module+"/supervisor/daemon" && pkg != module+"/cmd/appliance" {
				t.Errorf("%s imports %s: only cmd/appliance wires a daemon", pkg, dep)
			}
			if strings.HasPrefix(pkg, module+"/sandbox") && strings.HasPrefix(dep, module+"/supervisor") {
				t.Errorf("%s imports %s: sandbox/ never imports supervisor/", pkg, dep)
			}
			for fw, owner := range owners {
				// The benchmark is an MCP client, as an agent host would be; so is
				// the tool broker, of the servers the operator declares.
				mcpClient := (pkg == module+"/bench" || strings.HasPrefix(pkg, module+"/bench/") ||
					pkg == module+"/supervisor/toolbroker") && fw == "github.com/modelcontextprotocol/go-sdk"
				if strings.HasPrefix(dep, fw) && pkg != owner && !mcpClient {
					t.Errorf("%s imports %s: only %s may", pkg, dep, owner)
				}
			}
		}
	}
	leaves := map[string][]string{
		module + "/sandbox/protocol":        nil,
		module + "/sandbox/seccomp":         nil,
		module + "/sandbox/seccomp/unotify": nil,
		module + "/healthz":                 {module + "/supervisor/wire", module + "/sandbox/protocol"},
		module + "/sandbox/policy":          {module + "/sandbox/protocol", module + "/sandbox/seccomp"},
		module + "/supervisor/wire":         {module + "/sandbox/protocol"},
		module + "/supervisor/identity":     nil,
		module + "/supervisor/approvals":    {module + "/supervisor/identity"},
		module + "/supervisor/audit":        {module + "/supervisor/identity", module + "/supervisor/store", module + "/sandbox/protocol"},
	}
	// The daemon's concerns, one room each (see each package's doc): what each must
	// never import. Runs and sessions are peers; the API drives them and the
	// daemon assembles them; the metrics read them.
	sup := module + "/supervisor/"
	never := map[string][]string{
		sup + "runs":     {sup + "sessions", sup + "approvals", sup + "api", sup + "daemon", sup + "mcpserver", sup + "metrics"},
		sup + "sessions": {sup + "runs", sup + "approvals", sup + "audit", sup + "api", sup + "daemon", sup + "mcpserver", sup + "metrics"},
		sup + "metrics":  {sup + "api", sup + "daemon", sup + "mcpserver"},
		sup + "toolbroker": {sup + "runs", sup + "sessions", sup + "api", sup + "daemon", sup + "mcpserver",
			sup + "metrics"},
		// E2B's protocol is a client of the API, as the MCP server is: it reaches
		// sessions and workspaces only through the API's own handler.
		sup + "e2b": {sup + "runs", sup + "sessions", sup + "approvals", sup + "audit", sup + "store", sup + "api",
			sup + "daemon", sup + "mcpserver", sup + "metrics", sup + "workspace", sup + "toolbroker"},
	}
	for pkg, banned := range never {
		for _, dep := range imports[pkg] {
			if contains(banned, dep) {
				t.Errorf("%s imports %s: see its package doc", pkg, dep)
			}
		}
	}
	for leaf, allowed := range leaves {
		for _, dep := range imports[leaf] {
			if strings.HasPrefix(dep, module) && !contains(allowed, dep) {
				t.Errorf("leaf %s imports %s", leaf, dep)
			}
		}
	}
	// A client of the API, and the parent side of the sandbox (which starts workers but
	// is not one), link none of the worker's engine, seccomp, capability or Landlock
	// libraries, nor the daemon's database or HTTP framework: a program that embeds
	// them gets no cgo library and no code it does not run.
	for _, pkg := range []string{"client", "sandbox"} {
		for _, dep := range goList(t, "{{.ImportPath}} {{join .Deps \" \"}}", "./"+pkg)[module+"/"+pkg] {
			for _, banned := range []string{"github.com/bytecodealliance/wasmtime-go", "github.com/seccomp/libseccomp-golang",
				"kernel.org/pub/linux/libs/security/libcap", "github.com/landlock-lsm", "modernc.org/sqlite",
				"github.com/labstack/echo", module + "/sandbox/worker", module + "/supervisor/api"} {
				if strings.HasPrefix(dep, banned) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
	// The lean worker links the sandbox alone: nothing whose package initialisers a
	// worker would run for nothing (the bundle's zstd, the daemon's frameworks).
	for _, dep := range goList(t, "{{.ImportPath}} {{join .Deps \" \"}}", "./cmd/sandcell-worker")[module+"/cmd/sandcell-worker"] {
		if strings.HasPrefix(dep, module+"/") && !strings.HasPrefix(dep, module+"/sandbox/") {
			t.Errorf("the lean worker links %s", dep)
		}
		for _, banned := range []string{"github.com/klauspost", "github.com/prometheus", "github.com/spf13", "google.golang.org/protobuf"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the lean worker links %s", dep)
			}
		}
	}
	for _, dep := range goList(t, "{{.ImportPath}} {{join .Deps \" \"}}", "./sandbox/worker")[module+"/sandbox/worker"] {
		for _, banned := range []string{"net/http", "github.com/labstack/echo", "modernc.org/sqlite", "database/sql"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("the worker links %s", dep)
			}
		}
	}
}

func goList(t *testing.T, format, pattern string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", format, pattern).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			m[f[0]] = f[1:]
		}
	}
	return m
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Audit records are written with the catalog's kinds (store.Kind constants), never a
// string spelled out at the call: a kind misspelled at one call would be a kind no
// reader of the log knows.
func TestAuditKindsFromTheCatalog(t *testing.T) {
	// The kind's argument position in each function that writes a record.
	writers := map[string]int{"Record": 1, "record": 1, "auditWorkspace": 1, "audit": 0}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == "build" || strings.HasPrefix(d.Name(), ".")) {
			if d != nil && d.IsDir() && path != "." {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			case *ast.Ident:
				name = fn.Name
			}
			if i, ok := writers[name]; ok && i < len(call.Args) {
				if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					t.Errorf("%s: %s(..., %s, ...): use a store.Kind", fset.Position(lit.Pos()), name, lit.Value)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Every package of code says what it is: a package doc comment, in one of its files.
// (Directories of tests only, like this one, are not packages anyone imports.)
func TestPackageDocs(t *testing.T) {
	for pkg, f := range goList(t, "{{.ImportPath}} {{len .GoFiles}} {{.Doc}}", "./...") {
		if f[0] != "0" && len(f) < 2 {
			t.Errorf("%s has no package doc", pkg)
		}
	}
}

// No package exports a variable (anything exported can be changed by any importer):
// lists and tables are functions that return a fresh copy, the pinned hashes
// included. Sentinel errors (errors.New, for errors.Is) are the one exception.
func TestNoExportedVariables(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (d.Name() == "build" || d.Name() == "bin" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.Contains(path, "testdata") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !name.IsExported() {
						continue
					}
					if i < len(vs.Values) {
						if call, ok := vs.Values[i].(*ast.CallExpr); ok {
							if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
								if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "errors" && sel.Sel.Name == "New" {
									continue
								}
							}
						}
					}
					t.Errorf("%s: exported variable %s", fset.Position(name.Pos()), name.Name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Problem documents are written in one way (wire.WriteProblem) from three places: the
// API's error edge, the health probes and the connection limiter. A handler that
// wrote its own would skip the edge's refusal record.
func TestOneProblemWriter(t *testing.T) {
	allowed := map[string]bool{"supervisor/api/errors.go": true, "supervisor/api/peer.go": true,
		"healthz/healthz.go": true, "supervisor/wire/wire.go": true}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (d.Name() == "build" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, call := range []string{"WriteProblem(", "NewProblem(", "ContentType)"} {
			if strings.Contains(string(b), call) && !allowed[path] {
				t.Errorf("%s calls %s: return the error to the API's edge instead", path, call)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
