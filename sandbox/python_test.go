package sandbox_test

import (
	"strings"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The IANA zone data is there for zoneinfo, dateutil and pytz, read-only, with the
// backward names (US/Eastern, Asia/Calcutta, EST5EDT).
func TestTimeZones(t *testing.T) {
	res, _ := run(t, `
import datetime, zoneinfo, dateutil.tz, pytz
paris = zoneinfo.ZoneInfo("Europe/Paris")
print(datetime.datetime(2026, 7, 1, 12, tzinfo=paris).utcoffset(), datetime.datetime(2026, 1, 1, tzinfo=paris).tzname())
print(len(zoneinfo.available_timezones()) > 400, "America/New_York" in zoneinfo.available_timezones())
print(dateutil.tz.gettz("Asia/Tokyo").utcoffset(datetime.datetime(2026, 1, 1)))
print(pytz.timezone("America/Sao_Paulo").zone, pytz.OLSON_VERSION)
print(zoneinfo.ZoneInfo("US/Eastern").key, pytz.timezone("Asia/Calcutta").zone, dateutil.tz.gettz("EST5EDT") is not None)
try:
    open("/usr/share/zoneinfo/Europe/Paris", "ab")
except OSError as e:
    print("read-only:", type(e).__name__)
`, nil)
	wantOutput(t, res, "2:00:00 CET\nTrue True\n9:00:00\nAmerica/Sao_Paulo 2026c\nUS/Eastern Asia/Calcutta True\nread-only: PermissionError\n")
}

// The site layer's libraries import and work; an isolated program (the daemon's own)
// does not see them.
func TestSiteLibraries(t *testing.T) {
	res, _ := run(t, `
import sys, datetime
import dateutil.parser, six, openpyxl, et_xmlfile, xlrd, petl, agate, tabulate, babel.numbers
wb = openpyxl.Workbook()
wb.active["A1"] = 42
wb.save("/ws/book.xlsx")
print(openpyxl.load_workbook("/ws/book.xlsx").active["A1"].value)
print(dateutil.parser.parse("2 Dec 2026 10:30").isoformat())
print(tabulate.tabulate([[1, 2]], headers=["a", "b"], tablefmt="plain").replace(" ", ""))
table = agate.Table([[1], [2]], ["n"], [agate.Number()])
print(table.aggregate(agate.Sum("n")))
print(petl.nrows(petl.fromdicts([{"a": 1}, {"a": 2}])))
print(babel.numbers.format_decimal(1234.5, locale="de_DE"))
print(sys.path[-1])
`, nil)
	wantOutput(t, res, "42\n2026-12-02T10:30:00\nab\n12\n3\n2\n1.234,5\n/usr/local/lib/python3.13/site-packages\n")
}

// sys.executable is empty (there is no executable in the guest), which platform
// understands.
func TestExecutableAndPlatform(t *testing.T) {
	res, _ := run(t, `
import sys, platform
print(repr(sys.executable), platform.libc_ver(), platform.system(), sys.orig_argv[0])
`, nil)
	wantOutput(t, res, "'' ('', '') wasi /usr/local/bin/python\n")
}

// Several connections of one program to one SQLite file lock as on POSIX: readers
// beside one writer, one writer at a time; the lock directory other programs see is
// held while any is, and gone once all are done.
func TestSQLiteConnectionsOfOneProgram(t *testing.T) {
	res, _ := run(t, `
import os, sqlite3
a = sqlite3.connect("/ws/d.db")
a.execute("create table t(x)")
a.commit()
a.execute("insert into t values (1)")   # a holds the write lock, uncommitted
b = sqlite3.connect("/ws/d.db", timeout=0.1)
print("b reads", b.execute("select count(*) from t").fetchone()[0])
try:
    b.execute("insert into t values (2)")
except sqlite3.OperationalError as e:
    print("b writes:", e)
b.rollback()
print("locked for others:", os.path.isdir("/ws/d.db.lock"))
a.commit()
print("b reads", b.execute("select count(*) from t").fetchone()[0])
b.execute("insert into t values (3)")
b.commit()
print("a reads", a.execute("select sum(x) from t").fetchone()[0])
a.close(); b.close()
print("locked for others:", os.path.isdir("/ws/d.db.lock"))
`, nil)
	wantOutput(t, res, "b reads 0\nb writes: database is locked\nlocked for others: True\nb reads 1\na reads 4\nlocked for others: False\n")
}

// Another program holding the lock (its directory) keeps this one's connections
// out, as before: the lock between programs is unchanged.
func TestSQLiteLockBetweenPrograms(t *testing.T) {
	res, _ := run(t, `
import os, sqlite3
c = sqlite3.connect("/ws/d.db")
c.execute("create table t(x)")
c.commit()
c.close()
os.mkdir("/ws/d.db.lock")   # as another program's connection holds it
c = sqlite3.connect("/ws/d.db", timeout=0.1)
try:
    c.execute("select * from t").fetchall()
except sqlite3.OperationalError as e:
    print(e)
os.rmdir("/ws/d.db.lock")
print(c.execute("select count(*) from t").fetchone()[0])
`, nil)
	wantExit(t, res, 0)
	if want := "database is locked\n0\n"; !strings.HasPrefix(string(res.Stdout), want) {
		t.Fatalf("stdout %q, want %q\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

// A program of the daemon's own (Isolated) has the standard library alone on sys.path.
func TestIsolatedProgramWithoutSiteLayer(t *testing.T) {
	res, _ := run(t, "import sys\nprint(sys.path)\ntry:\n    import six\nexcept ImportError:\n    print('no six')", func(r *protocol.Request) {
		r.Isolated = true
	})
	wantExit(t, res, 0)
	if out := string(res.Stdout); strings.Contains(out, "site-packages") || !strings.Contains(out, "no six") {
		t.Fatalf("isolated: %s", out)
	}
}

// A transaction across attached databases commits without an error (SQLite's
// directory fsync after its super-journal, which WASI cannot do, is off).
func TestSQLiteAttachedCommit(t *testing.T) {
	res, _ := run(t, `
import sqlite3
c = sqlite3.connect("/ws/main.db", autocommit=True)
c.execute("attach '/ws/other.db' as o")
c.execute("create table o.t(x)")
c.execute("create table main.t(x)")
c.execute("begin")
c.execute("insert into o.t values (1)")
c.execute("insert into main.t values (2)")
c.execute("commit")
print(c.execute("select (select x from o.t), (select x from main.t)").fetchone())
`, nil)
	wantOutput(t, res, "(1, 2)\n")
}

// wantOutput fails t unless res exited 0 having printed want.
func wantOutput(t *testing.T, res protocol.Result, want string) {
	t.Helper()
	wantExit(t, res, 0)
	if string(res.Stdout) != want {
		t.Fatalf("stdout %q, want %q\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}
