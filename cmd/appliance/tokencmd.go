package main

import (
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/supervisor/api"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Bearer tokens for the TCP listener"}
	var roles []string
	newCmd := &cobra.Command{
		Use:   "new NAME",
		Short: "Print a new random secret and the [[token]] entry (its SHA-256) for tcp.tokens_file",
		Long: `Prints a new secret (give it to the client, which sends "Authorization: Bearer SECRET";
it is not stored anywhere) and the [[token]] entry to append to the daemon's
tcp.tokens_file, which holds only the secret's SHA-256.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rs []api.Role
			for _, r := range roles {
				rs = append(rs, api.Role(r))
			}
			secret, t := api.NewToken(args[0], rs)
			if err := (api.Tokens{t}).Validate(); err != nil {
				return err
			}
			var entry strings.Builder
			if err := toml.NewEncoder(&entry).Encode(map[string]any{"token": []api.Token{t}}); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "# The secret of token %q (shown once; the daemon keeps only its hash):\n# %s\n", t.Name, secret)
			fmt.Fprintf(out, "# Append to tcp.tokens_file:\n%s", entry.String())
			return nil
		},
	}
	newCmd.Flags().StringSliceVar(&roles, "role", []string{"runner"}, "roles the token grants: runner, approver, admin")
	cmd.AddCommand(newCmd)
	return cmd
}
