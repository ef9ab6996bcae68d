// Command sandcell-worker is the lean worker: `sandcell-worker __worker`, the same
// body as `sandcell __worker` (sandbox/worker) in a binary that links nothing else, so
// that a worker reaches the engine without running the daemon's package initialisers.
// It is never installed as a file: the daemon binary carries it (built with the
// leanworker tag, see cmd/appliance/leanworker.go) and runs it from a sealed memfd.
package main

import (
	"os"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	os.Stderr.WriteString("sandcell-worker: started by the daemon only\n")
	os.Exit(2)
}
