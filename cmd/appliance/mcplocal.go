package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

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
// a private state directory of its own (its audit log, its socket; in
// localStateBase, which no workspace may hold; removed when the process ends) and DIR attached as its workspace workspace.DirectoryID. Its only
// caller is this process's user: runner and admin; a SQL statement that writes is
// held until the person at the client confirms it (elicitation); nobody else may
// connect (its socket is 0600 in a 0700 directory). Its configuration is the
// default one but for those, for workspaces' quota (localQuotaBytes), one warm
// worker, and a fixed hash secret (the bundle's, as `sandcell run` uses).
type localDaemon struct {
	state  string // the private state directory
	socket string
	stop   context.CancelFunc
	done   chan error // Run's end
}

// startLocalDaemon opens the daemon on dir and runs it until ready: its self-test
// passed (else the error says why, and nothing runs).
func startLocalDaemon(ctx context.Context, dir, bundleDir, cacheDir string) (*localDaemon, error) {
	// The daemon is this process's own: not the service manager's that may have
	// started the agent host (no readiness or watchdog messages, no inherited
	// listening sockets).
	for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(v)
	}
	base, err := localStateBase()
	if err != nil {
		return nil, err
	}
	state, err := os.MkdirTemp(base, "")
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
	cfg.Pool.Size = 1 // one user's agent: one warm worker, not a server's four
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
		Log: log, Version: version, Revision: revision, Workspace: dir, Private: localStateBases()})
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

// localStateBases are where in-process daemons keep their state directories, the
// same for every `sandcell mcp --workspace` of this user whatever its environment
// (so each refuses, before every run, a workspace that holds another's state): the
// user's runtime directory /run/user/UID/sandcell-mcp (a tmpfs of its own, where
// there is one), else /var/tmp/sandcell-mcp-UID.
func localStateBases() []string {
	uid := strconv.Itoa(os.Getuid())
	return []string{filepath.Join("/run/user", uid, "sandcell-mcp"), "/var/tmp/sandcell-mcp-" + uid}
}

// localStateBase makes (or finds) the first of localStateBases it can use: a
// directory of this user's, 0700, not a symbolic link; one another user made
// first is refused. State directories left by an `sandcell mcp` that was killed
// (their lock no longer held) are removed.
func localStateBase() (string, error) {
	bases := localStateBases()
	base := bases[1]
	if st, err := os.Lstat(filepath.Dir(bases[0])); err == nil && st.IsDir() && ownedByMe(st) {
		base = bases[0]
	}
	if err := os.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	st, err := os.Lstat(base)
	if err != nil {
		return "", err
	}
	if !st.IsDir() || !ownedByMe(st) || st.Mode().Perm() != 0o700 {
		return "", fmt.Errorf("%s is not a directory of this user's with mode 0700: remove it", base)
	}
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		stale := filepath.Join(base, e.Name())
		if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
			continue // one starting now may not hold its lock yet
		}
		f, err := os.OpenFile(filepath.Join(stale, "lock"), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			continue // not a state directory (yet): left alone
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(stale) // its daemon is gone: nobody holds its lock
		}
		f.Close()
	}
	return base, nil
}

// ownedByMe reports whether st is of a file this process's user owns.
func ownedByMe(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == os.Getuid()
}
