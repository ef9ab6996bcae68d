package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sandcell/sandcell/bench/harness"
)

// full: see the package comment.
func (c *chaos) full() error {
	if os.Geteuid() != 0 {
		fmt.Println("  skipped: a tmpfs of its own for the state directory needs root")
		return nil
	}
	dir, err := os.MkdirTemp("", "sandcell-chaos-full-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", state, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
		return fmt.Errorf("mount a tmpfs on the state directory: %w", err)
	}
	defer syscall.Unmount(state, syscall.MNT_DETACH)
	d, err := harness.Start(c.bin, dir, harness.Config(os.Getuid(), ""))
	if err != nil {
		return err
	}
	defer func() {
		if !d.Exited() {
			d.Kill()
		}
	}()
	before := &answers{refused: map[string]int{}}
	for i := 0; i < 5; i++ {
		before.send(d)
	}
	filler := filepath.Join(state, "filler")
	if err := fill(filler); err != nil {
		return err
	}
	a := &answers{refused: map[string]int{}}
	for i := 0; i < 60; i++ {
		if _, err := a.send(d); err != nil {
			return fmt.Errorf("with the file system full: %w", err)
		}
	}
	if err := os.Remove(filler); err != nil {
		return err
	}
	took, err := recovered(d, 30*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("  full: 60 runs: %s, the first in %s, the others in at most %s; space back: a run answered after %s, no restart\n",
		a, a.took[0].Round(time.Millisecond), a.slowAfterFirst(), took.Round(time.Millisecond))
	if a.slowAfterFirst() > time.Second {
		c.fail("full: refusals took up to %s after the first", a.slowAfterFirst())
	}
	for k := range a.refused {
		if k[:3] != "503" && k[:3] != "507" {
			c.fail("full: with the state file system full, a run was answered %s (503 or 507 expected)", k)
		}
	}
	if len(a.refused) == 0 {
		c.fail("full: no run was refused with the state file system full")
	}
	c.checkRecorded("full", d, append(before.ok, a.ok...))
	return nil
}

// fill writes path until the file system is full: not one more byte fits.
func fill(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for size := len(buf); size > 0; size /= 2 {
		for {
			_, err := f.Write(buf[:size])
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// flood: see the package comment.
func (c *chaos) flood() error {
	other := os.Geteuid() == 0
	uid := strconv.Itoa(os.Getuid())
	access := "[access]\nrunners = [\"" + uid + "\"]\napprovers = [\"" + uid + "\"]\nadmins = [\"" + uid + "\"]\n"
	if other {
		// The other caller, uid 65534, reaches the socket through its group.
		access = "[socket]\ngroup = \"nogroup\"\n\n[access]\nrunners = [\"" + uid + "\", \"65534\"]\napprovers = [\"" + uid + "\"]\nadmins = [\"" + uid + "\"]\n"
	} else {
		fmt.Println("  (not root: the run of another uid is skipped)")
	}
	dir, err := os.MkdirTemp("", "sandcell-chaos-flood-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o711)
	// The other uid runs a copy of the binary in the daemon's directory: the
	// checkout's may be beneath a directory it cannot enter (/root).
	client := filepath.Join(dir, "sandcell")
	if other {
		b, err := os.ReadFile(c.bin)
		if err == nil {
			err = os.WriteFile(client, b, 0o755)
		}
		if err != nil {
			return err
		}
	}
	d, err := harness.Start(c.bin, dir, access)
	if err != nil {
		return err
	}
	defer func() {
		if !d.Exited() {
			d.Kill()
		}
	}()

	// 1,000 connections with half a request's headers.
	conns := make([]net.Conn, 0, 1000)
	defer func() {
		for _, k := range conns {
			k.Close()
		}
	}()
	refusedIn := make([]time.Duration, 0, 1000)
	var mu sync.Mutex
	var wg sync.WaitGroup
	held, otherErr := 0, 0
	for i := 0; i < 1000; i++ {
		t := time.Now()
		k, err := net.Dial("unix", d.Sock)
		if err != nil {
			otherErr++
			continue
		}
		conns = append(conns, k)
		k.Write([]byte("POST /v1/runs HTTP/1.1\r\nHost: sandcell\r\nContent-Type: appl"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			k.SetReadDeadline(time.Now().Add(3 * time.Second))
			b := make([]byte, 64)
			n, err := k.Read(b)
			mu.Lock()
			defer mu.Unlock()
			var ne net.Error
			switch {
			case bytes.HasPrefix(b[:n], []byte("HTTP/1.1 429")):
				refusedIn = append(refusedIn, time.Since(t))
			case n == 0 && errors.As(err, &ne) && ne.Timeout():
				held++ // the daemon waits for the rest of the headers
			default:
				otherErr++ // closed without an answer, or another answer
			}
		}()
	}
	wg.Wait()
	probe, _, _ := harness.Get(context.Background(), d.HTTP, "/readyz")
	legit := c.otherRun(d, other, client)
	fmt.Printf("  1,000 slow-header connections: %d held, %d refused 429 (p99 %s), %d closed or failed otherwise; /readyz %d; %s\n",
		held, len(refusedIn), p99(refusedIn), otherErr, probe, legit)
	if held+len(refusedIn) != 1000 || held == 0 || len(refusedIn) == 0 || p99(refusedIn) > time.Second {
		c.fail("flood: slow headers: %d held, %d refused (p99 %s), %d otherwise", held, len(refusedIn), p99(refusedIn), otherErr)
	}
	if probe != 200 {
		c.fail("flood: /readyz answered %d during the slow-header flood", probe)
	}
	for _, k := range conns {
		k.Close()
	}
	conns = conns[:0]
	time.Sleep(500 * time.Millisecond)

	// 1,000 concurrent runs, each on a connection of its own: the request is written
	// whole, then the answer read (one the daemon wrote before reading the request, a
	// 429 for a connection past the limits, is read all the same).
	statuses := map[int]int{}
	var refused429 []time.Duration
	errs := 0
	legitDone := make(chan string)
	go func() { time.Sleep(200 * time.Millisecond); legitDone <- c.otherRun(d, other, client) }()
	body := `{"code":"import time\ntime.sleep(0.3)"}`
	req := fmt.Sprintf("POST /v1/runs HTTP/1.1\r\nHost: sandcell\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			st, err := rawRequest(d.Sock, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				return
			}
			statuses[st]++
			if st == 429 {
				refused429 = append(refused429, time.Since(t))
			}
		}()
	}
	wg.Wait()
	legit = <-legitDone
	fmt.Printf("  1,000 concurrent runs: %s, %d without an answer; the 429s in p99 %s; %s\n", statusList(statuses), errs, p99(refused429), legit)
	for st := range statuses {
		if st != 200 && st != 429 {
			c.fail("flood: a run was answered %d", st)
		}
	}
	if statuses[200] == 0 || statuses[429] == 0 || p99(refused429) > time.Second || errs > 0 {
		c.fail("flood: concurrent runs: %s, %d without an answer, 429s in p99 %s", statusList(statuses), errs, p99(refused429))
	}
	c.checkRecorded("flood", d, nil)
	return nil
}

// rawRequest sends req, a whole HTTP/1.1 request, on a new connection to sock and
// returns the status of the answer.
func rawRequest(sock, req string) (int, error) {
	k, err := net.Dial("unix", sock)
	if err != nil {
		return 0, err
	}
	defer k.Close()
	k.SetDeadline(time.Now().Add(60 * time.Second))
	k.Write([]byte(req)) // a write refused after an early answer still leaves it to read
	resp, err := http.ReadResponse(bufio.NewReader(k), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// otherRun runs print(42) as uid 65534 through `bin run --socket` and says how it
// went; a failure is a failed check.
func (c *chaos) otherRun(d *harness.Daemon, other bool, bin string) string {
	if !other {
		return "another uid's run skipped"
	}
	t := time.Now()
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
		bin, "run", "--socket", d.Sock, "-c", "print(42)").CombinedOutput()
	if err != nil || string(out) != "42\n" {
		c.fail("flood: uid 65534's run: %v: %s", err, out)
		return "uid 65534's run FAILED"
	}
	return fmt.Sprintf("uid 65534's run answered in %s", time.Since(t).Round(time.Millisecond))
}

func p99(ds []time.Duration) time.Duration { return harness.Quantile(ds, 0.99).Round(time.Millisecond) }

func statusList(m map[int]int) string {
	var keys []int
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d×%d", k, m[k])
	}
	return b.String()
}
