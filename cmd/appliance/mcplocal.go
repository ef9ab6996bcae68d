package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/daemon"
)

// localQuota bounds `sandcell mcp --workspace DIR`'s workspaces: DIR is a directory
// of the user's own, which may hold much already.
const (
	localQuotaBytes = 16 << 30
	localQuotaFiles = 100_000
)

// localDaemon is the daemon `sandcell mcp --workspace DIR` serves its tools through,
// run in this process: the daemon `sandcell serve` runs (the same policy, the same
// checks, approvals and audit, the same self-test before any tool is offered), with
// a private state directory of its own (its audit log, its socket; outside DIR, in
// $XDG_RUNTIME_DIR, $TMPDIR or /var/tmp; removed when the process ends) and DIR attached as its workspace workspace.DirectoryID. Its only
// caller is this process's user: runner and admin; a SQL statement that writes is
// held until the person at the client confirms it (elicitation); nobody else may
// connect (its socket is 0600 in a 0700 directory). Its configuration is the
// default one but for those, and for workspaces' quota (localQuotaBytes) and a
// fixed hash secret (the bundle's, as `sandcell run` uses).
type localDaemon struct {
	state  string // the private state directory
	socket string
	stop   context.CancelFunc
	done   chan error // Run's end
}

// startLocalDaemon opens the daemon on dir and runs it until ready: its self-test
// passed (else the error says why, and nothing runs).
func startLocalDaemon(ctx context.Context, dir, bundleDir, cacheDir string) (*localDaemon, error) {
	// The state directory goes where DIR is not: a guest must not reach the audit
	// log or the socket (DIR = /tmp is a likely one).
	var base string
	for _, b := range []string{os.Getenv("XDG_RUNTIME_DIR"), os.TempDir(), "/var/tmp"} {
		if b != "" && !daemon.Within(b, dir) {
			base = b
			break
		}
	}
	if base == "" {
		return nil, fmt.Errorf("no directory for the daemon's state outside %s ($XDG_RUNTIME_DIR, $TMPDIR, /var/tmp)", dir)
	}
	state, err := os.MkdirTemp(base, "sandcell-mcp-")
	if err != nil {
		return nil, err
	}
	l := &localDaemon{state: state, socket: filepath.Join(state, "sandcell.sock"), done: make(chan error, 1)}
	cfg := config.Default()
	cfg.State.Dir = state
	cfg.Socket = config.Socket{Path: l.socket, Mode: "0600"}
	if cfg.Bundle.Dir, err = filepath.Abs(bundleDir); err != nil {
		l.remove()
		return nil, err
	}
	cfg.Bundle.CacheDir = filepath.Join(state, "cache")
	if cacheDir != "" {
		if cfg.Bundle.CacheDir, err = filepath.Abs(cacheDir); err != nil {
			l.remove()
			return nil, err
		}
	}
	cfg.Bundle.HashSecretRotation = config.Duration{}
	cfg.Workspaces = config.Workspaces{MaxBytes: localQuotaBytes, MaxFiles: localQuotaFiles}
	me := strconv.Itoa(os.Getuid())
	cfg.Access = config.Access{Runners: []string{me}, Approvers: []string{}, Admins: []string{me}}
	cfg.Approvals.Elicitation = []string{"socket"}
	cfg.Health.ExitOnFailure = true
	if err := cfg.Validate(); err != nil {
		l.remove()
		return nil, err
	}
	useLeanWorker()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := daemon.Open(daemon.Options{Load: func() (config.Config, string, error) { return cfg, "", nil },
		Log: log, Version: version, Revision: revision, Workspace: dir})
	if err != nil {
		l.remove()
		return nil, err
	}
	run, stop := context.WithCancel(context.Background())
	l.stop = stop
	go func() { l.done <- d.Run(run) }()
	select {
	case <-d.Ready():
		return l, nil
	case err := <-l.done:
		l.done <- err
		l.close()
		if err == nil {
			err = fmt.Errorf("the daemon ended before it was ready")
		}
		return nil, err
	case <-ctx.Done():
		l.close()
		return nil, ctx.Err()
	}
}

// close stops the daemon, waits for it, and removes its state directory.
func (l *localDaemon) close() {
	l.stop()
	<-l.done
	l.remove()
}

func (l *localDaemon) remove() { os.RemoveAll(l.state) }
