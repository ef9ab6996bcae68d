package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/supervisor/config"
	"github.com/sandcell/sandcell/supervisor/store"
)

func newAuditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Check the daemon's audit log"}
	var stateDir, cfgPath string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Walk the audit log's hash chain; fail naming the first record that was edited, deleted or inserted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := stateDir
			if dir == "" {
				path := cfgPath
				if path == "" {
					if _, err := os.Stat(defaultConfigPath); err == nil {
						path = defaultConfigPath
					}
				}
				cfg, err := config.Load(path, os.Environ())
				if err != nil {
					return err
				}
				dir = cfg.State.Dir
			}
			db := filepath.Join(dir, "audit.db")
			if _, err := os.Stat(db); err != nil {
				return err
			}
			s, err := store.Open(db)
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.Verify(context.Background())
			if err != nil {
				return fmt.Errorf("%s: %w (%d records verified before it)", db, err, n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d records, chain intact\n", db, n)
			return nil
		},
	}
	verify.Flags().StringVar(&stateDir, "state-dir", "", "the daemon's state directory (default: state.dir of the configuration)")
	verify.Flags().StringVar(&cfgPath, "config", "", "configuration file (default "+defaultConfigPath+" when it exists)")
	cmd.AddCommand(verify)
	return cmd
}
