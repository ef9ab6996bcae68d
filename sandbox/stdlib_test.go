package sandbox_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The stdlib gate: modules of CPython's own test suite (Lib/test of the source
// tarball the interpreter is built from) run inside real runs with every layer on.
// Every failure and error must be one testdata/stdlib-gate.txt lists with its cause
// (what WASI lacks, or what the sandbox withholds on purpose); one listed that no
// longer fails fails the gate too, so that the list stays true. The skips are
// counted by reason in the log.
//
// gateModules are the modules run: the language, the data types, text, files,
// compression, math, dates and data formats. -short runs gateShort, a part that
// covers each kind in about a minute.
var gateModules = []string{
	// the language
	"test_grammar", "test_syntax", "test_types", "test_builtin", "test_int", "test_long", "test_float",
	"test_complex", "test_bool", "test_exceptions", "test_class", "test_descr", "test_scope",
	"test_generators", "test_coroutines", "test_with", "test_contextlib", "test_functools",
	"test_itertools", "test_operator", "test_keywordonlyarg", "test_unpack", "test_fstring",
	"test_format", "test_print", "test_augassign", "test_genexps", "test_listcomps", "test_setcomps",
	"test_dictcomps", "test_opcodes", "test_compile", "test_ast", "test_dataclasses", "test_enum",
	"test_typing", "test_abc", "test_copy", "test_pickle", "test_weakref", "test_iter", "test_property",
	"test_super", "test_dis", "test_tokenize", "test_traceback", "test_inspect", "test_string_literals",
	"test_unicode_identifiers", "test_patma", "test_exception_group", "test_raise", "test_global",
	// the data types
	"test_str", "test_bytes", "test_list", "test_tuple", "test_dict", "test_set", "test_slice",
	"test_range", "test_enumerate", "test_collections", "test_deque", "test_defaultdict",
	"test_ordered_dict", "test_heapq", "test_bisect", "test_array", "test_struct", "test_memoryview",
	"test_userdict", "test_userlist", "test_userstring", "test_reprlib", "test_pprint",
	// text
	"test_string", "test_re", "test_textwrap", "test_difflib", "test_fnmatch", "test_shlex",
	"test_codecs", "test_unicodedata", "test_base64", "test_binascii", "test_hashlib", "test_hmac",
	"test_uuid", "test_html", "test_htmlparser", "test_locale",
	// data formats
	"test_json", "test_csv", "test_configparser", "test_tomllib", "test_plistlib", "test_xml_etree",
	"test_minidom", "test_sqlite3", "test_argparse", "test_getopt",
	// dates
	"test_datetime", "test_time", "test_calendar", "test_strptime", "test_zoneinfo",
	// math
	"test_math", "test_cmath", "test_decimal", "test_fractions", "test_statistics", "test_random",
	"test_numeric_tower",
	// files
	"test_fileio", "test_file", "test_io", "test_pathlib", "test_glob", "test_shutil", "test_tempfile",
	"test_filecmp", "test_fileinput", "test_posixpath", "test_genericpath", "test_stat", "test_linecache",
	"test_os", "test_logging",
	// compression and archives
	"test_zlib", "test_gzip", "test_bz2", "test_lzma", "test_zipfile", "test_tarfile", "test_zipimport",
	"test_platform",
}

var gateShort = []string{
	"test_grammar", "test_int", "test_str", "test_dict", "test_re", "test_json", "test_csv",
	"test_sqlite3", "test_datetime", "test_zoneinfo", "test_math", "test_fractions", "test_fileio",
	"test_pathlib", "test_gzip", "test_zipfile", "test_platform",
}

// gateOutcome is what testdata/stdlib_gate.py prints for one module.
type gateOutcome struct {
	Module    string      `json:"module"`
	Run       int         `json:"run"`
	Failures  [][2]string `json:"failures"`
	Errors    [][2]string `json:"errors"`
	Skipped   [][2]string `json:"skipped"`
	LoadError string      `json:"load_error"`
}

func TestCPythonTestSuite(t *testing.T) {
	modules := gateModules
	if testing.Short() {
		modules = gateShort
	}
	ws := gateWorkspace(t)
	expected := gateList(t, "testdata/stdlib-gate.txt")
	harness, err := os.ReadFile("testdata/stdlib_gate.py")
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	outcomes := map[string]gateOutcome{}
	t.Run("modules", func(t *testing.T) {
		for _, m := range modules {
			t.Run(m, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				res, _ := run(t, string(harness), func(r *protocol.Request) {
					r.Workspace = ws
					r.Args = []string{m}
					r.Limits.TimeoutMS = 600_000
					r.Limits.MemoryBytes = 1 << 30
					r.Limits.MaxStdoutBytes = 16 << 20
					r.Limits.MaxStderrBytes = 16 << 20
				})
				o, ok := parseGate(string(res.Stdout))
				if !ok {
					t.Errorf("%s printed no outcome (%s, exit %d, %q)\nstderr: %.3000s", m, res.Reason, res.ExitCode, res.Diagnostics, res.Stderr)
					return
				}
				t.Logf("%s: %d run, %d failures, %d errors, %d skipped in %v", m, o.Run, len(o.Failures), len(o.Errors),
					len(o.Skipped), time.Since(start).Round(time.Millisecond))
				mu.Lock()
				outcomes[m] = o
				mu.Unlock()
			})
		}
	})

	// The verdict, over every module at once.
	var runs, skips int
	unexplained, fixed := []string{}, []string{}
	failed := map[string]bool{}
	skipReasons := map[string]int{}
	for _, m := range modules {
		o, ok := outcomes[m]
		if !ok {
			continue
		}
		runs += o.Run
		if o.LoadError != "" {
			failed[m] = true
			if expected[m] == "" {
				unexplained = append(unexplained, fmt.Sprintf("%s does not load: %s", m, o.LoadError))
			}
		}
		for _, f := range append(o.Failures, o.Errors...) {
			id := gateID(f[0])
			failed[id] = true
			if expected[id] == "" {
				unexplained = append(unexplained, fmt.Sprintf("%s: %s", f[0], f[1]))
			}
		}
		for _, s := range o.Skipped {
			skips++
			skipReasons[s[1]]++
		}
	}
	for id := range expected {
		mod := strings.SplitN(strings.TrimPrefix(id, "test."), ".", 2)[0]
		if _, ran := outcomes[mod]; ran && !failed[id] {
			fixed = append(fixed, id)
		}
	}
	sort.Strings(fixed)
	reasons := make([]string, 0, len(skipReasons))
	for r := range skipReasons {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool { return skipReasons[reasons[i]] > skipReasons[reasons[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "stdlib gate: %d modules, %d tests run, %d failed or raised (all listed), %d skipped\n",
		len(outcomes), runs, len(failed), skips)
	for _, r := range reasons {
		fmt.Fprintf(&b, "  %5d skipped: %s\n", skipReasons[r], r)
	}
	t.Log(b.String())
	if len(unexplained) > 0 {
		t.Errorf("%d failures no entry of testdata/stdlib-gate.txt explains:\n  %s", len(unexplained), strings.Join(unexplained, "\n  "))
	}
	if len(fixed) > 0 {
		t.Errorf("listed in testdata/stdlib-gate.txt but no longer failing (remove them):\n  %s", strings.Join(fixed, "\n  "))
	}
}

// gateID is the id a failure is listed by: a subtest's is its test's; a module whose
// import failed (unittest's _FailedTest) is the module's name.
func gateID(id string) string {
	id, _, _ = strings.Cut(id, " ")
	if m, ok := strings.CutPrefix(id, "unittest.loader._FailedTest."); ok {
		return m
	}
	return id
}

func parseGate(stdout string) (gateOutcome, bool) {
	i := strings.LastIndex(stdout, "\nSTDLIB-GATE ")
	if i < 0 {
		return gateOutcome{}, false
	}
	var o gateOutcome
	line, _, _ := strings.Cut(stdout[i+len("\nSTDLIB-GATE "):], "\n")
	return o, json.Unmarshal([]byte(line), &o) == nil
}

// gateList reads a gate's list of expected failures (testdata/stdlib-gate.txt,
// testdata/native-gate.txt): per line a test id (or what the gate matches ids
// against: a module that does not load, a prefix of ids), whitespace, and its cause;
// # starts a comment. An entry without a cause, or listed twice, fails t.
func gateList(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, why, _ := strings.Cut(line, " ")
		if strings.TrimSpace(why) == "" {
			t.Fatalf("%s: %s has no cause", path, id)
		}
		if _, dup := m[id]; dup {
			t.Fatalf("%s: %s is listed twice", path, id)
		}
		m[id] = strings.TrimSpace(why)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// gateWorkspace is a workspace holding Lib/test as /ws/test, from the pinned CPython
// source tarball in the interpreter build's cache (which `make interpreter` fills).
func gateWorkspace(t *testing.T) string {
	t.Helper()
	src := bundle.Pinned().Sources[0]
	cache := os.Getenv("SANDCELL_BUILD_CACHE")
	if cache == "" {
		cache = "/var/cache/sandcell-build"
	}
	tarball := filepath.Join(cache, "src", src.Name)
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatalf("CPython's source tarball, which holds its test suite, is not in the build cache (run `make interpreter`): %v", err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil || hex.EncodeToString(h.Sum(nil)) != src.SHA256 {
		t.Fatalf("%s is not the pinned source (%v)", tarball, err)
	}
	ws := t.TempDir()
	version := bundle.Pinned().Version
	cmd := exec.Command("tar", "-xJf", tarball, "-C", ws, "--strip-components=2", "Python-"+version+"/Lib/test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	return ws
}
