package main

import (
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

func newManpageCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "manpage DIR",
		Short: "Write the man pages (sandcell(8) and one per command) into DIR, from the commands' help",
		Long: `Write the man pages into DIR: sandcell.8 and sandcell-COMMAND.8 for each command, in
roff, generated from the same help the commands print. The date is
$SOURCE_DATE_EPOCH's when set, so a package build is reproducible.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			date := time.Now()
			if s, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
				date = time.Unix(s, 0).UTC()
			}
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root.DisableAutoGenTag = true
			hdr := &doc.GenManHeader{Title: "SANDCELL", Section: "8", Source: "sandcell " + version,
				Manual: "System Administration", Date: &date}
			return doc.GenManTree(root, hdr, args[0])
		},
	}
}
