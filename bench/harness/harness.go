// Package harness starts, watches and checks a real `sandcell serve` for the load
// programs of bench/ (the benchmark, the soak run and the chaos run): the daemon's
// process and its workers as /proc shows them, and its audit log as the daemon left
// it on disk.
package harness

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// Daemon is a `sandcell serve` the harness started, with its socket and state
// directory under Dir.
type Daemon struct {
	// Bin is the sandcell binary, Dir the daemon's directory: the socket s.sock, the
	// state directory state/ and, when Start was given one, the configuration
	// sandcell.toml.
	Bin, Dir string
	// Sock is the daemon's socket and StateDir its state directory.
	Sock, StateDir string
	// Env is added to the daemon's environment (SANDCELL_* overrides).
	Env []string
	// HTTP is a client of the socket; Client the API's client over it.
	HTTP   *http.Client
	Client *client.Client
	// Stderr receives the daemon's log; nil discards it.
	Stderr *os.File

	config string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts bin as a daemon in dir (created if need be) with config as its
// configuration file (TOML; empty: the built-in defaults) and env added to its
// environment, and waits until /readyz answers 200 (at most 60 s).
func Start(bin, dir, config string, env ...string) (*Daemon, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d := &Daemon{Bin: bin, Dir: dir, Sock: filepath.Join(dir, "s.sock"), StateDir: filepath.Join(dir, "state"), Env: env}
	if config != "" {
		d.config = filepath.Join(dir, "sandcell.toml")
		if err := os.WriteFile(d.config, []byte(config), 0o644); err != nil {
			return nil, err
		}
	}
	d.HTTP = client.HTTP(d.Sock)
	d.Client = client.NewHTTP(d.HTTP)
	return d, d.Restart()
}

// Restart starts the daemon again (after Kill or Stop) over the same socket and state
// directory, and waits until it is ready.
func (d *Daemon) Restart() error {
	args := []string{"serve", "--socket", d.Sock, "--state-dir", d.StateDir}
	if d.config != "" {
		args = append(args, "--config", d.config)
	}
	d.cmd = exec.Command(d.Bin, args...)
	d.cmd.Env = append(os.Environ(), d.Env...)
	d.cmd.Stderr = d.Stderr
	// A harness that dies (a signal, a panic) takes its daemon with it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { cmd.Wait(); close(exited) }(d.cmd, d.exited)
	if err := WaitReady(d.HTTP, 60*time.Second); err != nil {
		d.Kill()
		return err
	}
	return nil
}

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Stop sends SIGTERM and waits for the daemon to exit (at most 60 s, then SIGKILL);
// it returns the exit status's error, if any.
func (d *Daemon) Stop() error {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		d.Kill()
		return errors.New("the daemon did not stop within 60 s of SIGTERM")
	}
	if st := d.cmd.ProcessState; st != nil && !st.Success() {
		return fmt.Errorf("the daemon exited: %s", st)
	}
	return nil
}

// Kill sends SIGKILL and waits for the daemon's process to be gone.
func (d *Daemon) Kill() {
	d.cmd.Process.Kill()
	<-d.exited
}

// Exited reports whether the daemon's process has ended.
func (d *Daemon) Exited() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// WaitReady polls GET /readyz over h until it answers 200 or timeout passes.
func WaitReady(h *http.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := h.Get("http://sandcell/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon was not ready within %s (last: %v)", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Workers returns the process ids of every worker on the machine: a process whose
// argv[1] is protocol.WorkerCommand, whatever its parent (after a SIGKILL of the
// daemon, a surviving worker would have another).
func Workers() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && isWorker(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Alive returns those of pids that are still workers (a pid reused since by another
// process is not one).
func Alive(pids []int) []int {
	var out []int
	for _, p := range pids {
		if isWorker(p) {
			out = append(out, p)
		}
	}
	return out
}

// Usage is a process's resident set and open descriptors.
type Usage struct {
	// RSSKiB is VmRSS in KiB (proc(5), /proc/PID/status).
	RSSKiB int64
	// FDs is the number of entries of /proc/PID/fd.
	FDs int
}

// ProcUsage returns pid's Usage.
func ProcUsage(pid int) (Usage, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			u.RSSKiB, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	u.FDs = len(fds)
	return u, err
}

// Children returns the process ids of pid's children (proc(5),
// /proc/PID/task/TID/children).
func Children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, c := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(c); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Config is a configuration file for a daemon run by uid: runner, approver and admin,
// with extra TOML appended (tables after the [access] one).
func Config(uid int, extra string) string {
	u := strconv.Itoa(uid)
	return "[access]\nrunners = [\"" + u + "\"]\napprovers = [\"" + u + "\"]\nadmins = [\"" + u + "\"]\n\n" + extra
}

// Get answers GET path over h: its status and body (at most 64 MiB).
func Get(ctx context.Context, h *http.Client, path string) (int, []byte, error) {
	return Do(ctx, h, http.MethodGet, path, "", nil)
}

// Do sends one request over h and returns the status and body (at most 64 MiB) of its
// answer; contentType is set when body is not nil.
func Do(ctx context.Context, h *http.Client, method, path, contentType string, body []byte) (int, []byte, error) {
	var r *bytes.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	var req *http.Request
	var err error
	if r != nil {
		req, err = http.NewRequestWithContext(ctx, method, "http://sandcell"+path, r)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, "http://sandcell"+path, nil)
	}
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := h.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(http.MaxBytesReader(nil, resp.Body, 64<<20))
	return resp.StatusCode, buf.Bytes(), err
}

// WorkerChildren returns the workers among pid's children.
func WorkerChildren(pid int) []int {
	var out []int
	for _, c := range Children(pid) {
		if isWorker(c) {
			out = append(out, c)
		}
	}
	return out
}

func isWorker(pid int) bool {
	argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	f := bytes.Split(argv, []byte{0})
	return len(f) > 1 && string(f[1]) == protocol.WorkerCommand
}

// Pool returns the daemon's warm pool as GET /v1/info shows it.
func (d *Daemon) Pool() (sandbox.PoolStats, error) {
	var info struct{ Pool sandbox.PoolStats }
	st, b, err := Get(context.Background(), d.HTTP, "/v1/info")
	if err == nil && st != http.StatusOK {
		err = fmt.Errorf("GET /v1/info: %d", st)
	}
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	return info.Pool, err
}

// NativeWarm returns the daemon's warm native workers as GET /v1/info shows them
// (backends.native.warm).
func (d *Daemon) NativeWarm() (sandbox.NativeWarmStats, error) {
	var info struct {
		Backends map[string]struct{ Warm sandbox.NativeWarmStats }
	}
	st, b, err := Get(context.Background(), d.HTTP, "/v1/info")
	if err == nil && st != http.StatusOK {
		err = fmt.Errorf("GET /v1/info: %d", st)
	}
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	return info.Backends["native"].Warm, err
}

// WaitNativeWarm waits until the daemon holds a warm native worker (GET /v1/info,
// backends.native.warm.idle), at most timeout.
func (d *Daemon) WaitNativeWarm(timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		w, err := d.NativeWarm()
		if err == nil && w.Idle > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no warm native worker within %s: %+v %v", timeout, w, err)
		}
	}
}

// WaitPoolFull waits until every worker of the pool is idle (at once for a pool of
// size 0), at most timeout; GET /v1/info failing counts as not full.
func (d *Daemon) WaitPoolFull(timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(2 * time.Millisecond) {
		st, err := d.Pool()
		if err == nil && st.Idle == st.Size {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pool was not full within %s: %+v %v", timeout, st, err)
		}
	}
}

// Quantile returns the q-quantile of xs (0 < q ≤ 1) by nearest rank: the smallest
// value with at least q of them at or below it (of 100 values, the 99th for 0.99; of
// 20, the largest). xs is not changed; empty gives the zero value.
func Quantile[T cmp.Ordered](xs []T, q float64) T {
	var zero T
	if len(xs) == 0 {
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
