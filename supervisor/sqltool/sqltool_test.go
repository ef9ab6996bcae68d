package sqltool

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	os.Exit(m.Run())
}

func base(t *testing.T) protocol.Request {
	p := policy.Default()
	limits, err := p.Resolve(protocol.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return protocol.Request{Limits: limits, Hardening: p.Hardening(limits), ModulePath: bundletest.Module(t, false),
		LibDir: bundletest.LibDir(t)}
}

type fixture struct {
	t   *testing.T
	dir string
	b   protocol.Request
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, dir: t.TempDir(), b: base(t)}
	os.WriteFile(filepath.Join(f.dir, "t.db"), nil, 0o644) // an empty file is an empty database
	f.run(Request{DB: "t.db", Write: true, SQL: "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, big INTEGER, data BLOB, score REAL)"})
	f.run(Request{DB: "t.db", Write: true, SQL: "INSERT INTO t (name, big, data, score) VALUES ('a', 9007199254740993, x'00ff', 1.5), ('b', 2, NULL, NULL)"})
	return f
}

func (f *fixture) run(r Request) Outcome {
	f.t.Helper()
	out, err := Run(context.Background(), sandbox.NewSpawner(), f.dir, r, f.b)
	if err != nil {
		f.t.Fatalf("%s: %v", r.SQL, err)
	}
	if r.Write && out.Status != "ok" {
		f.t.Fatalf("%s: %+v %+v", r.SQL, out, out.Error)
	}
	return out
}

func (f *fixture) sum() [32]byte {
	b, err := os.ReadFile(filepath.Join(f.dir, "t.db"))
	if err != nil {
		f.t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestRead(t *testing.T) {
	f := newFixture(t)
	out := f.run(Request{DB: "t.db", SQL: "SELECT id, name, big, data, score FROM t ORDER BY id"})
	if out.Status != "ok" || out.Classification.Kind != "read" || len(out.Rows) != 2 || out.Truncated {
		t.Fatalf("%+v", out)
	}
	if got := string(out.Rows[0]); got != `[1, "a", "9007199254740993", {"base64": "AP8="}, 1.5]` {
		t.Fatalf("row: %s", got)
	}
	if out.Columns[1] != (Column{Name: "name", DeclType: "TEXT"}) || out.Columns[2].DeclType != "INTEGER" {
		t.Fatalf("columns: %+v", out.Columns)
	}
	out = f.run(Request{DB: "t.db", SQL: "SELECT name FROM t WHERE id = ?", Params: json.RawMessage(`[2]`)})
	if len(out.Rows) != 1 || string(out.Rows[0]) != `["b"]` {
		t.Fatalf("params: %+v", out)
	}
	out = f.run(Request{DB: "t.db", SQL: "SELECT name FROM t WHERE id = :id", Params: json.RawMessage(`{"id": 1}`)})
	if len(out.Rows) != 1 || string(out.Rows[0]) != `["a"]` {
		t.Fatalf("named params: %+v", out)
	}
	for _, sql := range []string{"PRAGMA table_info(t)", "EXPLAIN QUERY PLAN SELECT * FROM t", "PRAGMA user_version",
		"WITH x AS (SELECT 1) SELECT * FROM x"} {
		if out := f.run(Request{DB: "t.db", SQL: sql}); out.Status != "ok" || out.Classification.Kind != "read" {
			t.Errorf("%s: %+v %+v", sql, out, out.Error)
		}
	}
}

func TestMaxRows(t *testing.T) {
	f := newFixture(t)
	f.run(Request{DB: "t.db", Write: true, SQL: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) INSERT INTO t (name) SELECT 'n' || x FROM c"})
	out := f.run(Request{DB: "t.db", SQL: "SELECT id, name FROM t", MaxRows: 500})
	if out.Status != "ok" || len(out.Rows) != 500 || !out.Truncated {
		t.Fatalf("%d rows, truncated %v", len(out.Rows), out.Truncated)
	}
	out = f.run(Request{DB: "t.db", SQL: "SELECT count(*) FROM t"})
	if string(out.Rows[0]) != "[20002]" || out.Truncated {
		t.Fatalf("%+v", out)
	}
}

// Every kind of statement that has defeated "read-only" SQL tools, writing or
// reaching beyond the database: refused, or held for approval; the file's bytes
// never change.
func TestRefusedAndHeld(t *testing.T) {
	f := newFixture(t)
	before := f.sum()
	for sql, want := range map[string]string{
		"INSERT INTO t (name) VALUES ('x')":                "approval_required",
		"UPDATE t SET name = 'y'":                          "approval_required",
		"DELETE FROM t":                                    "approval_required",
		"WITH x AS (SELECT 1) DELETE FROM t WHERE id IN x": "approval_required",
		"DELETE FROM t WHERE id = 1 RETURNING *":           "approval_required",
		"CREATE TABLE u (x)":                               "approval_required",
		"DROP TABLE t":                                     "approval_required",
		"ALTER TABLE t ADD COLUMN z":                       "approval_required",
		"CREATE INDEX i ON t (name)":                       "approval_required",
		"PRAGMA user_version = 7":                          "approval_required",
		"PRAGMA journal_mode = WAL":                        "approval_required",
		"VACUUM":                                           "approval_required",
		"REPLACE INTO t (id, name) VALUES (1, 'z')":        "approval_required",
		"ATTACH 'other.db' AS o":                           "refused",
		"ATTACH ':memory:' AS m":                           "refused",
		"DETACH main":                                      "refused",
		"VACUUM INTO 'copy.db'":                            "refused",
		"PRAGMA writable_schema = ON":                      "refused",
		"PRAGMA temp_store_directory = '/ws'":              "refused",
		"PRAGMA trusted_schema = ON":                       "refused",
		"PRAGMA query_only = OFF":                          "refused",
		"SELECT 1; DELETE FROM t":                          "refused",
		"BEGIN":                                            "refused",
		"SAVEPOINT s":                                      "refused",
		"SELECT load_extension('/ws/evil.so')":             "error",
		"SELECT readfile('/etc/passwd')":                   "error",
		"SELECT writefile('/ws/x', 'y')":                   "error",
		"SELECT randomblob(1000000000)":                    "error",
		"SELECT zeroblob(1000000000)":                      "error",
		"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c": "error",
	} {
		r := Request{DB: "t.db", SQL: sql}
		if strings.HasPrefix(sql, "WITH RECURSIVE") {
			r.TimeoutMS = 300
		}
		out := f.run(r)
		if out.Status != want {
			t.Errorf("%s: %s (%s %+v), want %s", sql, out.Status, out.Reason, out.Error, want)
		}
		if f.sum() != before {
			t.Fatalf("%s changed the file", sql)
		}
	}
	for _, name := range []string{"other.db", "copy.db", "x"} {
		if _, err := os.Stat(filepath.Join(f.dir, name)); err == nil {
			t.Errorf("%s was created", name)
		}
	}
	out := f.run(Request{DB: "t.db", SQL: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", TimeoutMS: 300})
	if out.Error == nil || out.Error.Code != "sql_interrupted" {
		t.Fatalf("time limit: %+v", out.Error)
	}
	// With approval (Write) the held statement runs, read-write, once.
	out = f.run(Request{DB: "t.db", SQL: "DELETE FROM t WHERE id = 1 RETURNING name", Write: true})
	if out.Changes != 1 || len(out.Rows) != 1 || string(out.Rows[0]) != `["a"]` {
		t.Fatalf("approved write: %+v", out)
	}
}

func TestErrors(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(filepath.Join(f.dir, "corrupt.db"), []byte(strings.Repeat("not a database ", 100)), 0o644)
	for sql, code := range map[string]string{"SELEC 1": "sql_syntax_error", "SELECT * FROM missing": "sql_error"} {
		if out := f.run(Request{DB: "t.db", SQL: sql}); out.Error == nil || out.Error.Code != code {
			t.Errorf("%s: %+v", sql, out.Error)
		}
	}
	if out := f.run(Request{DB: "corrupt.db", SQL: "SELECT * FROM sqlite_master"}); out.Error == nil || out.Error.Code != "sql_not_a_database" {
		t.Errorf("corrupt: %+v", out.Error)
	}
	os.Symlink(filepath.Join(f.dir, "t.db"), filepath.Join(f.dir, "link.db"))
	os.Mkdir(filepath.Join(f.dir, "dir.db"), 0o755)
	for db, want := range map[string]error{"../t.db": workspace.ErrBadPath, "/etc/passwd": workspace.ErrBadPath,
		"missing.db": workspace.ErrNotFound, "link.db": workspace.ErrUnsafe, "dir.db": workspace.ErrUnsafe,
		"file:t.db?mode=rwc": ErrBadRequest, "t.db?mode=rw": ErrBadRequest} {
		if _, err := Run(context.Background(), sandbox.NewSpawner(), f.dir, Request{DB: db, SQL: "SELECT 1"}, f.b); !errors.Is(err, want) {
			t.Errorf("db %q: %v, want %v", db, err, want)
		}
	}
	for _, r := range []Request{{DB: "t.db", SQL: " "}, {DB: "t.db", SQL: "SELECT 1", MaxRows: -1},
		{DB: "t.db", SQL: "SELECT ?", Params: json.RawMessage(`"x"`)}} {
		if _, err := Run(context.Background(), sandbox.NewSpawner(), f.dir, r, f.b); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%+v: %v", r, err)
		}
	}
}

// Review findings: triggers of a hostile file never fire, bad parameters and huge
// results are errors (not crashes), reading PRAGMA journal_mode is a read.
func TestHostileFileAndParams(t *testing.T) {
	f := newFixture(t)
	f.run(Request{DB: "t.db", Write: true, SQL: "CREATE TABLE secrets (s TEXT)"})
	f.run(Request{DB: "t.db", Write: true, SQL: "INSERT INTO secrets VALUES ('keep')"})
	f.run(Request{DB: "t.db", Write: true, SQL: "CREATE TRIGGER wipe AFTER DELETE ON t BEGIN DELETE FROM secrets; END"})
	if out := f.run(Request{DB: "t.db", Write: true, SQL: "DELETE FROM t WHERE id = 2"}); out.Changes != 1 {
		t.Fatalf("delete: %+v", out)
	}
	if out := f.run(Request{DB: "t.db", SQL: "SELECT count(*) FROM secrets"}); string(out.Rows[0]) != "[1]" {
		t.Fatalf("the trigger fired: %s", out.Rows[0])
	}
	for params, code := range map[string]string{`[99999999999999999999]`: "sql_error", `[{"base64": "!!"}]`: "sql_error",
		`[[1]]`: "sql_error", `{"b": {"base64": "AAE=", "x": 1}}`: "sql_error"} {
		out := f.run(Request{DB: "t.db", SQL: "SELECT ?1", Params: json.RawMessage(params)})
		if out.Error == nil || out.Error.Code != code {
			t.Errorf("%s: %+v", params, out)
		}
	}
	if out := f.run(Request{DB: "t.db", SQL: "SELECT :b", Params: json.RawMessage(`{"b": {"base64": "AAE="}}`)}); out.Status != "ok" || string(out.Rows[0]) != `[{"base64": "AAE="}]` {
		t.Fatalf("named blob: %+v", out)
	}
	out := f.run(Request{DB: "t.db", SQL: "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 100) SELECT zeroblob(10000000) FROM r"})
	if out.Error == nil || out.Error.Code != "sql_result_too_large" {
		t.Fatalf("huge result: %+v", out.Error)
	}
	if out := f.run(Request{DB: "t.db", SQL: "PRAGMA journal_mode"}); out.Status != "ok" || out.Classification.Kind != "read" {
		t.Fatalf("journal_mode: %+v", out)
	}
	// JSON has no number for an infinity: it travels as a string, never as the
	// non-standard Infinity that no JSON parser accepts.
	if out := f.run(Request{DB: "t.db", SQL: "SELECT 1e999, -1e999"}); out.Status != "ok" || string(out.Rows[0]) != `["Infinity", "-Infinity"]` {
		t.Fatalf("infinities: %+v %+v", out, out.Error)
	}
	if out := f.run(Request{DB: "t.db", SQL: "SELECT * FROM secrets WHERE 0"}); out.Status != "ok" || out.Rows == nil || len(out.Rows) != 0 {
		t.Fatalf("empty: %+v", out)
	}
}

// The tool's program runs with the workspace as /ws and its working directory, so
// the workspace may hold a module named like any the program imports (every standard
// module's name, as a file and as a package, and the site hooks): none is imported,
// a read stays a read and the file's bytes do not change.
func TestPlantedModules(t *testing.T) {
	f := newFixture(t)
	names := stdlibNames(t, f)
	payload := "open('/ws/planted-ran', 'a').write(__name__ + '\\n')\n" +
		"open('/ws/t.db', 'r+b').write(b'overwritten by a planted module')\n"
	packages := map[string]bool{"sqlite3": true, "json": true, "urllib": true, "base64": true, "encodings": true}
	for _, n := range append(names, "sitecustomize", "usercustomize") {
		p := filepath.Join(f.dir, n+".py")
		if packages[n] {
			os.Mkdir(filepath.Join(f.dir, n), 0o755)
			p = filepath.Join(f.dir, n, "__init__.py")
		}
		if err := os.WriteFile(p, []byte(payload), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := f.sum()
	out := f.run(Request{DB: "t.db", SQL: "SELECT count(*) FROM t"})
	if out.Status != "ok" || out.Classification == nil || out.Classification.Kind != "read" || string(out.Rows[0]) != "[2]" {
		t.Fatalf("read with planted modules: %+v %+v", out, out.Error)
	}
	if b, err := os.ReadFile(filepath.Join(f.dir, "planted-ran")); err == nil {
		t.Fatalf("planted modules ran: %q", b)
	}
	if f.sum() != before {
		t.Fatal("the database changed")
	}
	// An approved write runs the same program: the planted modules stay out of it too.
	if out := f.run(Request{DB: "t.db", Write: true, SQL: "DELETE FROM t WHERE id = 2"}); out.Changes != 1 {
		t.Fatalf("delete: %+v", out)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "planted-ran")); err == nil {
		t.Fatal("planted modules ran in the write")
	}
}

// stdlibNames is sys.stdlib_module_names of the sandboxed interpreter.
func stdlibNames(t *testing.T, f *fixture) []string {
	t.Helper()
	req := f.b
	req.Code, req.Workspace = "import sys; print('\\n'.join(sorted(sys.stdlib_module_names)))", t.TempDir()
	res, err := sandbox.NewSpawner().Run(context.Background(), req)
	if err != nil || res.Reason != protocol.Exited || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	names := strings.Fields(string(res.Stdout))
	if len(names) < 100 {
		t.Fatalf("stdlib_module_names: %d names", len(names))
	}
	return names
}

// A read that needs temporary storage (DISTINCT over large values) keeps it in
// memory: it answers, and writes nothing into the workspace.
func TestReadNeedsNoTemporaryFile(t *testing.T) {
	f := newFixture(t)
	before := f.sum()
	out := f.run(Request{DB: "t.db", SQL: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) SELECT count(*) FROM (SELECT DISTINCT randomblob(1000) FROM c)"})
	if out.Status != "ok" || string(out.Rows[0]) != "[20000]" {
		t.Fatalf("%+v %+v", out, out.Error)
	}
	names, _ := os.ReadDir(f.dir)
	if len(names) != 1 || f.sum() != before {
		t.Fatalf("the workspace changed: %v", names)
	}
}
