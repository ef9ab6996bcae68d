package main

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/client"
	"github.com/sandcell/sandcell/supervisor/wire"
)

func newSessionCmd() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Open, use and close interpreter sessions of the daemon (state kept from cell to cell)",
		Long: `An interpreter session is one hardened worker of the daemon whose Python keeps its
state from one cell to the next (see docs/api.md, "Interpreter sessions"). These
commands drive the daemon at --socket; a session lives in the daemon, not in this
process, until it is closed or its idle timeout ends it.

  sandcell session open [--workspace ID] [--memory MiB]    prints the session's id
  sandcell session run ID -c CODE  (or FILE.py)            runs a cell
  sandcell session fork ID                                 prints the new session's id
  sandcell session list
  sandcell session close ID

session run prints the cell's stdout and stderr and exits as sandcell run does. A
cell that reached its time, CPU or memory limit is rolled back (the session's state
is as it was before it), and it says so on stderr; when even that failed, the state
is lost ("sandcell: the session's state is lost: ..."), and every later cell is
refused (exit 126). An idle session is paused to the daemon's disk, and so is every
session when the daemon stops; its next cell resumes it, and says so on stderr
(files it held open are closed). fork makes a new session from ID's state, with a
private copy of ID's workspace.`,
	}
	cmd.PersistentFlags().StringVar(&socket, "socket", cmp.Or(os.Getenv("SANDCELL_SOCKET"), defaultSocket()), "the daemon's Unix socket ($SANDCELL_SOCKET)")

	var workspace string
	var memory int64
	open := &cobra.Command{
		Use:   "open",
		Short: "Open a session and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := client.New(socket).OpenSession(cmd.Context(), wire.SessionRequest{Workspace: workspace,
				Limits: wire.RunLimits{MemoryMiB: memory}})
			if err != nil {
				return sessionErr(err)
			}
			fmt.Println(v.ID)
			return nil
		},
	}
	open.Flags().StringVar(&workspace, "workspace", "", "id of a workspace of yours (POST /v1/workspaces); default: a private one, removed with the session")
	open.Flags().Int64Var(&memory, "memory", 0, "the session's memory limit, MiB (default: policy's)")

	var code, stdin string
	var timeout, cpu time.Duration
	run := &cobra.Command{
		Use:   "run ID (-c CODE | FILE.py)",
		Short: "Run a cell in session ID",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := wire.CellRequest{Code: code}
			switch {
			case cmd.Flags().Changed("code") && len(args) == 1:
			case !cmd.Flags().Changed("code") && len(args) == 2:
				src, err := os.ReadFile(args[1])
				if err != nil {
					return err
				}
				req.Code = string(src)
			default:
				return rejected{errors.New("give the cell as -c CODE or as FILE.py (one of them)")}
			}
			if stdin != "" {
				data, err := readStdin(stdin)
				if err != nil {
					return err
				}
				req.Stdin = string(data)
				if !utf8.Valid(data) {
					req.Stdin, req.StdinEncoding = base64.StdEncoding.EncodeToString(data), "base64"
				}
			}
			req.Limits.TimeoutMS, req.Limits.CPUMS = timeout.Milliseconds(), cpu.Milliseconds()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			a, err := client.New(socket).Cell(ctx, args[0], req)
			switch {
			case ctx.Err() != nil:
				return exitCode(exitCancelled)
			case err != nil:
				return sessionErr(err)
			}
			os.Stdout.Write(a.Result.Stdout)
			if a.Value != "" {
				fmt.Println(a.Value) // after the output, as the interactive interpreter shows it
			}
			os.Stderr.Write(a.Result.Stderr)
			switch a.State {
			case wire.SessionRestored:
				fmt.Fprintln(os.Stderr, "sandcell: the session was paused and is restored from its checkpoint (files it held open are closed)")
			case wire.SessionRolledBack:
				fmt.Fprintf(os.Stderr, "sandcell: the cell ended %s and was rolled back: the session's state is as it was before it\n", a.Result.Reason)
			case wire.SessionLost:
				fmt.Fprintf(os.Stderr, "sandcell: the session's state is lost: %s\n", a.Session.Lost)
			}
			for _, d := range a.Result.Diagnostics {
				fmt.Fprintln(os.Stderr, "sandcell:", d)
			}
			if code := exitStatus(a.Result); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	run.Flags().StringVarP(&code, "code", "c", "", "the cell's Python source")
	run.Flags().StringVar(&stdin, "stdin", "", "file to give the cell as stdin (- for this process's)")
	run.Flags().DurationVar(&timeout, "timeout", 0, "the cell's wall-clock limit (default: the session's)")
	run.Flags().DurationVar(&cpu, "cpu", 0, "the cell's CPU-time limit (default: the session's)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List your sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			views, err := client.New(socket).Sessions(cmd.Context())
			if err != nil {
				return sessionErr(err)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tCELLS\tWORKSPACE\tLAST USED")
			for _, v := range views {
				ws := v.Workspace
				if ws == "" {
					ws = "(private)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", v.ID, v.State, v.Cells, ws, v.LastUsed.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	closeCmd := &cobra.Command{
		Use:   "close ID",
		Short: "Close session ID (its state ends with it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return sessionErr(client.New(socket).CloseSession(cmd.Context(), args[0]))
		},
	}
	fork := &cobra.Command{
		Use:   "fork ID",
		Short: "Make a new session from session ID's state, with a copy of its workspace, and print its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := client.New(socket).ForkSession(cmd.Context(), args[0])
			if err != nil {
				return sessionErr(err)
			}
			fmt.Println(v.ID)
			return nil
		},
	}
	cmd.AddCommand(open, run, fork, list, closeCmd)
	return cmd
}

// sessionErr makes a refusal of the daemon's (4xx but 429) exit 126, like a run's.
func sessionErr(err error) error {
	var p *wire.Problem
	if errors.As(err, &p) && p.Status >= 400 && p.Status < 500 && p.Status != http.StatusTooManyRequests {
		return rejected{err}
	}
	return err
}
