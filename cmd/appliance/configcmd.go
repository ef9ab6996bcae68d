package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/packaging"
	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
)

// defaultConfigPath is where the packages install the configuration (a conffile).
const defaultConfigPath = "/etc/sandcell/sandcell.toml"

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check, show and explain the daemon's configuration",
	}
	validate := &cobra.Command{
		Use:   "validate [FILE]",
		Short: "Check a configuration file (default " + defaultConfigPath + ") with the SANDCELL_* environment over it; every problem is listed with its key",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := defaultConfigPath
			if len(args) == 1 {
				path = args[0]
			}
			cfg, err := config.Load(path, os.Environ())
			if err != nil {
				// Exit 1, as validators do (ExecStartPre=, scripts): the file is wrong,
				// sandcell is not.
				fmt.Fprintf(os.Stderr, "sandcell config validate: %v\n", err)
				return exitCode(1)
			}
			// What serve would refuse at start is refused here too (ExecStartPre=).
			if cfg.TCP.Listen != "" {
				if _, err := api.LoadTokens(cfg.TCP.TokensFile); err != nil {
					fmt.Fprintf(os.Stderr, "sandcell config validate: tcp.tokens_file: %v\n", err)
					return exitCode(1)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", path)
			return nil
		},
	}
	def := &cobra.Command{
		Use:   "default",
		Short: "Print the commented default configuration (the packaged " + defaultConfigPath + ")",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), packaging.DefaultConfig())
			return err
		},
	}
	var file string
	dump := &cobra.Command{
		Use:   "dump",
		Short: "Print the configuration in force: the built-in defaults, the file (--config) and the SANDCELL_* environment",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := config.Load(file, os.Environ())
			if err != nil {
				return err
			}
			return c.Encode(cmd.OutOrStdout())
		},
	}
	dump.Flags().StringVar(&file, "config", "", "configuration file to read (default: none, the built-in defaults)")
	cmd.AddCommand(validate, def, dump)
	return cmd
}
