package api_test

import (
	"testing"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// A path with a NUL byte is refused before a worker is spent on it.
func TestRunPathWithNUL(t *testing.T) {
	d := start(t, setup{})
	ws := d.newWorkspace(t)
	resp, body := d.do(t, "POST", "/v1/runs", `{"workspace":"`+ws+`","path":"a\u0000b"}`)
	wantProblem(t, resp, body, 400, wire.CodeBadRequest)
}
