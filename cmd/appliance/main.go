// Command appliance is the sandcell binary: the CLI, the daemon, and (through the
// hidden `__worker` verb, dispatched before anything else) the sandboxed worker.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
)

// Set through -ldflags by the Makefile.
var (
	version  = "dev"
	revision = "unknown"
)

func main() {
	// The worker first: no CLI parsing, no config, nothing else initialised.
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	os.Exit(execute(os.Args[1:]))
}

// execute runs the CLI and returns the process exit status.
func execute(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	// The full command path ("sandcell token new"), not only the last word.
	name := cmd.CommandPath()
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	var rej rejected
	if errors.As(err, &rej) {
		return exitRejected
	}
	return exitUsage
}
