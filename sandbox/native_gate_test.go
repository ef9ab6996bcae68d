package sandbox_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The native gate: numpy's, pandas' and matplotlib's own test suites, as Debian ships
// them in the native root, run with pytest inside real native runs (every layer on,
// processes off, the default policy's but for the limits below). Every failure and
// error must be one testdata/native-gate.txt lists with its cause; one listed that
// no longer fails fails the gate too, so that the list stays true. What is not run
// at all is in nativeSuites, each part with its cause; skips are counted by reason
// in the log. It takes about seven and a half minutes on two cores (numpy 250 s,
// matplotlib 400 s and pandas' DataFrame tests 50 s, side by side), so -short skips it,
// and the warm pass of `make test` too (see TestNativeStackSuites).

// nativeSuite is one pytest run: paths under /usr/lib/python3/dist-packages (the
// rootdir, so test ids read "numpy/_core/tests/test_x.py::..."), pytest arguments,
// and what is not run: an id with "::" is deselected (with every test it is a
// prefix of, at "::" or "["), one without is a file or directory pytest ignores
// (not even imported).
type nativeSuite struct {
	name     string
	paths    []string
	args     []string
	notRun   [][2]string // id, cause
	memoryMB int64
	// minPassed is the fewest tests that must pass (about 95% of what passes on
	// this project's VM): a suite that stops early, or whose files skip at
	// collection, fails the gate instead of passing it on what little ran.
	minPassed int
}

var nativeSuites = []nativeSuite{
	{
		name:      "numpy",
		paths:     []string{"numpy"},
		minPassed: 47_500, // 49,963
		notRun: [][2]string{
			{"numpy/f2py", "f2py's tests build extension modules with meson and a C and Fortran compiler, run as processes: none is in the root"},
		},
	},
	{
		name:      "matplotlib",
		paths:     []string{"matplotlib", "mpl_toolkits"},
		minPassed: 7_800, // 8,231
	},
	{
		name:      "pandas",
		paths:     []string{"pandas/tests/frame"},
		minPassed: 10_100, // 10,662
	},
}

const nativeSitePackages = "/usr/lib/python3/dist-packages"

// nativeGateResult is what testdata/native_gate.py writes to /ws/native-gate.json.
type nativeGateResult struct {
	Status        int                  `json:"status"`
	WallS         float64              `json:"wall_s"`
	CPUS          float64              `json:"cpu_s"`
	Outcomes      map[string][2]string `json:"outcomes"`
	CollectErrors map[string]string    `json:"collect_errors"`
	Deselected    map[string]int       `json:"deselected"`
	Slowest       [][2]any             `json:"slowest"`
}

func TestNativeStackSuites(t *testing.T) {
	if testing.Short() {
		t.Skip("the native gate runs numpy's, pandas' and matplotlib's test suites for about eight minutes: not under -short")
	}
	if warmMode {
		t.Skip("the native gate runs in the cold pass of `make test`: a warm worker execs the same interpreter on the same root, and eight more minutes would test nothing new")
	}
	root := nativeRoot(t)
	if _, err := os.Stat(filepath.Join(root, nativeSitePackages, "pytest")); err != nil {
		t.Fatalf("the native root has no pytest (bundle/native/recipe.sh's NATIVE_ROOTS names python3-pytest; make bundle): %v", err)
	}
	harness, err := os.ReadFile("testdata/native_gate.py")
	if err != nil {
		t.Fatal(err)
	}
	expected := gateList(t, "testdata/native-gate.txt")
	suites := nativeSuites
	if only := os.Getenv("SANDCELL_NATIVE_GATE"); only != "" {
		// A developer's shortcut: SANDCELL_NATIVE_GATE=numpy,pandas runs those alone.
		suites = nil
		for _, s := range nativeSuites {
			if strings.Contains(","+only+",", ","+s.name+",") {
				suites = append(suites, s)
			}
		}
		if len(suites) == 0 {
			t.Fatalf("SANDCELL_NATIVE_GATE=%s names no suite", only)
		}
	}
	start := time.Now()
	results := make([]*nativeGateResult, len(suites))
	t.Run("suites", func(t *testing.T) {
		for i, s := range suites {
			t.Run(s.name, func(t *testing.T) {
				t.Parallel()
				results[i] = runNativeSuite(t, s, string(harness))
			})
		}
	})

	// The verdict, over every suite at once.
	var b strings.Builder
	unexplained, fixed := []string{}, []string{}
	counts := map[string]int{}
	skipReasons := map[string]int{}
	notRun := map[string]int{}
	for i, s := range suites {
		r := results[i]
		if r == nil {
			continue
		}
		failed := map[string]bool{} // listed entries that matched a failure
		var ids []string
		for id := range r.Outcomes {
			ids = append(ids, id)
		}
		for id := range r.CollectErrors {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		c := map[string]int{}
		for _, id := range ids {
			outcome, why := "error", r.CollectErrors[id]
			if o, ok := r.Outcomes[id]; ok {
				outcome, why = o[0], o[1]
			}
			c[outcome]++
			switch outcome {
			case "failed", "error":
				entry := nativeGateEntry(expected, id)
				if entry == "" {
					unexplained = append(unexplained, fmt.Sprintf("%s %s: %s", id, outcome, why))
				} else {
					failed[entry] = true
				}
			case "skipped":
				skipReasons[nativeSkipReason(why)]++
			}
		}
		for entry := range expected {
			if s.owns(entry) && !failed[entry] {
				fixed = append(fixed, entry)
			}
		}
		for why, n := range r.Deselected {
			notRun[why] += n
		}
		fmt.Fprintf(&b, "%s: %d passed, %d failed, %d errors, %d skipped, %d xfailed, %d xpassed, %d deselected in %.0f s (%.0f s of CPU)\n",
			s.name, c["passed"], c["failed"], c["error"], c["skipped"], c["xfailed"], c["xpassed"], nativeSum(r.Deselected), r.WallS, r.CPUS)
		for k, v := range c {
			counts[k] += v
		}
	}
	fmt.Fprintf(&b, "native gate: %d passed, %d failed or raised (all listed), %d skipped, %d xfailed, %d xpassed in %v\n",
		counts["passed"], counts["failed"]+counts["error"], counts["skipped"], counts["xfailed"], counts["xpassed"],
		time.Since(start).Round(time.Second))
	for _, r := range nativeByCount(skipReasons) {
		fmt.Fprintf(&b, "  %5d skipped: %s\n", skipReasons[r], r)
	}
	for _, r := range nativeByCount(notRun) {
		fmt.Fprintf(&b, "  %5d deselected: %s\n", notRun[r], r)
	}
	t.Log(b.String())
	sort.Strings(unexplained)
	sort.Strings(fixed)
	if len(unexplained) > 0 {
		t.Errorf("%d failures no entry of testdata/native-gate.txt explains:\n  %s", len(unexplained), strings.Join(unexplained, "\n  "))
	}
	if len(fixed) > 0 {
		t.Errorf("listed in testdata/native-gate.txt but no longer failing (remove them):\n  %s", strings.Join(fixed, "\n  "))
	}
}

// runNativeSuite runs one suite in a native run and returns what the harness wrote,
// or nil (the test failed, saying why) when it wrote nothing.
func runNativeSuite(t *testing.T, s nativeSuite, harness string) *nativeGateResult {
	spec := struct {
		Deselect [][2]string `json:"deselect"`
	}{Deselect: [][2]string{}}
	args := []string{"-p", "no:cacheprovider", "--rootdir", nativeSitePackages, "-q", "--tb=short", "-rfE",
		"--disable-warnings", "--continue-on-collection-errors", "--hypothesis-seed=0"}
	for _, n := range s.notRun {
		if strings.Contains(n[0], "::") {
			spec.Deselect = append(spec.Deselect, n)
		} else {
			args = append(args, "--ignore="+nativeSitePackages+"/"+n[0])
		}
	}
	args = append(args, s.args...)
	for _, p := range s.paths {
		args = append(args, nativeSitePackages+"/"+p)
	}
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	memory := s.memoryMB
	if memory == 0 {
		memory = 3072
	}
	start := time.Now()
	res, ws := runNative(t, harness, func(r *protocol.Request, p *policy.Policy) {
		r.Args = append([]string{string(js)}, args...)
		// Seven minutes on an idle two-core machine, all three at once; a loaded
		// one (CI runs other packages' tests beside these) may take three times that.
		p.Max.TimeoutMS = 1_800_000
		r.Limits.TimeoutMS = 1_800_000
		r.Limits.MemoryBytes = memory << 20
		r.Limits.MaxStdoutBytes = 32 << 20
		r.Limits.MaxStderrBytes = 16 << 20
		p.NativeTmpBytes = 2 << 30
	})
	if dir := os.Getenv("SANDCELL_NATIVE_GATE_OUT"); dir != "" {
		// A developer's aid: the suite's report and output, kept.
		os.MkdirAll(dir, 0o755)
		b, _ := os.ReadFile(filepath.Join(ws, "native-gate.json"))
		os.WriteFile(filepath.Join(dir, s.name+".json"), b, 0o644)
		os.WriteFile(filepath.Join(dir, s.name+".out"), res.Stdout, 0o644)
		os.WriteFile(filepath.Join(dir, s.name+".err"), res.Stderr, 0o644)
	}
	b, err := os.ReadFile(filepath.Join(ws, "native-gate.json"))
	var r nativeGateResult
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		t.Errorf("%s wrote no outcome (%v; %s, exit %d, %v, after %v)\nstdout: ...%s\nstderr: ...%s", s.name, err, res.Reason,
			res.ExitCode, res.Diagnostics, time.Since(start).Round(time.Second), nativeTail(res.Stdout, 3000), nativeTail(res.Stderr, 3000))
		return nil
	}
	var slow []string
	for _, x := range r.Slowest {
		slow = append(slow, fmt.Sprintf("%6.1f s %v", x[1], x[0]))
	}
	t.Logf("%s: pytest status %d, %d tests in %.0f s (%.0f s of CPU), %v in all; slowest:\n  %s", s.name, r.Status,
		len(r.Outcomes), r.WallS, r.CPUS, time.Since(start).Round(time.Second), strings.Join(slow, "\n  "))
	if r.Status != 0 && r.Status != 1 {
		// pytest's own exit codes: 2 interrupted, 3 internal error, 4 usage, 5 no tests.
		t.Errorf("%s: pytest ended with status %d, not 0 or 1 (tests passed or failed)", s.name, r.Status)
	}
	if res.Reason != protocol.Exited {
		t.Errorf("%s: the run ended %s: %v", s.name, res.Reason, res.Diagnostics)
	}
	passed := 0
	for _, o := range r.Outcomes {
		if o[0] == "passed" {
			passed++
		}
	}
	if passed < s.minPassed {
		t.Errorf("%s: %d tests passed, fewer than the %d the gate expects", s.name, passed, s.minPassed)
	}
	return &r
}

// owns says whether a listed id is one of s's tests (its suite ran).
func (s nativeSuite) owns(id string) bool {
	for _, p := range s.paths {
		if id == p || strings.HasPrefix(id, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

// nativeGateEntry returns the entry of expected that explains the failure of id: id
// itself, or the longest entry that is its prefix at "::", "[" or "/".
func nativeGateEntry(expected map[string]string, id string) string {
	best := ""
	for e := range expected {
		if len(e) <= len(best) {
			continue
		}
		if id == e || (strings.HasPrefix(id, e) && strings.ContainsAny(id[len(e):len(e)+1], ":[/")) {
			best = e
		}
	}
	return best
}

// nativeSkipReason is a skip's reason with what varies per test (a parameter, a
// number) left in: pytest's reasons are short; only "file:line: " is cut.
func nativeSkipReason(why string) string {
	why = strings.TrimPrefix(why, "Skipped: ")
	if len(why) > 160 {
		why = why[:160] + "..."
	}
	return why
}

func nativeSum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func nativeByCount(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}

func nativeTail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
