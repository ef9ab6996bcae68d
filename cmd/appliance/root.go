package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// Exit statuses of `sandcell run` for runs that did not end by themselves, and of the
// CLI for its own failures. They follow the shell's conventions (timeout(1) uses 124,
// a signal N gives 128+N) so scripts can tell them apart from the program's own codes.
const (
	exitTimeout     = 124 // wall-clock limit reached (as timeout(1))
	exitUsage       = 125 // sandcell itself failed: bad flags, no bundle, internal error
	exitRejected    = 126 // refused by policy before running
	exitCancelled   = 130 // cancelled (128 + SIGINT)
	exitTrap        = 134 // WebAssembly trap (128 + SIGABRT)
	exitMemoryLimit = 137 // out of memory (128 + SIGKILL, as the kernel's OOM killer leaves it)
	exitCPULimit    = 152 // CPU time or fuel exhausted (128 + SIGXCPU)
	exitOutputLimit = 153 // output cap or workspace quota reached (128 + SIGXFSZ)
)

// exitCode is an error that carries an exit status and has already been reported.
type exitCode int

func (e exitCode) Error() string { return "exit status" }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sandcell",
		Short:         "Run untrusted Python in a WASI sandbox that can touch only one workspace",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newServeCmd(), newBundleCmd(), newConfigCmd(), newAuditCmd(), newTokenCmd(), newSQLCmd(), newSelftestCmd(), newHealthcheckCmd(), newVersionCmd(), newMCPCmd(), newSessionCmd())
	root.AddCommand(newManpageCmd(root))
	return root
}

// defaultBundleDir finds the bundle: $SANDCELL_BUNDLE_DIR, else /usr/lib/sandcell
// beside an installed /usr/bin/sandcell, else build/bundle of a source checkout
// (bin/sandcell -> ../build/bundle).
func defaultBundleDir() string {
	if d := os.Getenv("SANDCELL_BUNDLE_DIR"); d != "" {
		return d
	}
	exe, err := os.Executable()
	if err == nil {
		exe, _ = filepath.EvalSymlinks(exe)
		base := filepath.Dir(filepath.Dir(exe))
		for _, d := range []string{filepath.Join(base, "lib", "sandcell"), filepath.Join(base, "build", "bundle")} {
			if _, err := os.Stat(filepath.Join(d, "MANIFEST")); err == nil {
				return d
			}
		}
	}
	return "/usr/lib/sandcell"
}

// defaultCacheDir is where a rebuilt .cwasm goes: $SANDCELL_CACHE_DIR, else the
// user's cache directory ($XDG_CACHE_HOME/sandcell), else the bundle directory.
func defaultCacheDir() string {
	if d := os.Getenv("SANDCELL_CACHE_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "sandcell")
	}
	return ""
}
