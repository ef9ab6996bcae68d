package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/net/netutil"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/store"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// shutdownGrace is how long running runs may go on after SIGTERM before their
// workers are killed.
const shutdownGrace = 30 * time.Second

type serveFlags struct {
	config, socket, stateDir, bundleDir, cacheDir string
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the HTTP API on a Unix socket",
		Long: `Run the daemon: the HTTP API (see README) on a Unix socket. It loads the
configuration (--config, else ` + defaultConfigPath + ` when it exists, else the built-in
defaults, with the SANDCELL_* environment over it), checks the bundle, runs a canary
worker that must print 42 with every required enforcement layer verified, and only
then accepts runs (GET /readyz answers 200). SIGTERM or SIGINT: stop accepting, let
running runs finish for up to 30 s, kill the rest, exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return serve(cmd, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "configuration file (default "+defaultConfigPath+" when it exists)")
	fl.StringVar(&f.socket, "socket", "", "Unix socket to listen on (overrides socket.path)")
	fl.StringVar(&f.stateDir, "state-dir", "", "state directory (overrides state.dir)")
	fl.StringVar(&f.bundleDir, "bundle-dir", "", "bundle directory (overrides bundle.dir)")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "where a rebuilt .cwasm is kept (overrides bundle.cache_dir)")
	return cmd
}

func serve(cmd *cobra.Command, f *serveFlags) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	path := f.config
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		return err
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
				return err
			}
			*o.dst = abs
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	pol, err := cfg.Policy()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.State.Dir, 0o700); err != nil {
		return err
	}

	// The interpreter, verified once: the plain and the fuel-metered module.
	modules := map[bool]string{}
	var lib string
	for _, fuel := range []bool{false, true} {
		if modules[fuel], lib, err = precompiled(cfg.Bundle.Dir, cfg.Bundle.CacheDir, fuel); err != nil {
			return err
		}
	}
	module := func(fuel bool) (string, string, error) { return modules[fuel], lib, nil }

	sp := sandbox.SelfSpawner()
	sp.Protected = []string{cfg.Bundle.Dir, cfg.Bundle.CacheDir}
	if exe, err := os.Executable(); err == nil {
		sp.Protected = append(sp.Protected, filepath.Dir(exe))
	}
	mgr, err := supervisor.NewManager(sp, supervisor.Options{Concurrency: cfg.Concurrency(),
		QueueLength: cfg.Runs.QueueLength, Retention: cfg.Runs.ResultRetention.Duration,
		WorkDir: filepath.Join(cfg.State.Dir, "work"), MaxRetainedOutputBytes: cfg.Runs.MaxRetainedOutputBytes})
	if err != nil {
		return err
	}

	access := api.Access{}
	if cfg.TCP.Listen != "" {
		// Never a TCP listener without tokens: refuse to start instead.
		if access.Tokens, err = api.LoadTokens(cfg.TCP.TokensFile); err != nil {
			return fmt.Errorf("tcp.listen is set: %w", err)
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
			log.Warn("access entries that name nobody on this host grant nothing", "list", "access."+a.name, "error", err)
		}
	}

	// The canary: the sandbox must hold on this host before any run is accepted.
	var ready atomic.Bool
	var notReady atomic.Value
	notReady.Store("the start-up canary has not finished")
	var contract atomic.Pointer[protocol.Enforcement]
	canary := func() error {
		limits, err := pol.Resolve(protocol.Limits{TimeoutMS: 30_000})
		if err != nil {
			return err
		}
		ws, err := os.MkdirTemp(filepath.Join(cfg.State.Dir, "work"), "canary-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(ws)
		res, err := sp.Run(context.Background(), protocol.Request{Code: "print(6*7)", Workspace: ws, Limits: limits,
			Hardening: pol.Hardening(limits), ModulePath: modules[false], LibDir: lib})
		if err != nil {
			return err
		}
		if res.Enforcement != nil {
			contract.Store(res.Enforcement)
		}
		if res.Reason != protocol.Exited || string(res.Stdout) != "42\n" {
			return fmt.Errorf("canary ended %s with stdout %q: %v", res.Reason, res.Stdout, res.Diagnostics)
		}
		if miss := res.Enforcement.Missing(pol.Require); len(miss) > 0 {
			return fmt.Errorf("required layers not active: %v", miss)
		}
		return nil
	}

	gid := -1
	if cfg.Socket.Group != "" {
		if g, err := user.LookupGroup(cfg.Socket.Group); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		} else {
			log.Warn("socket group does not exist; the socket keeps the daemon's group", "group", cfg.Socket.Group)
		}
	}
	mode, _ := strconv.ParseUint(cfg.Socket.Mode, 8, 32)
	if err := os.MkdirAll(filepath.Dir(cfg.Socket.Path), 0o755); err != nil {
		return err
	}
	l, err := api.ListenUnix(cfg.Socket.Path, os.FileMode(mode), gid)
	if err != nil {
		return err
	}
	db, err := store.Open(filepath.Join(cfg.State.Dir, "audit.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	audit := &supervisor.Audit{Store: db, Log: log}
	audit.Attach(mgr)
	if err := audit.Record(context.Background(), "daemon.start", os.Getuid(), "",
		map[string]any{"version": version, "revision": revision, "config": path}); err != nil {
		return fmt.Errorf("the audit log cannot be written: %w", err)
	}
	// Runs in flight when the daemon last died (SIGKILL, power loss) ended with it:
	// their workers died too (parent-death signal). Say so in the log.
	if ids, err := db.Unfinished(context.Background()); err == nil {
		for _, id := range ids {
			audit.Record(context.Background(), "run.aborted", os.Getuid(), id,
				map[string]any{"reason": "the daemon stopped while the run was in flight"})
		}
		if len(ids) > 0 {
			log.Warn("runs in flight at the last stop marked aborted", "runs", len(ids))
		}
	}
	workspaces, err := workspace.Open(filepath.Join(cfg.State.Dir, "workspaces"),
		workspace.Quota{Bytes: cfg.Workspaces.MaxBytes, Files: cfg.Workspaces.MaxFiles})
	if err != nil {
		return err
	}
	pruneCtx, stopPrune := context.WithCancel(context.Background())
	defer stopPrune()
	go audit.PruneEvery(pruneCtx, time.Hour, cfg.Audit.Retention.Duration)
	metrics := supervisor.NewMetrics(mgr, version, revision)
	srv := api.New(api.Options{
		Workspaces: workspaces,
		Metrics:    promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}), Audit: audit,
		RecordCode: cfg.Audit.RecordCode,
		Service:    mgr, Access: access, Policy: pol, MaxBodyBytes: cfg.Runs.MaxRequestBytes, Module: module,
		Disabled: func() bool { return cfg.Disabled },
		Ready: func() (bool, string) {
			if ready.Load() {
				return true, ""
			}
			return false, notReady.Load().(string)
		},
		Info: func() any {
			info := map[string]any{
				"version": version, "revision": revision,
				"limits":  map[string]any{"default": pol.Default, "max": pol.Max},
				"require": pol.Require, "enforcement": contract.Load(),
				"runs": map[string]int{"max_concurrent": cfg.Concurrency(), "queue_length": cfg.Runs.QueueLength},
			}
			info["interpreter"] = bundle.Pinned
			return info
		},
	})
	errc := make(chan error, 1)
	// At most max_connections open at once: slow clients queue in the backlog
	// instead of taking descriptors and memory without bound.
	go func() { errc <- srv.Serve(api.Listen(l, cfg.Runs.MaxConnections, cfg.Runs.MaxConnectionsPerUID)) }()
	log.Info("listening", "socket", cfg.Socket.Path, "mode", cfg.Socket.Mode)
	if cfg.TCP.Listen != "" {
		tl, err := listenTCP(cfg.TCP, cfg.Runs.MaxConnections)
		if err != nil {
			return err
		}
		go func() { errc <- srv.Serve(tl) }()
		log.Warn("listening on TCP: callers must present a bearer token", "address", tl.Addr().String(),
			"tokens", len(access.Tokens), "tls", cfg.TCP.TLSCertFile != "")
	}

	go func() {
		if err := canary(); err != nil {
			notReady.Store("the sandbox could not be verified on this host: " + err.Error())
			log.Error("start-up canary failed: no run will be accepted", "error", err)
			return
		}
		ready.Store(true)
		e := contract.Load()
		log.Info("ready", "layers", e.ActiveLayers())
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errc:
		return err
	case s := <-sig:
		log.Info("stopping", "signal", s.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace+5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { mgr.Shutdown(shutdownGrace); close(done) }()
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("shutdown", "error", err)
	}
	<-done
	audit.Record(context.Background(), "daemon.stop", os.Getuid(), "", map[string]any{})
	log.Info("stopped")
	return nil
}

// listenTCP opens the TCP listener: at most max connections at once, TLS (1.2 or
// later) when a certificate is configured.
func listenTCP(c config.TCP, max int) (net.Listener, error) {
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, err
	}
	l = netutil.LimitListener(l, max)
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
