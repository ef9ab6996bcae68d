package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/healthz"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/selftest"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/workspace"
	"github.com/sandcell/sandcell/systemd"
)

// The health checks the daemon keeps (GET /readyz?verbose lists them).
const (
	checkSelftest = "selftest" // the start-up verification (readiness)
	checkCanary   = "canary"   // the periodic light canary (readiness)
	checkManager  = "manager"  // runs end by their deadlines (liveness)
	checkAudit    = "audit"    // the last audit record was written (readiness)
)

type serveFlags struct {
	config, socket, stateDir, bundleDir, cacheDir string
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the HTTP API on a Unix socket",
		Long: `Run the daemon: the HTTP API (see docs/api.md) on a Unix socket (or the one passed by
systemd socket activation). It loads the configuration (--config, else
` + defaultConfigPath + ` when it exists, else the built-in defaults, with the
SANDCELL_* environment over it), then verifies the sandbox on this host (the same
checks as sandcell selftest) and only then accepts runs: GET /readyz answers 200 and
systemd is told READY=1. If the verification fails, STATUS= says why and the daemon
exits non-zero (health.exit_on_failure), or stays up unready. SIGHUP reloads the
configuration (the kill switch, access, limits); SIGTERM or SIGINT: stop accepting, let
running runs finish for up to 30 s, kill the rest, exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return serve(&f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "configuration file (default "+defaultConfigPath+" when it exists)")
	fl.StringVar(&f.socket, "socket", "", "Unix socket to listen on (overrides socket.path)")
	fl.StringVar(&f.stateDir, "state-dir", "", "state directory (overrides state.dir)")
	fl.StringVar(&f.bundleDir, "bundle-dir", "", "bundle directory (overrides bundle.dir)")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "where a rebuilt .cwasm is kept (overrides bundle.cache_dir)")
	return cmd
}

// newLogger logs to stderr: text without timestamps under journald (which adds its
// own; $JOURNAL_STREAM is set), JSON otherwise.
func newLogger() *slog.Logger {
	if os.Getenv("JOURNAL_STREAM") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{
			ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
				if len(groups) == 0 && a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}}))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, nil))
}

// loadConfig reads the configuration as `serve` and `selftest` do: the file, the
// environment, then the flags.
func loadConfig(f *serveFlags) (config.Config, string, error) {
	path := f.config
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		return cfg, path, err
	}
	if path == "" {
		// No configuration file: a development tree, found as `sandcell run` finds it.
		cfg.Bundle.Dir, cfg.Bundle.CacheDir = defaultBundleDir(), defaultCacheDir()
	}
	for _, o := range []struct{ flag, dst *string }{{&f.socket, &cfg.Socket.Path}, {&f.stateDir, &cfg.State.Dir},
		{&f.bundleDir, &cfg.Bundle.Dir}, {&f.cacheDir, &cfg.Bundle.CacheDir}} {
		if *o.flag != "" {
			abs, err := filepath.Abs(*o.flag)
			if err != nil {
				return cfg, path, err
			}
			*o.dst = abs
		}
	}
	return cfg, path, cfg.Validate()
}

// spawner is the worker spawner for cfg: the bundle, its cache and this binary's
// directory are never a workspace.
func spawner(cfg config.Config) *sandbox.Spawner {
	return sandbox.NewSpawner(cfg.Bundle.Dir, cfg.Bundle.CacheDir)
}

// daemon is `sandcell serve` wired together.
type daemon struct {
	flags   *serveFlags
	path    string // the configuration file, or ""
	cfg     atomic.Pointer[config.Config]
	log     *slog.Logger
	notify  systemd.Notifier
	health  *healthz.Registry
	sp      *sandbox.Spawner
	mgr     *supervisor.Manager
	audit   *supervisor.Audit
	db      *store.Store
	srv     *api.Server
	report  atomic.Pointer[selftest.Report] // the passed start-up self-test
	canaryW string                          // work directory of canaries
	status  string                          // the STATUS= line of readiness
}

func serve(f *serveFlags) error {
	// The audit log, results and workspaces are the daemon's alone, whatever umask
	// it was started with (the unit sets UMask=0077 too; a container runtime 0022).
	syscall.Umask(0o077)
	d := &daemon{flags: f, log: newLogger(), health: healthz.New()}
	err := d.run()
	if err != nil {
		// systemctl status shows why the start failed, not only that it did.
		d.notify.Status("failed: " + err.Error())
		d.log.Error("sandcell serve failed", "error", err)
	}
	return err
}

func (d *daemon) run() error {
	cfg, path, err := loadConfig(d.flags)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	d.path = path
	d.cfg.Store(&cfg)
	pol, err := cfg.Policy()
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := os.MkdirAll(cfg.State.Dir, 0o700); err != nil {
		return err
	}
	lock, err := lockStateDir(cfg.State.Dir)
	if err != nil {
		return err
	}
	// Held until the daemon ends (a closed file would drop the lock).
	defer lock.Close()
	d.health.Add(checkSelftest, healthz.Readiness)
	d.health.Add(checkCanary, healthz.Readiness)
	d.health.Add(checkManager, healthz.Liveness)

	d.sp = spawner(cfg)
	d.canaryW = filepath.Join(cfg.State.Dir, "canary")
	workspace.RemoveTree(d.canaryW) // left by a daemon that died during a canary
	if d.mgr, err = supervisor.NewManager(d.sp, supervisor.Options{Concurrency: cfg.Concurrency(),
		QueueLength: cfg.Runs.QueueLength, MaxPerCaller: cfg.PerCaller(), Retention: cfg.Runs.ResultRetention.Duration,
		WorkDir: filepath.Join(cfg.State.Dir, "work"), MaxRetainedOutputBytes: cfg.Runs.MaxRetainedOutputBytes}); err != nil {
		return err
	}
	access, err := d.access(cfg)
	if err != nil {
		return err
	}
	if d.db, err = store.Open(filepath.Join(cfg.State.Dir, "audit.db")); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	defer d.db.Close()
	d.audit = &supervisor.Audit{Store: d.db, Log: d.log, Healthy: func(err error) { d.health.Set(checkAudit, err) }}
	d.audit.Attach(d.mgr)
	if err := d.audit.Record(context.Background(), store.DaemonStart, supervisor.Daemon(), "",
		map[string]any{"version": version, "revision": revision, "config": path, "tcp": cfg.TCP.Listen}); err != nil {
		return fmt.Errorf("the audit log cannot be written: %w", err)
	}
	// Runs in flight when the daemon last died (SIGKILL, power loss) ended with it:
	// their workers died too (parent-death signal). Say so in the log.
	// Each record names the run's caller, as its run.admitted did.
	if admitted, err := d.db.Unfinished(context.Background()); err == nil {
		for _, e := range admitted {
			var by struct {
				Token string `json:"token"`
			}
			json.Unmarshal(e.Detail, &by)
			d.audit.Record(context.Background(), store.RunAborted, supervisor.Caller{UID: e.UID, Token: by.Token}, e.RunID,
				map[string]any{"reason": "the daemon stopped while the run was in flight"})
		}
		if len(admitted) > 0 {
			d.log.Warn("runs in flight at the last stop marked aborted", "runs", len(admitted))
		}
	}
	pruneCtx, stopPrune := context.WithCancel(context.Background())
	defer stopPrune()
	go d.audit.PruneEvery(pruneCtx, time.Hour, cfg.Audit.Retention.Duration)
	workspaces, err := workspace.Open(filepath.Join(cfg.State.Dir, "workspaces"),
		workspace.Quota{Bytes: cfg.Workspaces.MaxBytes, Files: cfg.Workspaces.MaxFiles})
	if err != nil {
		return err
	}

	metrics := supervisor.NewMetrics(d.mgr, version, revision)
	pool := func(f func(sandbox.PoolStats) float64) func() float64 {
		return func() float64 { return f(d.sp.PoolStats()) }
	}
	metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_pool_idle_workers",
			Help: "Warm workers ready for a run."}, pool(func(p sandbox.PoolStats) float64 { return float64(p.Idle) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_pool_idle_resident_bytes",
			Help: "Resident memory of the idle warm workers (VmRSS when each became ready)."},
			pool(func(p sandbox.PoolStats) float64 { return float64(p.IdleRSSBytes) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_pool_hits_total",
			Help: "Runs served by a warm worker."}, pool(func(p sandbox.PoolStats) float64 { return float64(p.Hits) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_pool_misses_total",
			Help: "Runs the pool could serve that found no warm worker ready (they started one)."},
			pool(func(p sandbox.PoolStats) float64 { return float64(p.Misses) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_pool_failures_total",
			Help: "Warm workers that could not be prepared."},
			pool(func(p sandbox.PoolStats) float64 { return float64(p.Failures) })),
	)
	approvals := supervisor.NewApprovals(cfg.Approvals.TTL.Duration, cfg.Approvals.Window.Duration)
	metrics.CountApprovals(approvals)
	d.srv = api.New(api.Options{
		Workspaces:      workspaces,
		Approvals:       approvals,
		ApprovalActions: cfg.Approvals.Required,
		Metrics:         promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}), Audit: d.audit,
		RecordCode: cfg.Audit.RecordCode,
		Service:    d.mgr, Access: access, Policy: pol, MaxBodyBytes: cfg.Runs.MaxRequestBytes, Module: d.module,
		Disabled: func() bool { return d.cfg.Load().Disabled },
		Health:   d.health,
		Info:     d.info,
	})

	// Listen first, so that the probes answer (503) while the sandbox is verified.
	errc := make(chan error, 2)
	ul, err := d.listenUnix(cfg)
	if err != nil {
		return err
	}
	go func() { errc <- d.srv.Serve(api.Listen(ul, cfg.Runs.MaxConnections, cfg.Runs.MaxConnectionsPerUID)) }()
	if cfg.TCP.Listen != "" {
		tl, err := listenTCP(cfg.TCP, cfg.Runs.MaxConnections, cfg.Runs.MaxConnectionsPerUID)
		if err != nil {
			return err
		}
		go func() { errc <- d.srv.Serve(tl) }()
		d.log.Warn("listening on TCP: callers must present a bearer token", "address", tl.Addr().String(),
			"tokens", len(access.Tokens), "tls", cfg.TCP.TLSCertFile != "")
	}

	// SIGTERM during the self-test still stops the daemon cleanly.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	// SIGTERM during the self-test stops it (its canary worker is killed) and the
	// daemon exits 0.
	vctx, stopVerify := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err = d.verify(vctx, cfg, pol)
	signalled := vctx.Err() != nil // before stopVerify, which cancels vctx too
	stopVerify()
	if signalled {
		d.log.Info("stopping during the self-test")
		d.shutdown()
		return nil
	}
	if err != nil {
		d.health.Set(checkSelftest, err)
		if cfg.Health.ExitOnFailure {
			d.shutdown()
			return fmt.Errorf("self-test: %w", err)
		}
		d.notify.Status("unready: self-test failed: " + err.Error())
		d.log.Error("self-test failed: staying up unready (health.exit_on_failure = false); every run is refused", "error", err)
	} else {
		d.health.Set(checkSelftest, nil)
		d.warm(cfg, pol)
		d.keepChecking()
		layers := d.report.Load().Enforcement.ActiveLayers()
		d.status = fmt.Sprintf("sandcell %s, CPython %s: ready, %d layers active (%s)", version,
			bundle.Pinned().Version, len(layers), strings.Join(layers, ","))
		d.notify.Ready(d.status)
		d.log.Info("ready", "layers", layers, "socket", cfg.Socket.Path)
	}

	for {
		select {
		case err := <-errc:
			return err
		case s := <-sig:
			if s == syscall.SIGHUP {
				d.reload()
				continue
			}
			d.log.Info("stopping", "signal", s.String())
			d.shutdown()
			return nil
		}
	}
}

// verify runs the start-up self-test, telling systemd to wait while a module
// compiles.
func (d *daemon) verify(ctx context.Context, cfg config.Config, pol policy.Policy) error {
	d.notify.Status("verifying the sandbox")
	r := selftest.Run(ctx, selftest.Options{BundleDir: cfg.Bundle.Dir, CacheDir: cfg.Bundle.CacheDir,
		Policy: pol, Spawner: d.sp, WorkDir: d.canaryW,
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
	d.report.Store(r)
	d.health.Set(checkCanary, nil)
	d.health.Set(checkManager, nil)
	return nil
}

// warm (re)starts the warm pool for pol's default runs; a pool that cannot be had
// (pool.size 0, namespaces disabled) leaves every run cold, which the log says.
func (d *daemon) warm(cfg config.Config, pol policy.Policy) {
	opts := sandbox.PoolOptions{Size: cfg.Pool.Size, MemoryBudget: cfg.Pool.MemoryBudget,
		Roots:  []string{filepath.Join(cfg.State.Dir, "workspaces"), filepath.Join(cfg.State.Dir, "work"), d.canaryW},
		Failed: func(err error) { d.log.Warn("a warm worker could not be prepared", "error", err) }}
	if module, lib, err := d.module(false); err == nil && opts.Size > 0 {
		opts.Template = protocol.Request{ModulePath: module, LibDir: lib, Limits: pol.Default,
			Hardening: pol.Hardening(pol.Default)}
		os.MkdirAll(d.canaryW, 0o700)
	} else {
		opts.Size = 0
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

// module returns the verified precompiled module for a run.
func (d *daemon) module(fuel bool) (string, string, error) {
	r := d.report.Load()
	if r == nil {
		return "", "", errors.New("the sandbox has not been verified")
	}
	return r.Modules[fuel], r.LibDir, nil
}

func (d *daemon) info() any {
	cfg := d.cfg.Load()
	pol, _ := cfg.Policy()
	info := map[string]any{
		"version": version, "revision": revision, "interpreter": bundle.Pinned(),
		"limits":  map[string]any{"default": pol.Default, "max": pol.Max},
		"require": pol.Require,
		"pool":    d.sp.PoolStats(),
		"runs":    map[string]int{"max_concurrent": cfg.Concurrency(), "queue_length": cfg.Runs.QueueLength, "max_per_caller": cfg.PerCaller()},
	}
	if r := d.report.Load(); r != nil {
		info["enforcement"] = r.Enforcement
	}
	return info
}

// keepChecking starts the periodic checks: the light canary every
// health.canary_interval; the run manager's progress every 5 s (liveness, with or
// without systemd); and, with the systemd watchdog on, a ping at half its interval
// only while every check holds. The canary runs on its own goroutine, so a slow
// canary never delays a ping.
func (d *daemon) keepChecking() {
	go func() {
		t := time.NewTicker(d.cfg.Load().Health.CanaryInterval.Duration)
		defer t.Stop()
		for range t.C {
			cfg := d.cfg.Load()
			pol, _ := cfg.Policy()
			r := d.report.Load()
			err := selftest.Light(context.Background(), selftest.Options{Policy: pol, Spawner: d.sp, WorkDir: d.canaryW},
				r.Modules[false], r.LibDir)
			if err != nil {
				d.log.Error("canary failed: runs are refused until it passes", "error", err)
			}
			d.health.Set(checkCanary, err)
		}
	}()
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for range t.C {
			d.health.Set(checkManager, d.mgr.Wedged())
		}
	}()
	wd, watchdog := systemd.WatchdogInterval()
	if !watchdog {
		return
	}
	d.log.Info("watchdog on", "interval", wd)
	go func() {
		t := time.NewTicker(wd / 2)
		defer t.Stop()
		for range t.C {
			d.health.Set(checkManager, d.mgr.Wedged())
			if ok, _ := d.health.Ready(); ok {
				d.notify.Watchdog()
			} else {
				d.log.Error("watchdog not pinged", "why", d.health.Why())
			}
		}
	}()
}

// reload applies a new configuration on SIGHUP: the kill switch, access and the run
// policy change at once; keys that need a restart are named in the log. On any
// error the old configuration stays. In-flight runs are not touched.
func (d *daemon) reload() {
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
	cfg, _, err := loadConfig(d.flags)
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
		d.audit.Record(context.Background(), store.DaemonReload, supervisor.Daemon(), "", map[string]any{"error": err.Error()})
		done("reload refused, the previous configuration stays: " + err.Error())
		return
	}
	old := d.cfg.Load()
	var restart []string
	for key, same := range map[string]bool{"bundle": old.Bundle == cfg.Bundle, "state": old.State == cfg.State,
		"socket": old.Socket == cfg.Socket, "tcp": old.TCP == cfg.TCP, "runs": old.Runs == cfg.Runs,
		"workspaces": old.Workspaces == cfg.Workspaces, "health": old.Health == cfg.Health, "pool": old.Pool == cfg.Pool,
		"audit": old.Audit == cfg.Audit} {
		if !same {
			restart = append(restart, key)
		}
	}
	d.srv.SetAccess(access)
	d.srv.SetPolicy(pol)
	if ready {
		d.warm(*old, pol) // workers prepared for the old policy are replaced
	}
	d.cfg.Store(&cfg)
	d.log.Info("configuration reloaded", "disabled", cfg.Disabled, "needs_restart", restart)
	done("configuration reloaded")
	d.audit.Record(context.Background(), store.DaemonReload, supervisor.Daemon(), "",
		map[string]any{"disabled": cfg.Disabled, "needs_restart": restart})
}

// access resolves the configured principals and loads the tokens.
func (d *daemon) access(cfg config.Config) (api.Access, error) {
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
	return access, nil
}

// listenUnix returns the socket passed by systemd, or creates socket.path.
func (d *daemon) listenUnix(cfg config.Config) (*net.UnixListener, error) {
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

// shutdown stops accepting, lets runs finish for runs.shutdown_grace, kills the rest.
func (d *daemon) shutdown() {
	d.notify.Stopping("stopping: letting running runs finish")
	grace := d.cfg.Load().Runs.ShutdownGrace.Duration
	ctx, cancel := context.WithTimeout(context.Background(), grace+5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { d.mgr.Shutdown(grace); close(done) }()
	if err := d.srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		d.log.Warn("shutdown", "error", err)
	}
	<-done
	d.sp.Warm(sandbox.PoolOptions{}) // idle workers
	d.audit.Record(context.Background(), store.DaemonStop, supervisor.Daemon(), "", map[string]any{})
	d.log.Info("stopped")
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
