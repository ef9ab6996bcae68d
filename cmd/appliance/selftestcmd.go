package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/daemon"
	"github.com/sandcell/sandcell/supervisor/selftest"
)

func newSelftestCmd() *cobra.Command {
	var f serveFlags
	var format string
	cmd := &cobra.Command{
		Use:   "selftest",
		Short: "Verify the sandbox on this host, as the daemon does before it is ready",
		Long: `Verify the sandbox on this host with the daemon's configuration, exactly as
sandcell serve does before READY=1: the interpreter's bytes, the precompiled module
(rebuilt if needed), then a canary worker under the configured policy that must print
42, report every required layer active, and fail each escape probe. Prints one line
per check ([ ok | warn | fail ], check, detail) or, with --format json, the report;
exits 1 when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "table" && format != "json" {
				return fmt.Errorf("--format %q: table or json", format)
			}
			cfg, _, err := loadConfig(&f)
			if err != nil {
				return fmt.Errorf("configuration: %w", err)
			}
			pol, err := cfg.Policy()
			if err != nil {
				return fmt.Errorf("configuration: %w", err)
			}
			work, err := os.MkdirTemp("", "sandcell-selftest-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			r := selftest.Run(context.Background(), selftest.Options{BundleDir: cfg.Bundle.Dir,
				CacheDir: cfg.Bundle.CacheDir, Policy: pol, Spawner: spawner(cfg), WorkDir: filepath.Join(work, "canary"),
				PoolRoots: daemon.PoolRoots(cfg)})
			out := cmd.OutOrStdout()
			if format == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				enc.Encode(map[string]any{"ok": r.OK(), "checks": r.Checks, "enforcement": r.Enforcement})
			} else {
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				for _, c := range r.Checks {
					fmt.Fprintf(tw, "[ %s ]\t%s\t%s\n", c.State, c.Name, c.Detail)
				}
				tw.Flush()
			}
			if !r.OK() {
				return exitCode(1)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&format, "format", "table", "table or json")
	fl.StringVar(&f.config, "config", "", "configuration file (default "+defaultConfigPath+" when it exists)")
	fl.StringVar(&f.bundleDir, "bundle-dir", "", "bundle directory (overrides bundle.dir)")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "where a rebuilt .cwasm is kept (overrides bundle.cache_dir)")
	return cmd
}

func newHealthcheckCmd() *cobra.Command {
	var socket string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 if the daemon is ready (GET /readyz over its socket), 1 if not",
		Long: `Ask the daemon's /readyz over its Unix socket and exit 0 when it answers 200, 1
otherwise (not ready, not running, no answer within --timeout), saying why on
stderr. For container HEALTHCHECKs and Kubernetes exec probes, where there is no
curl.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if socket == "" {
				socket = os.Getenv("SANDCELL_SOCKET")
			}
			if socket == "" {
				socket = defaultSocket()
			}
			c := client.HTTP(socket)
			c.Timeout = timeout
			resp, err := c.Get("http://sandcell/readyz")
			if err != nil {
				fmt.Fprintf(os.Stderr, "sandcell healthcheck: %v\n", err)
				return exitCode(1)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				var p struct{ Detail string }
				json.NewDecoder(resp.Body).Decode(&p)
				fmt.Fprintf(os.Stderr, "sandcell healthcheck: not ready (%s): %s\n", resp.Status, p.Detail)
				return exitCode(1)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the daemon's socket (default $SANDCELL_SOCKET, else socket.path of the configuration)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for an answer")
	return cmd
}

// defaultSocket is socket.path of the configuration in force, or the built-in one.
func defaultSocket() string {
	cfg, _, err := loadConfig(&serveFlags{})
	if err != nil {
		return "/run/sandcell/sandcell.sock"
	}
	return cfg.Socket.Path
}
