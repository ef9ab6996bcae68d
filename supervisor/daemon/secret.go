package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
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

// compileTimeout bounds the making of one generation (measured: 36.6 s of CPU for
// the three variants on a 2-core VM, 21.5 s of wall time).
const compileTimeout = 10 * time.Minute

// generation is one hash secret's modules.
type generation struct {
	dir     string
	made    time.Time
	seed    uint32                    // the snapshot's hash seed
	modules map[engine.Variant]string // .cwasm path, by engine variant
	cpu     time.Duration             // the CPU time its compile took (0: not made by this daemon)
	peakRSS int64                     // the compile's peak resident set, bytes
}

// checkGeneration returns the generation in dir if it is a directory (not a link)
// named by a time that has come, each engine variant's module passes
// bundle.CheckPrecompiled, and both were made with the seed of its hash-seed file,
// which is not avoid's (the seed of the modules it would replace: a copy of those
// is no secret of its own).
func checkGeneration(dir string, avoid uint32) (*generation, error) {
	made, err := time.Parse(generationLayout, filepath.Base(dir))
	if err != nil {
		return nil, fmt.Errorf("%s is not a generation's name", filepath.Base(dir))
	}
	if made.After(time.Now().Add(time.Minute)) {
		// A clock set back, or a planted name: kept, it would never be replaced.
		return nil, fmt.Errorf("%s was made in the future", filepath.Base(dir))
	}
	if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, bundle.HashSeedName))
	if err != nil {
		return nil, err
	}
	seed, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil || uint32(seed) == avoid {
		return nil, fmt.Errorf("%s: no hash seed of its own", dir)
	}
	g := &generation{dir: dir, made: made, seed: uint32(seed), modules: map[engine.Variant]string{}}
	for _, v := range engine.Variants() {
		e := engine.New(v.Options())
		key := bundle.Key(e.Fingerprint(), bundle.Pinned().Wasm.SHA256)
		p := filepath.Join(dir, bundle.PrecompiledName(key))
		if err := bundle.CheckPrecompiled(e, p, key); err != nil {
			return nil, err
		}
		if s, err := moduleSeed(p); err != nil || s != g.seed {
			return nil, fmt.Errorf("%s: made with another hash seed than its directory's", p)
		}
		g.modules[v] = p
	}
	return g, nil
}

// moduleSeed is the hash seed the sidecar of the .cwasm at path records.
func moduleSeed(path string) (uint32, error) {
	b, err := os.ReadFile(path + ".json")
	if err != nil {
		return 0, err
	}
	var sc bundle.Sidecar
	if err := json.Unmarshal(b, &sc); err != nil {
		return 0, err
	}
	return sc.HashSeed, nil
}

// newestGeneration returns the newest generation beneath root that passes
// checkGeneration, or nil.
func newestGeneration(root string, avoid uint32) *generation {
	entries, _ := os.ReadDir(root)
	for _, e := range slices.Backward(entries) { // by name: the layout sorts by time
		if g, err := checkGeneration(filepath.Join(root, e.Name()), avoid); err == nil {
			return g
		}
	}
	return nil
}

// pruneGenerations removes every entry beneath root but the directories keep: older
// generations, and what a compile that was killed or a person left.
func pruneGenerations(root string, keep ...string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if p := filepath.Join(root, e.Name()); !slices.Contains(keep, p) {
			os.RemoveAll(p)
		}
	}
}

// makeGeneration compiles a new generation beneath root in a child process
// (bundle.PrecompileCommand, niced where setpriority(2) is allowed, killed with the
// daemon or after compileTimeout): the compiler's memory, 430-500 MB at its peak, is
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
	avoid, _ := moduleSeed(d.report.Load().Modules[engine.Plain])
	g, err := checkGeneration(dir, avoid)
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
// room for twice the modules in force (about 220 MiB: as much again as a generation
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

// canary runs the light canary as a run does, with g's epochless module, and with
// g's plain module (the sessions'), each with lib.
func (d *Daemon) canary(g *generation, lib string) error {
	pol, err := d.cfg.Load().Policy()
	if err != nil {
		return err
	}
	o := selftest.Options{Policy: pol, Spawner: d.sp, WorkDir: d.canaryW}
	for _, interp := range []protocol.Request{
		(&selftest.Report{Modules: g.modules, LibDir: lib}).Interpreter(false),
		{ModulePath: g.modules[engine.Plain], LibDir: lib},
	} {
		if err := selftest.Light(d.bg, o, interp); err != nil {
			return fmt.Errorf("canary: %w", err)
		}
	}
	return nil
}

// adopt makes g's modules those of new runs, sessions and warm workers, after its
// canaries pass, and forgets the sealed copies of every other
// module (a run queued before still finds its module's file: see rotateHashSecret).
// It refuses once the daemon is stopping.
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
	next.Modules = maps.Clone(g.modules)
	d.report.Store(&next)
	d.secretMade.Store(&g.made)
	cfg := d.cfg.Load()
	pol, _ := cfg.Policy()
	d.warm(*cfg, pol)
	d.sp.ForgetExcept(slices.Collect(maps.Values(g.modules))...)
	return nil
}

// ownHashSecret puts the newest generation beneath state.dir in r, the start-up
// self-test's report before it is in force, if its canary passes (one older than
// period too: better than the bundle's, which every installation of the package
// shares), removes the others, and says how long until the next is due: at once
// when there is none or it is older than period.
func (d *Daemon) ownHashSecret(r *selftest.Report, period time.Duration) time.Duration {
	root := filepath.Join(d.cfg.Load().State.Dir, generationsDir)
	avoid, _ := moduleSeed(r.Modules[engine.Plain])
	g := newestGeneration(root, avoid)
	if g != nil {
		if err := d.canary(g, r.LibDir); err != nil {
			d.log.Warn("hash secret: this daemon's generation cannot be used; making another", "dir", g.dir, "error", err)
			g = nil
		}
	}
	if g == nil {
		pruneGenerations(root)
		return 0
	}
	pruneGenerations(root, g.dir)
	d.sp.ForgetExcept(slices.Collect(maps.Values(g.modules))...)
	r.Modules = maps.Clone(g.modules)
	d.secretMade.Store(&g.made)
	d.log.Info("hash secret: this daemon's own", "made", g.made, "dir", g.dir)
	return max(time.Until(g.made.Add(period)), 0)
}

// rotateHashSecret makes a generation after wait, then each period (see the comment
// at the top of this file), and adopts it. It keeps the generation it replaces until
// the next is adopted: a run queued before the rotation (a queue holds runs for
// minutes, the period is an hour at least) still finds its module. One that cannot
// be made or adopted is logged and tried again after a backoff, from a minute up to
// the period; runs keep the modules they had. It ends with bg.
func (d *Daemon) rotateHashSecret(period, wait time.Duration) {
	root := filepath.Join(d.cfg.Load().State.Dir, generationsDir)
	current := "" // the generation in force, "" while it is the bundle's
	if r := d.report.Load(); d.secretMade.Load() != nil {
		current = filepath.Dir(r.Modules[engine.Plain])
	}
	backoff := time.Minute
	for {
		select {
		case <-d.bg.Done():
			return
		case <-time.After(wait):
		}
		start := time.Now()
		pruneGenerations(root, current) // the one before it has had its period
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
		pruneGenerations(root, current, g.dir)
		current, wait, backoff = g.dir, period, time.Minute
	}
}
