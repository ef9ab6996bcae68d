package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/supervisor/selftest"
)

// CPython keys its str and bytes hashes (and so the layout of dicts and sets) with a
// secret fixed when the interpreter starts, and Sandcell's interpreter starts once,
// in the snapshot a .cwasm holds: every run from one module shares the secret, and a
// package's modules carry the one drawn when the package was built. So the daemon
// makes modules of its own, a generation per secret, beneath state.dir: in the
// background after it is ready when it has none younger than
// bundle.hash_secret_rotation, and again each period. A generation is adopted only
// after its modules pass the checks of the start-up self-test's (bundle.CheckPrecompiled)
// and a canary; until then, and whenever one cannot be made, runs keep the modules
// they had. New runs and sessions start with the newest secret; a session keeps the
// one it started with (its checkpoint is its whole memory, the secret included).
// docs/security.md says what this does and does not give.

// generationsDir is the directory beneath state.dir that holds the generations: each
// a directory named by when it was made (generationLayout), holding the hash-seed
// file and a .cwasm of each engine variant with its sidecar.
const generationsDir = "interpreter"

// generationLayout names a generation's directory by the time it was made, in UTC.
const generationLayout = "20060102T150405Z"

// compileTimeout bounds the making of one generation (measured: 15.6 s of CPU per
// variant on a 2-core VM).
const compileTimeout = 10 * time.Minute

// generation is one hash secret's modules.
type generation struct {
	dir     string
	made    time.Time
	modules map[bool]string // .cwasm path, by whether fuel metering is on
	cpu     time.Duration   // the CPU time its compile took (0: not made by this daemon)
	peakRSS int64           // the compile's peak resident set, bytes
}

// checkGeneration returns the generation in dir if each engine variant's module
// passes bundle.CheckPrecompiled.
func checkGeneration(dir string) (*generation, error) {
	made, err := time.Parse(generationLayout, filepath.Base(dir))
	if err != nil {
		return nil, fmt.Errorf("%s is not a generation's name", filepath.Base(dir))
	}
	g := &generation{dir: dir, made: made, modules: map[bool]string{}}
	for _, fuel := range []bool{false, true} {
		e := engine.New(engine.Options{Fuel: fuel})
		key := bundle.Key(e.Fingerprint(), bundle.Pinned().Wasm.SHA256)
		p := filepath.Join(dir, bundle.PrecompiledName(key))
		if err := bundle.CheckPrecompiled(e, p, key); err != nil {
			return nil, err
		}
		g.modules[fuel] = p
	}
	return g, nil
}

// newestGeneration returns the newest generation beneath root that passes
// checkGeneration (nil if none does), and removes every other entry there: older
// generations, and what a compile that was killed left.
func newestGeneration(root string) *generation {
	entries, _ := os.ReadDir(root)
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names) // the layout sorts by time
	var newest *generation
	for _, name := range slices.Backward(names) {
		if newest == nil {
			if g, err := checkGeneration(filepath.Join(root, name)); err == nil {
				newest = g
				continue
			}
		}
		os.RemoveAll(filepath.Join(root, name))
	}
	return newest
}

// makeGeneration compiles a new generation beneath root in a child process
// (bundle.PrecompileCommand, niced where setpriority(2) is allowed, killed with the
// daemon or after compileTimeout): the compiler's memory, 433 MB at its peak, is
// never the daemon's.
func (d *Daemon) makeGeneration(ctx context.Context, root string) (*generation, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	if err := d.roomForGeneration(root); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, ".new-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // bundle.CheckPrecompiled's rule for a module's directory
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, compileTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", bundle.PrecompileCommand, d.cfg.Load().Bundle.Dir, tmp)
	cmd.Args[0] = "sandcell"
	cmd.Env = []string{}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, 10) // EPERM under the unit's filter: then at the daemon's priority
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String()))
	}
	dir := filepath.Join(root, time.Now().UTC().Format(generationLayout))
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	g, err := checkGeneration(dir)
	if err != nil {
		return nil, err
	}
	g.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		g.peakRSS = ru.Maxrss << 10 // getrusage(2): kilobytes
	}
	return g, nil
}

// roomForGeneration refuses to make a generation unless the file system of root has
// room for twice the modules in force (150 MiB: as much again as a generation
// needs), so that a compile never fills the disk that runs, sessions and the audit
// log write to.
func (d *Daemon) roomForGeneration(root string) error {
	var need int64
	for _, p := range d.report.Load().Modules {
		if st, err := os.Stat(p); err == nil {
			need += 2 * st.Size()
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", root, err)
	}
	if have := int64(fs.Bavail) * fs.Bsize; have < need {
		return fmt.Errorf("%s has %d MiB free, and a new secret's modules need %d MiB there with room to spare", root, have>>20, need>>20)
	}
	return nil
}

// canary runs the light canary with g's plain module and lib.
func (d *Daemon) canary(g *generation, lib string) error {
	pol, err := d.cfg.Load().Policy()
	if err != nil {
		return err
	}
	if err := selftest.Light(d.bg, selftest.Options{Policy: pol, Spawner: d.sp, WorkDir: d.canaryW}, g.modules[false], lib); err != nil {
		return fmt.Errorf("canary: %w", err)
	}
	return nil
}

// adopt makes g's modules those of new runs, sessions and warm workers, after a
// canary passes with g's plain module, and forgets the modules it replaces. It
// refuses once the daemon is stopping.
func (d *Daemon) adopt(g *generation) error {
	if err := d.canary(g, d.report.Load().LibDir); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return errors.New("the daemon is stopping")
	}
	next := *d.report.Load()
	old := next.Modules
	next.Modules = map[bool]string{false: g.modules[false], true: g.modules[true]}
	d.report.Store(&next)
	d.secretMade.Store(&g.made)
	cfg := d.cfg.Load()
	pol, _ := cfg.Policy()
	d.warm(*cfg, pol)
	for _, p := range old {
		d.sp.Forget(p)
	}
	return nil
}

// ownHashSecret puts the newest generation beneath state.dir in r, the start-up
// self-test's report before it is in force, if it is younger than period and its
// canary passes, and says how long until the next is due: at once when there is
// none.
func (d *Daemon) ownHashSecret(r *selftest.Report, period time.Duration) time.Duration {
	g := newestGeneration(filepath.Join(d.cfg.Load().State.Dir, generationsDir))
	if g == nil || time.Since(g.made) >= period {
		return 0
	}
	if err := d.canary(g, r.LibDir); err != nil {
		d.log.Warn("hash secret: this daemon's generation cannot be used; making another", "dir", g.dir, "error", err)
		return 0
	}
	for _, p := range r.Modules {
		d.sp.Forget(p)
	}
	r.Modules = map[bool]string{false: g.modules[false], true: g.modules[true]}
	d.secretMade.Store(&g.made)
	d.log.Info("hash secret: this daemon's own", "made", g.made, "dir", g.dir)
	return time.Until(g.made.Add(period))
}

// rotateHashSecret makes a generation after wait, then each period (see the comment
// at the top of this file), and adopts it. One that cannot be made or adopted is
// logged and tried again after a backoff, from a minute up to the period; runs keep
// the modules they had. It ends with bg.
func (d *Daemon) rotateHashSecret(period, wait time.Duration) {
	root := filepath.Join(d.cfg.Load().State.Dir, generationsDir)
	backoff := time.Minute
	for {
		select {
		case <-d.bg.Done():
			return
		case <-time.After(wait):
		}
		start := time.Now()
		g, err := d.makeGeneration(d.bg, root)
		if err == nil {
			err = d.adopt(g)
		}
		if d.bg.Err() != nil {
			return
		}
		if err != nil {
			d.log.Error("hash secret: a new one could not be made; runs keep the one they have", "error", err, "retry_in", backoff)
			d.secretFailures.Add(1)
			wait, backoff = backoff, min(2*backoff, period)
			continue
		}
		d.log.Info("hash secret: rotated", "made", g.made, "dir", g.dir, "took", time.Since(start).Round(time.Millisecond).String(),
			"cpu", g.cpu.Round(time.Millisecond).String(), "peak_rss_bytes", g.peakRSS)
		newestGeneration(root) // the older ones go
		wait, backoff = period, time.Minute
	}
}
