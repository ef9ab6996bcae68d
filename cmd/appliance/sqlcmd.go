package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/sqltool"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

func newSQLCmd() *cobra.Command {
	var wsDir, params, format, bundleDir, cacheDir string
	var maxRows int
	var allowWrite bool
	cmd := &cobra.Command{
		Use:   "sql --workspace DIR FILE.db SQL",
		Short: "Run one SQL statement on a SQLite file in a workspace, in a hardened worker",
		Long: `Run one SQL statement on the SQLite file FILE.db (a path in the workspace DIR) in a
hardened worker: the statement and the file are parsed only by the sandboxed
interpreter. A statement that only reads runs at once. One that writes is refused
(exit 126) unless --allow-write: here you are your own approver (the daemon's
POST /v1/sql asks an approver instead). ATTACH, DETACH, VACUUM INTO, file-naming
PRAGMAs, extension loading, transaction control and several statements are always
refused.

Prints the result as JSON (--format json, the default) or as a table; exits 0 on
success, 1 when SQLite fails, 126 when the statement is refused.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wsDir == "" {
				return errors.New("--workspace is required")
			}
			dir, err := filepath.Abs(wsDir)
			if err != nil {
				return err
			}
			req := sqltool.Request{DB: args[0], SQL: args[1], MaxRows: maxRows, Write: allowWrite}
			if params != "" {
				req.Params = json.RawMessage(params)
			}
			if err := sqltool.Check(dir, &req); err != nil {
				if errors.Is(err, sqltool.ErrBadRequest) || errors.Is(err, workspace.ErrBadPath) ||
					errors.Is(err, workspace.ErrUnsafe) || errors.Is(err, workspace.ErrNotFound) {
					return rejected{err}
				}
				return err
			}
			pol := policy.Default()
			limits, err := pol.Resolve(protocol.Limits{})
			if err != nil {
				return err
			}
			base := protocol.Request{Limits: limits, Hardening: pol.Hardening(limits)}
			if base.ModulePath, base.LibDir, err = precompiled(bundleDir, cacheDir, false); err != nil {
				return err
			}
			base.EpochlessModulePath = base.ModulePath // the statements' runs' own module
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out, err := sqltool.Run(ctx, newSpawner(bundleDir, cacheDir), dir, req, base)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			switch out.Status {
			case "refused":
				return rejected{errors.New(out.Reason)}
			case "approval_required":
				return rejected{fmt.Errorf("the statement writes (%s): run it with --allow-write if you mean it",
					strings.Join(out.Classification.Bytecode, ", "))}
			case "error":
				fmt.Fprintf(os.Stderr, "sandcell sql: %s: %s\n", out.Error.Code, out.Error.Message)
				return exitCode(1)
			}
			if format == "table" {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				var names []string
				for _, c := range out.Columns {
					names = append(names, c.Name)
				}
				fmt.Fprintln(tw, strings.Join(names, "\t"))
				for _, r := range out.Rows {
					var vals []any
					json.Unmarshal(r, &vals)
					cells := make([]string, len(vals))
					for i, v := range vals {
						b, _ := json.Marshal(v)
						cells[i] = strings.Trim(string(b), `"`)
					}
					fmt.Fprintln(tw, strings.Join(cells, "\t"))
				}
				tw.Flush()
				if out.Truncated {
					fmt.Fprintf(os.Stderr, "sandcell sql: more rows than --max-rows %d\n", req.MaxRows)
				}
				return nil
			}
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&wsDir, "workspace", "", "the workspace directory (required)")
	fl.StringVar(&params, "params", "", `parameters as JSON: an array ([1, "a"]) or an object ({"id": 1})`)
	fl.IntVar(&maxRows, "max-rows", 0, fmt.Sprintf("most rows printed (default %d)", sqltool.DefaultMaxRows))
	fl.BoolVar(&allowWrite, "allow-write", false, "run a statement that writes")
	fl.StringVar(&format, "format", "json", "json or table")
	fl.StringVar(&bundleDir, "bundle-dir", defaultBundleDir(), "bundle directory")
	fl.StringVar(&cacheDir, "cache-dir", defaultCacheDir(), "where a rebuilt .cwasm is kept")
	return cmd
}
