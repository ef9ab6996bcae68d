// Package daemon is `sandcell serve` as a library. Open wires the parts from a
// configuration: the state directory's lock, the audit log (daemon.start, and
// run.aborted for the runs the last daemon left in flight), the run manager, the
// workspaces, the API server and its listeners, which answer the health probes (503)
// from then on. Run verifies the sandbox on this host (package selftest) and only
// then starts the warm pool and the periodic checks and tells systemd READY=1; it
// serves until its context ends or a listener fails, and then shuts down in order:
// stop accepting, let running runs finish for runs.shutdown_grace, kill the rest,
// record daemon.stop, release the state directory. Reload applies a new configuration
// while it serves.
//
// cmd/appliance keeps the flags, the signals and the reading of the configuration
// file; the API's tests build their daemon through this package, as `serve` does.
package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/healthz"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/audit"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/metrics"
	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/selftest"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/sqltool"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/toolbroker"
	"github.com/sandcell/sandcell/supervisor/workspace"
	"github.com/sandcell/sandcell/systemd"
)

// The health checks the daemon keeps (GET /readyz?verbose lists them).
const (
	checkSelftest = "selftest" // the start-up verification (readiness)
	checkCanary   = "canary"   // the periodic light canary (readiness)
	checkManager  = "manager"  // runs end by their deadlines (liveness)
	checkAudit    = "audit"    // the last audit record was written (readiness)
	checkPool     = "pool"     // the warm pool's roots its workers cannot hold, in its detail (readiness, never failing: runs start cold)
)

// Options say where the daemon's configuration comes from and how it names itself.
type Options struct {
	// Load reads the configuration: once in Open, again at each Reload. path is the
	// file it came from, or "" (recorded in daemon.start). An error in Open fails
	// Open; at Reload it keeps the configuration in force.
	Load func() (cfg config.Config, path string, err error)
	// Log receives the daemon's log; nil discards it.
	Log *slog.Logger
	// Version and Revision name the build (GET /v1/info, sandcell_build_info,
	// daemon.start).
	Version, Revision string
	// Workspace, if set, is a host directory served as the workspace
	// workspace.DirectoryID ("local"), owned by the daemon's own uid, under the
	// configuration's quota, never deleted (workspace.Store.Attach): `sandcell mcp
	// --workspace DIR` runs a daemon in process on it.
	Workspace string
	// Private are further directories no workspace may hold, checked before each
	// run as the state directory is (sandbox.Spawner.Private), and Workspace
	// against them at Open: the base of every in-process daemon's state
	// directory, so that one's workspace never holds another's state.
	Private []string
}

// Daemon is one `sandcell serve`: made by Open, served by Run.
type Daemon struct {
	o       Options
	cfg     atomic.Pointer[config.Config]
	log     *slog.Logger
	notify  systemd.Notifier
	health  *healthz.Registry
	sp      *sandbox.Spawner
	mgr     *runs.Manager
	sess    *sessions.Manager // nil when sessions.max is 0
	tools   *toolbroker.Broker
	audit   *audit.Writer
	db      *store.Store
	srv     *api.Server
	lock    *os.File                        // the state directory's lock, held until close
	report  atomic.Pointer[selftest.Report] // the passed start-up self-test
	canaryW string                          // work directory of canaries
	errc    chan error                      // a listener's end
	ready   chan struct{}                   // closed at READY=1

	poolNote atomic.Pointer[string] // the pool check's last detail

	mu       sync.Mutex // serialises Reload and the warm pool's (re)starts
	status   string     // the STATUS= line of readiness, under mu
	stopping bool       // shutdown has begun: no pool is started again (under mu)

	secretMade     atomic.Pointer[time.Time] // when the hash secret of new runs was made; nil: the bundle's (see secret.go)
	secretDue      time.Duration             // from the start-up self-test, until a new secret is due
	secretFailures atomic.Int64              // generations that could not be made or adopted

	bg     context.Context // ends the periodic checks and the pruning
	stopBg context.CancelFunc
	wg     sync.WaitGroup // the goroutines bg ends
}

// Open reads the configuration, takes the state directory's lock, opens the audit
// log and the workspaces, builds the run manager and the API server, and starts
// listening on the Unix socket (the one systemd passed, or socket.path) and on
// tcp.listen if set. Probes answer from then on; runs are refused (503 unready) until
// Run has verified the sandbox. The error says which part failed; nothing is left
// open after one.
func Open(o Options) (_ *Daemon, err error) {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &Daemon{o: o, log: o.Log, health: healthz.New(), errc: make(chan error, 2), ready: make(chan struct{})}
	d.bg, d.stopBg = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	cfg, path, err := o.Load()
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	d.cfg.Store(&cfg)
	setMemoryLimit(cfg)
	pol, err := cfg.Policy()
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if err := os.MkdirAll(cfg.State.Dir, 0o700); err != nil {
		return nil, err
	}
	if d.lock, err = lockStateDir(cfg.State.Dir); err != nil {
		return nil, err
	}
	d.health.Add(checkSelftest, healthz.Readiness)
	d.health.Add(checkCanary, healthz.Readiness)
	d.health.Add(checkManager, healthz.Liveness)

	d.sp = sandbox.NewSpawner(cfg.Bundle.Dir, cfg.Bundle.CacheDir)
	// No workspace holds the state directory (its own lie inside it), nor the
	// directories the caller names as private.
	d.sp.Private = append([]string{cfg.State.Dir}, o.Private...)
	if cfg.Native.Runsc != "" {
		// Without runsc, native runs whose policy requires gvisor are refused; the
		// self-test's native canary says so where that is every native run.
		g, err := sandbox.NewGVisor(cfg.Native.Runsc, filepath.Join(cfg.State.Dir, "gvisor"))
		if err != nil {
			d.log.Info("the gvisor layer is not offered", "error", err)
		}
		d.sp.GVisor = g
	}
	d.canaryW = filepath.Join(cfg.State.Dir, "canary")
	workspace.RemoveTree(d.canaryW) // left by a daemon that died during a canary
	if d.mgr, err = runs.New(d.sp, runs.Options{Concurrency: cfg.Concurrency(),
		QueueLength: cfg.Runs.QueueLength, MaxPerCaller: cfg.PerCaller(), Retention: cfg.Runs.ResultRetention.Duration,
		WorkDir: filepath.Join(cfg.State.Dir, "work"), MaxRetainedOutputBytes: cfg.Runs.MaxRetainedOutputBytes,
		WorkspaceQuota: workspace.Quota{Bytes: cfg.Workspaces.MaxBytes, Files: cfg.Workspaces.MaxFiles}}); err != nil {
		return nil, err
	}
	if cfg.Sessions.Max > 0 {
		if d.sess, err = sessions.New(d.sp, sessions.Options{Max: cfg.Sessions.Max,
			MaxPerCaller: cfg.Sessions.MaxPerCaller, IdleTimeout: cfg.Sessions.IdleTimeout.Duration,
			PauseAfter: cfg.Sessions.PauseAfter.Duration, MemoryBudget: cfg.Sessions.MemoryBudget,
			MaxPausedBytesPerCaller: cfg.Sessions.MaxPausedBytesPerCaller, Running: cfg.Concurrency(),
			WorkDir:     filepath.Join(cfg.State.Dir, "sessions"),
			Quota:       workspace.Quota{Bytes: cfg.Workspaces.MaxBytes, Files: cfg.Workspaces.MaxFiles},
			Interpreter: bundle.CheckpointKey(), Prepare: d.prepareSession, Log: d.log}); err != nil {
			return nil, err
		}
	}
	access, err := d.access(cfg)
	if err != nil {
		return nil, err
	}
	if d.db, err = store.Open(filepath.Join(cfg.State.Dir, "audit.db")); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	d.audit = &audit.Writer{Store: d.db, Log: d.log, Healthy: func(err error) { d.health.Set(checkAudit, err) }}
	d.mgr.AuditTo(d.audit)
	if err := d.audit.Record(context.Background(), store.DaemonStart, identity.Daemon(), "",
		map[string]any{"version": o.Version, "revision": o.Revision, "config": path, "tcp": cfg.TCP.Listen}); err != nil {
		return nil, fmt.Errorf("the audit log cannot be written: %w", err)
	}
	d.abortUnfinished()
	d.wg.Add(1)
	go func() { defer d.wg.Done(); d.audit.PruneEvery(d.bg, time.Hour, cfg.Audit.Retention.Duration) }()
	workspaces, err := workspace.Open(filepath.Join(cfg.State.Dir, "workspaces"),
		workspace.Quota{Bytes: cfg.Workspaces.MaxBytes, Files: cfg.Workspaces.MaxFiles})
	if err != nil {
		return nil, err
	}
	if o.Workspace != "" {
		// Never the daemon's own files: its state (the audit log, the socket,
		// results), the bundle and its cache are not a guest's to write.
		for _, d := range o.Private {
			if Within(d, o.Workspace) {
				return nil, fmt.Errorf("workspace %s holds %s, where daemons keep their state", o.Workspace, d)
			}
		}
		for key, d := range map[string]string{"state.dir": cfg.State.Dir, "bundle.dir": cfg.Bundle.Dir, "bundle.cache_dir": cfg.Bundle.CacheDir} {
			if overlaps(o.Workspace, d) {
				return nil, fmt.Errorf("workspace %s overlaps %s (%s)", o.Workspace, key, d)
			}
		}
		if _, err := workspaces.Attach(o.Workspace, os.Getuid()); err != nil {
			return nil, err
		}
	}
	approvals := approvals.New(cfg.Approvals.TTL.Duration, cfg.Approvals.Window.Duration)
	metrics := d.metrics()
	metrics.CountApprovals(approvals)
	if d.sess != nil {
		metrics.CountSessions(d.sess)
	}
	// The tools guests may call ([tools]): connected in the background from now on.
	d.tools = toolbroker.New(toolbroker.Options{Approvals: approvals, Audit: d.audit,
		SQL: func(ctx context.Context, caller identity.Caller, dir string, req sqltool.Request) (sqltool.Outcome, error) {
			return d.srv.RunSQLFile(ctx, caller, dir, req) // (d.srv is made below, before any run)
		}}, cfg.Tools)
	d.tools.Start(d.bg)
	metrics.CountTools(d.tools)
	d.srv = api.New(api.Options{
		Tools:           d.tools,
		Workspaces:      workspaces,
		Approvals:       approvals,
		ApprovalActions: cfg.Approvals.Required,
		Elicitation:     cfg.Approvals.Elicitation,
		Metrics:         promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}),
		Audit:           d.audit,
		RecordCode:      cfg.Audit.RecordCode,
		Service:         d.mgr,
		Access:          access,
		Policy:          pol,
		MaxBodyBytes:    cfg.Runs.MaxRequestBytes,
		ReadTimeout:     cfg.Runs.RequestTimeout.Duration,
		Module:          d.module,
		Native:          d.native,
		Disabled:        func() bool { return d.cfg.Load().Disabled },
		Health:          d.health,
		Info:            d.info,
		Version:         o.Version,
		Sessions:        d.sess,
	})
	if d.sess != nil {
		d.sess.Start(d.srv.SessionHooks()) // the sessions the daemon paused when it last stopped come back
	}
	// MCP sessions over HTTP hear within a second when the tools come or go.
	d.wg.Add(1)
	go func() { defer d.wg.Done(); d.srv.WatchTools(d.bg, time.Second) }()

	// Listen now, so that the probes answer (503) while Run verifies the sandbox.
	ul, err := d.listenUnix(cfg)
	if err != nil {
		return nil, err
	}
	var tl net.Listener
	if cfg.TCP.Listen != "" {
		if tl, err = listenTCP(cfg.TCP, cfg.Runs.MaxConnections, cfg.Runs.MaxConnectionsPerUID); err != nil {
			ul.Close()
			return nil, err
		}
	}
	go func() { d.errc <- d.srv.Serve(api.Listen(ul, cfg.Runs.MaxConnections, cfg.Runs.MaxConnectionsPerUID)) }()
	if tl != nil {
		go func() { d.errc <- d.srv.Serve(tl) }()
		d.log.Warn("listening on TCP: callers must present a bearer token", "address", tl.Addr().String(),
			"tokens", len(access.Tokens), "tls", cfg.TCP.TLSCertFile != "")
	}
	return d, nil
}

// abortUnfinished records run.aborted for each run in flight when the daemon last
// died (SIGKILL, power loss): its worker died too (parent-death signal). Each record
// names the run's caller, as its run.admitted did.
func (d *Daemon) abortUnfinished() {
	admitted, err := d.db.Unfinished(context.Background())
	if err != nil {
		return
	}
	for _, e := range admitted {
		var by struct {
			Token string `json:"token"`
		}
		json.Unmarshal(e.Detail, &by)
		d.audit.Record(context.Background(), store.RunAborted, identity.Caller{UID: e.UID, Token: by.Token}, e.RunID,
			map[string]any{"reason": "the daemon stopped while the run was in flight"})
	}
	if len(admitted) > 0 {
		d.log.Warn("runs in flight at the last stop marked aborted", "runs", len(admitted))
	}
}

// metrics are the manager's and the warm pool's.
func (d *Daemon) metrics() *metrics.Set {
	metrics := metrics.New(d.mgr, d.o.Version, d.o.Revision)
	pool := func(f func(sandbox.PoolStats) float64) func() float64 {
		return func() float64 { return f(d.sp.PoolStats()) }
	}
	metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_pool_idle_workers",
			Help: "Warm workers ready for a run."}, pool(func(p sandbox.PoolStats) float64 { return float64(p.Idle) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_pool_idle_resident_bytes",
			Help: "Resident memory of the idle warm workers (VmRSS when each became ready)."},
			pool(func(p sandbox.PoolStats) float64 { return float64(p.IdleRSSBytes) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_hash_secret_made_timestamp_seconds",
			Help: "When the string hash secret of new runs was made (Unix time); 0 while it is the bundle's."},
			func() float64 {
				if t := d.secretMade.Load(); t != nil {
					return float64(t.Unix())
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_hash_secret_rotation_failures_total",
			Help: "New hash secrets whose modules could not be made or adopted (runs kept the one they had)."},
			func() float64 { return float64(d.secretFailures.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_native_warm_idle_workers",
			Help: "Warm native workers waiting for the next native run in their workspace."},
			func() float64 { return float64(d.sp.NativeWarmStats().Idle) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_native_warm_hits_total",
			Help: "Native runs served by a warm native worker."},
			func() float64 { return float64(d.sp.NativeWarmStats().Hits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_native_warm_misses_total",
			Help: "Native runs that found no warm native worker for their workspace and policy (they started cold)."},
			func() float64 { return float64(d.sp.NativeWarmStats().Misses) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_pool_hits_total",
			Help: "Runs served by a warm worker."}, pool(func(p sandbox.PoolStats) float64 { return float64(p.Hits) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_pool_misses_total",
			Help: "Runs the pool could serve that found no warm worker ready (they started one)."},
			pool(func(p sandbox.PoolStats) float64 { return float64(p.Misses) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_pool_failures_total",
			Help: "Warm workers that could not be prepared."},
			pool(func(p sandbox.PoolStats) float64 { return float64(p.Failures) })),
	)
	return metrics
}

// Run verifies the sandbox, and on success starts the warm pool and the periodic
// checks and tells systemd READY=1 (Ready is closed). If the verification fails it
// returns the failure when health.exit_on_failure is set, else stays up unready with
// every run refused. It serves until ctx ends (then it returns nil) or a listener
// fails (its error), and shuts the daemon down before it returns, whatever ended it.
// Run is called once.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.close()
	err := d.verify(ctx)
	if ctx.Err() != nil {
		// Stopped during the self-test: its canary worker is killed.
		d.log.Info("stopping during the self-test")
		d.shutdown()
		return nil
	}
	if err != nil {
		d.health.Set(checkSelftest, err)
		if d.cfg.Load().Health.ExitOnFailure {
			d.shutdown()
			return fmt.Errorf("self-test: %w", err)
		}
		d.notify.Status("unready: self-test failed: " + err.Error())
		d.log.Error("self-test failed: staying up unready (health.exit_on_failure = false); every run is refused", "error", err)
	} else {
		d.health.Set(checkSelftest, nil)
		d.mu.Lock()
		cfg := d.cfg.Load()
		pol, _ := cfg.Policy()
		d.warm(*cfg, pol)
		layers := d.report.Load().Enforcement.ActiveLayers()
		d.status = fmt.Sprintf("sandcell %s, CPython %s: ready, %d layers active (%s)", d.o.Version,
			bundle.Pinned().Version, len(layers), strings.Join(layers, ","))
		d.notify.Ready(d.status)
		d.mu.Unlock()
		d.keepChecking()
		if period := cfg.Bundle.HashSecretRotation.Duration; period > 0 {
			d.wg.Add(1)
			go func() { defer d.wg.Done(); d.rotateHashSecret(period, d.secretDue) }()
		}
		close(d.ready)
		d.log.Info("ready", "layers", layers, "socket", cfg.Socket.Path)
	}
	select {
	case err := <-d.errc:
		d.shutdown()
		return err
	case <-ctx.Done():
		d.shutdown()
		return nil
	}
}

// Ready is closed once the sandbox is verified and runs are accepted.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// Server is the daemon's API server: it can serve another listener, and its access
// and policy change on Reload.
func (d *Daemon) Server() *api.Server { return d.srv }

// Store is the daemon's audit log (DIR/audit.db of state.dir).
func (d *Daemon) Store() *store.Store { return d.db }

// verify runs the start-up self-test, telling systemd to wait while a module
// compiles.
func (d *Daemon) verify(ctx context.Context) error {
	cfg := d.cfg.Load()
	pol, _ := cfg.Policy()
	d.notify.Status("verifying the sandbox")
	r := selftest.Run(ctx, selftest.Options{BundleDir: cfg.Bundle.Dir, CacheDir: cfg.Bundle.CacheDir,
		Policy: pol, Spawner: d.sp, WorkDir: d.canaryW, PoolRoots: PoolRoots(*cfg),
		Slow: func(what string) { d.notify.Extend(2*time.Minute, "verifying the sandbox: "+what) }})
	for _, c := range r.Checks {
		level := slog.LevelInfo
		if c.State != selftest.OK {
			level = slog.LevelWarn
		}
		d.log.Log(context.Background(), level, "self-test", "check", c.Name, "state", c.State, "detail", c.Detail)
	}
	if !r.OK() {
		return errors.New(r.Failure())
	}
	if period := cfg.Bundle.HashSecretRotation.Duration; period > 0 {
		d.secretDue = d.ownHashSecret(r, period)
	}
	d.report.Store(r)
	d.health.Set(checkCanary, nil)
	d.health.Set(checkManager, nil)
	return nil
}

// warm (re)starts the warm pool for pol's default runs; a pool that cannot be had
// (pool.size 0, namespaces disabled) leaves every run cold, which the log says.
// The caller holds mu.
func (d *Daemon) warm(cfg config.Config, pol policy.Policy) {
	opts := sandbox.PoolOptions{Size: cfg.Pool.Size, MemoryBudget: cfg.Pool.MemoryBudget,
		Roots:  PoolRoots(cfg),
		Failed: func(err error) { d.log.Warn("a warm worker could not be prepared", "error", err) }}
	defer d.checkPool()
	if interp, err := d.module(false); err == nil && opts.Size > 0 {
		opts.Template = interp
		opts.Template.Limits, opts.Template.Hardening = pol.Default, pol.Hardening(pol.Default)
		os.MkdirAll(d.canaryW, 0o700)
	} else {
		opts.Size = 0
	}
	// Only a named workspace is worth a warm native worker: a run without one has a
	// private directory, gone after it.
	if err := d.sp.WarmNative(sandbox.NativeWarmOptions{Size: cfg.Native.Warm, Preimport: cfg.Native.Preimport,
		Roots:  []string{filepath.Join(cfg.State.Dir, "workspaces")},
		Failed: func(err error) { d.log.Warn("a warm native worker could not be prepared", "error", err) }}); err != nil {
		d.log.Warn("no warm native workers", "error", err)
	}
	if err := d.sp.Warm(opts); err != nil {
		d.sp.Warm(sandbox.PoolOptions{})
		d.log.Warn("no warm pool: every run starts a worker of its own", "error", err)
		return
	}
	if opts.Size > 0 {
		d.log.Info("warm pool", "size", opts.Size, "memory_budget", opts.MemoryBudget)
	}
}

// PoolRoots are the warm pool's workspace roots under cfg (none without a pool):
// directories of the daemon's own in its state directory, which no other user can
// enter, so that only root can mount anything beneath them (see sandbox.CheckRoots).
func PoolRoots(cfg config.Config) []string {
	if cfg.Pool.Size <= 0 {
		return nil
	}
	return []string{filepath.Join(cfg.State.Dir, "workspaces"), filepath.Join(cfg.State.Dir, "work"),
		filepath.Join(cfg.State.Dir, "canary")}
}

// checkPool sets the pool check: always passing (a run the pool cannot serve starts
// a worker of its own), its detail naming the roots the pool's workers were last
// prepared without, and why (a mount beneath them), as the log does when they change.
func (d *Daemon) checkPool() {
	var named []string
	for _, p := range d.sp.PoolStats().UnusableRoots {
		named = append(named, p.Root+" "+p.Why)
	}
	detail := strings.Join(named, "; ")
	if old := d.poolNote.Swap(&detail); detail != "" && (old == nil || *old != detail) {
		d.log.Warn("warm pool: runs beneath a workspace root start cold", "roots", detail)
	}
	d.health.SetDetail(checkPool, nil, detail)
}

// module returns the verified interpreter for a job with or without fuel (see
// selftest.Report.Interpreter).
func (d *Daemon) module(fuel bool) (protocol.Request, error) {
	r := d.report.Load()
	if r == nil {
		return protocol.Request{}, errors.New("the sandbox has not been verified")
	}
	return r.Interpreter(fuel), nil
}

// native returns the verified native root for a run, or why the native backend is
// not offered (see selftest's native check).
func (d *Daemon) native() (string, error) {
	r := d.report.Load()
	switch {
	case r == nil:
		return "", errors.New("the sandbox has not been verified")
	case r.NativeRoot == "":
		return "", errors.New(r.NativeWhy)
	}
	return r.NativeRoot, nil
}

// prepareSession gives a session being resumed the module, library and hardening
// the daemon runs with now.
func (d *Daemon) prepareSession(req *protocol.Request) error {
	interp, err := d.module(req.Limits.Fuel > 0)
	if err != nil {
		return err
	}
	pol, err := d.cfg.Load().Policy()
	if err != nil {
		return err
	}
	// A session runs ModulePath only: no run's module is kept in its request.
	req.ModulePath, req.EpochlessModulePath, req.LibDir, req.Hardening = interp.ModulePath, "", interp.LibDir, pol.Hardening(req.Limits)
	return nil
}

// info is the body of GET /v1/info.
func (d *Daemon) info() any {
	cfg := d.cfg.Load()
	pol, _ := cfg.Policy()
	info := map[string]any{
		"version": d.o.Version, "revision": d.o.Revision, "interpreter": bundle.Pinned(),
		"limits":  map[string]any{"default": pol.Default, "max": pol.Max},
		"require": pol.Require,
		"pool":    d.sp.PoolStats(),
		"runs":    map[string]int{"max_concurrent": cfg.Concurrency(), "queue_length": cfg.Runs.QueueLength, "max_per_caller": cfg.PerCaller()},
	}
	native := map[string]any{"offered": false, "manifest_sha256": bundle.NativeManifestSHA256(),
		"runners": cfg.Native.Runners, "require": pol.NativeHardening(pol.Default).Require, "processes": cfg.Native.Processes,
		"warm": d.sp.NativeWarmStats(), "preimport": cfg.Native.Preimport, "gvisor": nil}
	if g := d.sp.GVisor; g != nil {
		native["gvisor"] = map[string]any{"runsc": g.Runsc, "version": g.Version, "platform": sandbox.GVisorPlatform}
	}
	if r := d.report.Load(); r != nil {
		info["enforcement"] = r.Enforcement
		native["offered"], native["why_not"], native["enforcement"] = r.NativeRoot != "", r.NativeWhy, r.NativeEnforcement
	}
	info["backends"] = map[string]any{protocol.BackendWasm: map[string]any{"offered": true}, protocol.BackendNative: native}
	secret := map[string]any{"rotation": cfg.Bundle.HashSecretRotation.String(), "made": nil}
	if t := d.secretMade.Load(); t != nil {
		secret["made"] = t.UTC().Format(time.RFC3339)
	}
	info["hash_secret"] = secret
	return info
}

// keepChecking starts the periodic checks: the light canary every
// health.canary_interval; every 5 s the run manager's progress (liveness, with or
// without systemd) and, after an append failed, whether the audit log can be written
// again; and, with the systemd watchdog on, a ping at half its interval
// only while every check holds. The canary runs on its own goroutine, so a slow
// canary never delays a ping. They end with bg.
func (d *Daemon) keepChecking() {
	every := func(interval time.Duration, f func()) {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-d.bg.Done():
					return
				case <-t.C:
					f()
				}
			}
		}()
	}
	every(d.cfg.Load().Health.CanaryInterval.Duration, func() {
		pol, _ := d.cfg.Load().Policy()
		r := d.report.Load()
		err := selftest.Light(d.bg, selftest.Options{Policy: pol, Spawner: d.sp, WorkDir: d.canaryW},
			r.Interpreter(false))
		if d.bg.Err() != nil {
			return // stopped, not failed
		}
		if err != nil {
			d.log.Error("canary failed: runs are refused until it passes", "error", err)
		}
		d.health.Set(checkCanary, err)
	})
	every(5*time.Second, func() {
		d.health.Set(checkManager, d.mgr.Wedged())
		d.checkPool()
		// A failed append makes the daemon unready, and an unready daemon is sent no
		// work that would append again: look whether the log can be written again
		// (another process's lock gone, say) rather than wait for a request.
		if d.audit.Down() {
			if err := d.db.Writable(d.bg); d.bg.Err() == nil {
				d.audit.Checked(err)
			}
		}
	})
	wd, watchdog := systemd.WatchdogInterval()
	if !watchdog {
		return
	}
	d.log.Info("watchdog on", "interval", wd)
	every(wd/2, func() {
		d.health.Set(checkManager, d.mgr.Wedged())
		if ok, _ := d.health.Ready(); ok {
			d.notify.Watchdog()
		} else {
			d.log.Error("watchdog not pinged", "why", d.health.Why())
		}
	})
}

// Reload reads the configuration again (Options.Load) and applies it: the kill
// switch, access and the run policy change at once, and the warm pool is refilled
// for the new policy; keys that need a restart are named in the log and in the
// daemon.reload record. On any error the configuration in force stays (the record
// says why). In-flight runs are not touched. Reload may be called while Run runs.
func (d *Daemon) Reload() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.notify.Reloading()
	ready := d.report.Load() != nil
	// READY=1 ends the reload for systemd; a daemon that never became ready does not
	// become ready by a reload: it only says so.
	done := func(msg string) {
		if ready {
			d.notify.Ready(d.status + "; " + msg)
		} else {
			d.notify.Status("unready: " + d.health.Why() + "; " + msg)
		}
	}
	cfg, _, err := d.o.Load()
	var pol policy.Policy
	if err == nil {
		pol, err = cfg.Policy()
	}
	var access api.Access
	if err == nil {
		access, err = d.access(cfg)
	}
	if err != nil {
		d.log.Error("reload refused: the configuration in force is unchanged", "error", err)
		d.audit.Record(context.Background(), store.DaemonReload, identity.Daemon(), "", map[string]any{"error": err.Error()})
		done("reload refused, the previous configuration stays: " + err.Error())
		return
	}
	old := d.cfg.Load()
	var restart []string
	for key, same := range map[string]bool{"bundle": old.Bundle == cfg.Bundle, "state": old.State == cfg.State,
		"socket": old.Socket == cfg.Socket, "tcp": old.TCP == cfg.TCP, "runs": old.Runs == cfg.Runs,
		"workspaces": old.Workspaces == cfg.Workspaces, "health": old.Health == cfg.Health, "pool": old.Pool == cfg.Pool,
		"audit": old.Audit == cfg.Audit, "approvals": reflect.DeepEqual(old.Approvals, cfg.Approvals),
		"sessions": old.Sessions == cfg.Sessions, "native.runsc": old.Native.Runsc == cfg.Native.Runsc} {
		if !same {
			restart = append(restart, key)
		}
	}
	d.srv.SetAccess(access)
	d.srv.SetPolicy(pol)
	if !reflect.DeepEqual(old.Tools, cfg.Tools) {
		d.tools.Reload(cfg.Tools) // the next runs' and cells' calls see it
		d.tools.Start(d.bg)
	}
	if ready {
		// Workers prepared for the old policy are replaced; the pool's size takes
		// effect at the next start, the native backend's warm workers now.
		w := *old
		w.Native.Warm, w.Native.Preimport = cfg.Native.Warm, cfg.Native.Preimport
		d.warm(w, pol)
	}
	d.cfg.Store(&cfg)
	limits := cfg
	limits.Runs = old.Runs // [runs] takes effect at the next start
	setMemoryLimit(limits)
	d.log.Info("configuration reloaded", "disabled", cfg.Disabled, "needs_restart", restart)
	done("configuration reloaded")
	d.audit.Record(context.Background(), store.DaemonReload, identity.Daemon(), "",
		map[string]any{"disabled": cfg.Disabled, "needs_restart": restart})
}

// setMemoryLimit sets Go's soft memory limit to cfg.MemoryLimit(), unless the
// environment's GOMEMLIMIT set one.
func setMemoryLimit(cfg config.Config) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}
}

// access resolves the configured principals and loads the tokens.
func (d *Daemon) access(cfg config.Config) (api.Access, error) {
	var access api.Access
	if cfg.TCP.Listen != "" {
		var err error
		// Never a TCP listener without tokens: refuse to start instead.
		if access.Tokens, err = api.LoadTokens(cfg.TCP.TokensFile); err != nil {
			return access, fmt.Errorf("tcp.listen is set: %w", err)
		}
	}
	for _, a := range []struct {
		name string
		list []string
		dst  *api.Principals
	}{{"runners", cfg.Access.Runners, &access.Runners}, {"approvers", cfg.Access.Approvers, &access.Approvers},
		{"admins", cfg.Access.Admins, &access.Admins}} {
		var err error
		if *a.dst, err = api.ResolvePrincipals(a.list); err != nil {
			// An entry that names nobody on this host grants nothing: fail closed.
			d.log.Warn("access entries that name nobody on this host grant nothing", "list", "access."+a.name, "error", err)
		}
	}
	var err error
	if access.Native, err = api.ResolveNative(cfg.Native.Runners); err != nil {
		d.log.Warn("access entries that name nobody on this host grant nothing", "list", "native.runners", "error", err)
	}
	return access, nil
}

// listenUnix returns the socket passed by systemd, or creates socket.path.
func (d *Daemon) listenUnix(cfg config.Config) (*net.UnixListener, error) {
	if l, err := systemd.UnixListener(); err != nil || l != nil {
		if l != nil {
			d.log.Info("listening on the socket passed by systemd", "socket", l.Addr().String())
		}
		return l, err
	}
	gid := -1
	if cfg.Socket.Group != "" {
		if g, err := user.LookupGroup(cfg.Socket.Group); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		} else {
			d.log.Warn("socket group does not exist; the socket keeps the daemon's group", "group", cfg.Socket.Group)
		}
	}
	mode, _ := strconv.ParseUint(cfg.Socket.Mode, 8, 32)
	if err := os.MkdirAll(filepath.Dir(cfg.Socket.Path), 0o755); err != nil {
		return nil, err
	}
	l, err := api.ListenUnix(cfg.Socket.Path, os.FileMode(mode), gid)
	if err != nil {
		return nil, err
	}
	d.log.Info("listening", "socket", cfg.Socket.Path, "mode", cfg.Socket.Mode)
	return l, nil
}

// Within reports whether path is dir or lies in it, once their symbolic links are
// resolved (a path not there yet is taken as given).
func Within(path, dir string) bool {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		path = r
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// overlaps reports whether directories a and b are one, or one holds the other.
func overlaps(a, b string) bool { return Within(a, b) || Within(b, a) }

// lockStateDir takes an exclusive lock on DIR/lock (flock(2)), held while the file
// returned is open: two daemons sharing a state directory would break each other's audit
// chain and workspaces (a second container on the same volume, say). The kernel
// drops the lock when the process ends, however it ends.
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("state directory %s is in use by another sandcell serve (its lock file is held)", dir)
		}
		return nil, fmt.Errorf("state directory %s: lock: %w", dir, err)
	}
	return f, nil
}

// shutdown stops accepting, lets runs finish for runs.shutdown_grace, kills the
// rest, empties the warm pool and records daemon.stop.
func (d *Daemon) shutdown() {
	d.notify.Stopping("stopping: letting running runs finish")
	grace := d.cfg.Load().Runs.ShutdownGrace.Duration
	ctx, cancel := context.WithTimeout(context.Background(), grace+5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { d.mgr.Shutdown(grace); close(done) }()
	if d.sess != nil {
		d.srv.EndMCPInterpreters()
		d.sess.Shutdown() // each live session is paused to disk, and comes back when the daemon does
	}
	if err := d.srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		d.log.Warn("shutdown", "error", err)
	}
	<-done
	d.mu.Lock()
	d.stopping = true
	d.sp.Warm(sandbox.PoolOptions{}) // idle workers
	d.sp.WarmNative(sandbox.NativeWarmOptions{})
	d.mu.Unlock()
	d.tools.Close() // the servers the daemon started end with it
	d.audit.Record(context.Background(), store.DaemonStop, identity.Daemon(), "", map[string]any{})
	d.log.Info("stopped")
}

// close ends the background goroutines and releases what Open took (after shutdown,
// or after a failed Open).
func (d *Daemon) close() {
	d.stopBg()
	d.wg.Wait()
	if d.tools != nil {
		d.tools.Close()
	}
	if d.db != nil {
		d.db.Close()
	}
	if d.lock != nil {
		d.lock.Close()
	}
}

// listenTCP opens the TCP listener: at most max connections at once and perIP from
// one client address, TLS (1.2 or later) when a certificate is configured.
func listenTCP(c config.TCP, max, perIP int) (net.Listener, error) {
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, err
	}
	l = api.ListenTCP(l, max, perIP)
	if c.TLSCertFile == "" {
		return l, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("tcp.tls_cert_file: %w", err)
	}
	return tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), nil
}
