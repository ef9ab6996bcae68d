package api

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/wire"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// Every stable code has its status in the one table, and the errors of the parts the
// API drives reach the caller as their codes, wrapped or not.
func TestErrorTable(t *testing.T) {
	for _, code := range wire.Codes() {
		if st := statusOf(code); st == http.StatusInternalServerError && code != wire.CodeInternal {
			t.Errorf("code %s has no status", code)
		}
	}
	for err, code := range map[error]string{
		runs.ErrQueueFull:                                    wire.CodeQueueFull,
		fmt.Errorf("job: %w", runs.ErrCallerLimit):           wire.CodeCallerLimit,
		runs.ErrStopping:                                     wire.CodeStopping,
		sessions.ErrStopping:                                 wire.CodeStopping,
		fmt.Errorf("open x: %w", workspace.ErrUnsafe):        wire.CodeUnsafeFile,
		workspace.ErrQuota:                                   wire.CodeQuota,
		workspace.ErrAttached:                                wire.CodeForbidden,
		fmt.Errorf("%w: held alone", errWorkspaceBusy):       wire.CodeWorkspaceBusy,
		fail(wire.CodeTooManyPending, "x"):                   wire.CodeTooManyPending,
		fmt.Errorf("read: %w", errors.New("something else")): wire.CodeInternal,
	} {
		if e := problemOf(err); e.code != code || e.status != statusOf(code) || e.detail == "" {
			t.Errorf("%v: %+v, want %s", err, e, code)
		}
	}
	for code, want := range map[string]string{wire.CodeQueueFull: "1", wire.CodeTooManyPending: "60", wire.CodeNotFound: ""} {
		if got := retryAfter(code); got != want {
			t.Errorf("Retry-After of %s: %q", code, got)
		}
	}
}
