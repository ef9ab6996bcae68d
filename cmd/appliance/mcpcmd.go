package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/mcpserver"
	"github.com/sandcell/sandcell/supervisor/toolbroker"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

func newMCPCmd() *cobra.Command {
	var socket, wsDir, bundleDir, cacheDir string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the agent tools over MCP on stdin and stdout, through a running daemon",
		Long: `Serve the agent tools (run_python, run_sql, list_files, read_file, write_file) as a
Model Context Protocol server on stdin and stdout, for an agent host that starts
it as a subprocess. Every call goes to the daemon listening on --socket (default
$SANDCELL_SOCKET, else ` + config.Default().Socket.Path + `) as this process's user,
so the daemon's roles, policy, approvals and audit apply. The tools use one
workspace, created at their first use and kept afterwards (its id is remembered in
the cache directory, for the next start); each result names it. While the daemon is not ready or its kill switch is on, the tool list is
empty and the client is told when that changes.

With --workspace DIR it needs no daemon of the system's: it runs one in this
process (the daemon sandcell serve runs, with its policy, self-test, approvals and
audit), with a private state directory removed when it ends, and DIR as the one
workspace (the tools' files are DIR's); its only caller is this user; a SQL
statement that writes is held until the person at the client confirms it. If the
self-test fails it exits, saying why. See docs/agents.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if socket == "" {
				socket = config.Default().Socket.Path
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			var fixed string // the tools' one workspace, when it is DIR
			if wsDir != "" {
				dir, err := filepath.Abs(wsDir)
				if err == nil {
					dir, err = filepath.EvalSymlinks(dir) // the workspace is where it leads now
				}
				if err != nil {
					return rejected{err}
				}
				if _, _, err := precompiled(bundleDir, cacheDir, false); err != nil {
					return err // no bundle (it says how to make one)
				}
				// Fail closed: the daemon's self-test passes before any tool is offered.
				local, err := startLocalDaemon(ctx, dir, bundleDir, cacheDir)
				if err != nil {
					return rejected{err}
				}
				defer local.close()
				socket, fixed = local.socket, workspace.DirectoryID
			}
			c := client.New(socket)
			var guest atomic.Pointer[string] // the daemon's guest tools, as its listing last said
			opts := mcpserver.Options{
				Version:     version,
				Backend:     func(string) mcpserver.Backend { return c },
				Unavailable: func(ctx context.Context) string { return unavailable(ctx, c, &guest) },
				GuestTools: func() string {
					if g := guest.Load(); g != nil {
						return *g
					}
					return ""
				},
				Workspace: fixed,
			}
			if cache := defaultCacheDir(); wsDir == "" && cache != "" {
				// The workspace of the last `sandcell mcp` on this socket, kept
				// between starts: an agent host that restarts it finds its files.
				sum := sha256.Sum256([]byte(socket))
				remembered := filepath.Join(cache, "mcp-workspace-"+hex.EncodeToString(sum[:8]))
				if b, err := os.ReadFile(remembered); err == nil {
					opts.Workspace = strings.TrimSpace(string(b))
				}
				opts.Remember = func(_, id string) {
					os.MkdirAll(filepath.Dir(remembered), 0o700)
					os.WriteFile(remembered, []byte(id+"\n"), 0o600)
				}
			}
			s := mcpserver.New(opts)
			go s.Watch(ctx, 2*time.Second)
			err := s.RunStdio(ctx)
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&socket, "socket", os.Getenv("SANDCELL_SOCKET"), "the daemon's Unix socket")
	fl.StringVar(&wsDir, "workspace", "", "serve through a daemon run in this process, with this directory as the workspace")
	fl.StringVar(&bundleDir, "bundle-dir", defaultBundleDir(), "with --workspace: directory holding python.wasm and MANIFEST ($SANDCELL_BUNDLE_DIR)")
	fl.StringVar(&cacheDir, "cache-dir", defaultCacheDir(), "with --workspace: where a rebuilt .cwasm is kept ($SANDCELL_CACHE_DIR)")
	return cmd
}

// unavailable asks the daemon whether its tools are offered (GET /v1/tools), and
// keeps in guest what its listing says of the guest tools (their summary).
func unavailable(ctx context.Context, c *client.Client, guest *atomic.Pointer[string]) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := c.Tools(ctx)
	if err != nil {
		return "the daemon cannot be reached: " + err.Error()
	}
	var l struct {
		Available  bool                `json:"available"`
		Reason     string              `json:"reason"`
		GuestTools []toolbroker.Source `json:"guest_tools"`
	}
	if json.Unmarshal(raw, &l) != nil {
		return "the daemon's tool listing cannot be read"
	}
	summary := toolbroker.SummaryOf(l.GuestTools)
	guest.Store(&summary)
	if !l.Available {
		return l.Reason
	}
	return ""
}
