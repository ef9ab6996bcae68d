package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/daemon"
	"github.com/sandcell/sandcell/systemd"
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
	return newSpawner(cfg.Bundle.Dir, cfg.Bundle.CacheDir)
}

// serve is `sandcell serve`: the daemon (package daemon) with the process's signals.
// SIGHUP reloads the configuration; SIGTERM or SIGINT, during the self-test or
// after, stops it cleanly (exit 0).
func serve(f *serveFlags) error {
	// The audit log, results and workspaces are the daemon's alone, whatever umask
	// it was started with (the unit sets UMask=0077 too; a container runtime 0022).
	syscall.Umask(0o077)
	log := newLogger()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sig)
	useLeanWorker()
	err := func() error {
		d, err := daemon.Open(daemon.Options{Load: func() (config.Config, string, error) { return loadConfig(f) },
			Log: log, Version: version, Revision: revision})
		if err != nil {
			return err
		}
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		for {
			select {
			case err := <-done:
				return err
			case s := <-sig:
				if s == syscall.SIGHUP {
					d.Reload()
					continue
				}
				log.Info("stopping", "signal", s.String())
				stop()
			}
		}
	}()
	if err != nil {
		// systemctl status shows why the start failed, not only that it did.
		systemd.Notifier{}.Status("failed: " + err.Error())
		log.Error("sandcell serve failed", "error", err)
	}
	return err
}
