// Command appliance is the sandcell binary: the CLI, the daemon, and (through the
// hidden `__worker` verb, dispatched before anything else) the sandboxed worker, and
// (`__precompile`) the daemon's compiler of a new hash secret's modules.
package main

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox"
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
	if len(os.Args) > 1 && os.Args[1] == bundle.PrecompileCommand {
		os.Exit(precompileMain(os.Args[2:]))
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

var leanOnce sync.Once

// useLeanWorker makes this process's spawners run the lean worker, when this binary
// carries one (built with the leanworker tag): sandbox.UseWorkerBinary. Without one,
// or if the memfd cannot be made (said on stderr), workers re-execute this binary.
func useLeanWorker() {
	leanOnce.Do(func() {
		if len(leanWorker) == 0 {
			return
		}
		if err := sandbox.UseWorkerBinary(leanWorker); err != nil {
			fmt.Fprintf(os.Stderr, "sandcell: workers re-execute this binary: the lean worker cannot be used: %v\n", err)
		}
	})
}

// newSpawner is sandbox.NewSpawner with the lean worker in use (useLeanWorker).
func newSpawner(protected ...string) *sandbox.Spawner {
	useLeanWorker()
	return sandbox.NewSpawner(protected...)
}
