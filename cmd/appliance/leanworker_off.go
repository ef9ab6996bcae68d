//go:build !leanworker

package main

// leanWorker is empty in a binary built without the leanworker tag (`go build`,
// `go test`): its workers re-execute the binary itself, as `sandcell __worker`.
var leanWorker []byte
