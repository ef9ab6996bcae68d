// Command chaos is `make chaos`: faults injected into a real daemon under load, and
// what must hold after each.
//
//   - kill: SIGKILL of the daemon during a burst of runs, -kills times. Two seconds
//     later none of its workers is left; the audit chain verifies (the daemon dead);
//     after a restart every run that was in flight is recorded run.aborted, every
//     result a caller received has its run.finished, and no admitted run has two
//     ends.
//   - full: the state directory's file system (a tmpfs of its own; root only) filled
//     up. Runs are answered 200 (recorded) or refused 503 or 507, never run
//     unrecorded and never a 500, and after the first refusal at once; with the space
//     back, runs are answered again without a restart.
//   - locked: another process holds the audit database's write lock (python3's
//     sqlite3, BEGIN IMMEDIATE). Runs are refused 503 (audit_unavailable, then
//     not_ready: the daemon is unready), after the first at once; with the lock gone,
//     they are answered again without a restart.
//   - flood: 1,000 connections that send half a request's headers and stall, then
//     1,000 concurrent run requests, all from one uid. The excess is refused 429 and
//     quickly; meanwhile a run of another uid (65534, through `sandcell run
//     --socket`; root only) and the flooding uid's own /readyz are answered.
//
// It prints one line per trial and a summary, and exits 1 when a check fails.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandcell/sandcell/bench/harness"
	"github.com/sandcell/sandcell/supervisor/store"
)

func main() {
	kills := flag.Int("kills", 20, "SIGKILLs of the daemon under load")
	bin := flag.String("sandcell", "bin/sandcell", "the sandcell binary")
	only := flag.String("only", "", "run only these trials (comma-separated: kill, full, locked, flood)")
	flag.Parse()
	// net/http logs each early 429 of the flood as an unsolicited response; the
	// flood trial counts them itself.
	log.SetOutput(io.Discard)
	b, _ := filepath.Abs(*bin)
	c := &chaos{bin: b}
	trials := []struct {
		name string
		run  func() error
	}{{"kill", func() error { return c.kill(*kills) }}, {"full", c.full}, {"locked", c.locked}, {"flood", c.flood}}
	for _, t := range trials {
		if *only != "" && !strings.Contains(","+*only+",", ","+t.name+",") {
			continue
		}
		fmt.Printf("== %s\n", t.name)
		if err := t.run(); err != nil {
			c.fail("%s: %v", t.name, err)
		}
	}
	fmt.Println()
	if c.failed > 0 {
		fmt.Printf("chaos: %d checks failed\n", c.failed)
		os.Exit(1)
	}
	fmt.Println("chaos: every check passed")
}

type chaos struct {
	bin    string
	failed int
}

func (c *chaos) fail(format string, args ...any) {
	c.failed++
	fmt.Printf("FAIL: "+format+"\n", args...)
}

// daemon starts a daemon in a new directory under the system's temporary one.
func (c *chaos) daemon(name, extra string, env ...string) (*harness.Daemon, func(), error) {
	dir, err := os.MkdirTemp("", "sandcell-chaos-"+name+"-")
	if err != nil {
		return nil, nil, err
	}
	d, err := harness.Start(c.bin, dir, harness.Config(os.Getuid(), extra), env...)
	cleanup := func() {
		if d != nil && !d.Exited() {
			d.Kill()
		}
		os.RemoveAll(dir)
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return d, cleanup, nil
}

// kill: see the package comment.
func (c *chaos) kill(n int) error {
	d, cleanup, err := c.daemon("kill", "[runs]\nqueue_length = 256\n")
	if err != nil {
		return err
	}
	defer cleanup()
	received := map[string]bool{} // runs whose result reached a caller
	inFlight := 0                 // admitted runs without an end, counted at each kill
	for trial := 1; trial <= n; trial++ {
		var mu sync.Mutex
		got := 0
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					code := fmt.Sprintf("import time\ntime.sleep(0.%d)\nprint(%d)", i%4, i)
					st, b, err := harness.Do(context.Background(), d.HTTP, "POST", "/v1/runs", "application/json",
						[]byte(fmt.Sprintf(`{"code":%q}`, code)))
					if err != nil {
						return // the daemon is gone
					}
					var id string
					if st == 200 && strings.Contains(string(b), fmt.Sprintf(`"stdout":"%d\n"`, i)) {
						id = runID(b)
					}
					mu.Lock()
					if id != "" {
						received[id] = true
						got++
					}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(1000+trial*97%1500) * time.Millisecond)
		workers := harness.WorkerChildren(d.Pid())
		others := map[int]bool{} // workers of another daemon on the machine, if any
		for _, p := range harness.Workers() {
			others[p] = !slices.Contains(workers, p)
		}
		killed := time.Now()
		d.Kill()
		close(stop)
		wg.Wait()
		// None of its workers two seconds later (they die with the daemon: the
		// parent-death signal).
		var left []int
		for time.Since(killed) < 2*time.Second {
			// Its workers, and any started between the list and the kill.
			left = harness.Alive(workers)
			for _, p := range harness.Workers() {
				if _, seen := others[p]; !seen {
					left = append(left, p)
				}
			}
			if len(left) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		a, err := harness.ReadAudit(d.StateDir)
		if err != nil {
			return err
		}
		open := 0
		for _, k := range a.Runs {
			if k[store.RunAdmitted] > 0 && k[store.RunFinished]+k[store.RunAborted] == 0 {
				open++
			}
		}
		inFlight += open
		fmt.Printf("  kill %2d: %3d results received, %d runs in flight, %d of its %d workers left after 2 s, chain of %d records %s\n",
			trial, got, open, len(left), len(workers), a.Records, verdict(a.Chain == nil))
		if len(left) > 0 {
			c.fail("kill %d: workers %v outlived the daemon by 2 s", trial, left)
		}
		if got == 0 || open == 0 {
			c.fail("kill %d: %d results before the kill, %d runs in flight at it: the trial tested nothing", trial, got, open)
		}
		if a.Chain != nil {
			c.fail("kill %d: the chain does not verify: %v", trial, a.Chain)
		}
		if err := d.Restart(); err != nil {
			return fmt.Errorf("restart after kill %d: %w", trial, err)
		}
	}
	if err := d.Stop(); err != nil {
		return err
	}
	a, err := harness.ReadAudit(d.StateDir)
	if err != nil {
		return err
	}
	for _, p := range a.Consistent() {
		c.fail("kill: audit: %s", p)
	}
	missing := 0
	for id := range received {
		if a.Runs[id][store.RunFinished] != 1 {
			missing++
		}
	}
	if missing > 0 {
		c.fail("kill: %d results received have no run.finished record", missing)
	}
	if len(received) == 0 || inFlight == 0 {
		c.fail("kill: no result received or no run in flight: nothing was tested")
	}
	if a.Kinds[store.RunAborted] != inFlight {
		c.fail("kill: %d runs were in flight at the kills, %d recorded run.aborted", inFlight, a.Kinds[store.RunAborted])
	}
	fmt.Printf("  %d kills survived: %d results received, each recorded; %d runs in flight, %d recorded aborted; %d records, chain %s\n",
		n, len(received), inFlight, a.Kinds[store.RunAborted], a.Records, verdict(a.Chain == nil))
	return nil
}

// runID is the "id" member of a run's answer.
func runID(b []byte) string {
	s := string(b)
	i := strings.Index(s, `"id":"`)
	if i < 0 {
		return ""
	}
	s = s[i+6:]
	return s[:max(0, strings.IndexByte(s, '"'))]
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "BROKEN"
}

// answers tallies the statuses and problem codes of runs sent during a fault.
type answers struct {
	ok      []string // ids of runs answered 200
	refused map[string]int
	took    []time.Duration // each answer's round trip, in order
}

// slowAfterFirst returns the slowest answer but the first (which may wait out
// SQLite's busy timeout, 5 s, to find the log cannot be written; the daemon then
// knows, and waits no more).
func (a *answers) slowAfterFirst() time.Duration {
	var m time.Duration
	for _, t := range a.took[min(1, len(a.took)):] {
		m = max(m, t)
	}
	return m.Round(time.Millisecond)
}

func (a *answers) String() string {
	var parts []string
	for k, v := range a.refused {
		parts = append(parts, fmt.Sprintf("%s×%d", k, v))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d answered, refused: %s", len(a.ok), strings.Join(parts, " "))
}

// send sends one run of print(1) and tallies its answer; it returns the status.
func (a *answers) send(d *harness.Daemon) (int, error) {
	t := time.Now()
	st, b, err := harness.Do(context.Background(), d.HTTP, "POST", "/v1/runs", "application/json", []byte(`{"code":"print(1)"}`))
	if err != nil {
		return 0, err
	}
	a.took = append(a.took, time.Since(t))
	if st == 200 {
		a.ok = append(a.ok, runID(b))
	} else {
		code := "?"
		if i := strings.Index(string(b), `"code":"`); i >= 0 {
			code = string(b[i+8:])
			code = code[:max(0, strings.IndexByte(code, '"'))]
		}
		a.refused[fmt.Sprintf("%d %s", st, code)]++
	}
	return st, nil
}

// recovered sends runs every 200 ms until one is answered 200 (at most timeout).
func recovered(d *harness.Daemon, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		st, _, err := harness.Do(context.Background(), d.HTTP, "POST", "/v1/runs", "application/json", []byte(`{"code":"print(2)"}`))
		if err == nil && st == 200 {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("no run answered within %s of the fault's end (last: %d %v)", timeout, st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkRecorded stops d and checks each run answered 200 has its run.finished, and
// the chain.
func (c *chaos) checkRecorded(trial string, d *harness.Daemon, ok []string) {
	if err := d.Stop(); err != nil {
		c.fail("%s: %v", trial, err)
		return
	}
	a, err := harness.ReadAudit(d.StateDir)
	if err != nil {
		c.fail("%s: %v", trial, err)
		return
	}
	for _, p := range a.Consistent() {
		c.fail("%s: audit: %s", trial, p)
	}
	for _, id := range ok {
		if a.Runs[id][store.RunFinished] != 1 {
			c.fail("%s: run %s was answered but has no run.finished record", trial, id)
		}
	}
	fmt.Printf("  audit after: %d records, chain %s; every run answered has its record\n", a.Records, verdict(a.Chain == nil))
}

// locked: see the package comment.
func (c *chaos) locked() error {
	python, err := exec.LookPath("python3")
	if err != nil {
		return fmt.Errorf("python3 (for its sqlite3, the other process) is required: %w", err)
	}
	d, cleanup, err := c.daemon("locked", "")
	if err != nil {
		return err
	}
	defer cleanup()
	holder := exec.Command(python, "-c", `import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
c.execute("COMMIT")`, filepath.Join(d.StateDir, "audit.db"))
	in, _ := holder.StdinPipe()
	out, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		return err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		holder.Process.Kill()
		return fmt.Errorf("the lock holder did not take the lock: %q %v", line, err)
	}
	a := &answers{refused: map[string]int{}}
	for i := 0; i < 20; i++ {
		if _, err := a.send(d); err != nil {
			holder.Process.Kill()
			return err
		}
	}
	ready, _, _ := harness.Get(context.Background(), d.HTTP, "/readyz")
	in.Close()
	holder.Wait()
	took, err := recovered(d, 20*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("  lock held: 20 runs: %s, the first in %s, the others in at most %s; /readyz %d; lock gone: a run answered after %s, no restart\n",
		a, a.took[0].Round(time.Millisecond), a.slowAfterFirst(), ready, took.Round(time.Millisecond))
	if a.slowAfterFirst() > time.Second {
		c.fail("locked: refusals took up to %s after the first", a.slowAfterFirst())
	}
	if len(a.ok) > 0 || a.refused["503 audit_unavailable"]+a.refused["503 not_ready"] != 20 {
		c.fail("locked: with the audit log locked, %s (every run should be 503)", a)
	}
	if ready != 503 {
		c.fail("locked: /readyz answered %d with the audit log locked", ready)
	}
	c.checkRecorded("locked", d, a.ok)
	return nil
}
