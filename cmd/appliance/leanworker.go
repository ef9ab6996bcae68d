//go:build leanworker

package main

import _ "embed"

// leanWorker is cmd/sandcell-worker, built by `make build` just before this binary
// (see the Makefile's LEAN_WORKER): what every worker runs (sandbox.UseWorkerBinary).
//
//go:embed sandcell-worker
var leanWorker []byte
