package protocol

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// GuestWorkdir is the workspace's path in the guest (/ws), and the guest's working
// directory, on both backends.
const GuestWorkdir = "/ws"

// Program is what the guest's interpreter reads from stdin before the program's own
// stdin: ten decimal digits giving the header's length, then the header, its fields
// joined by NUL: MODE (code, isolated or path; session: see SessionProgram), the
// source or the script's guest path, the name, disk, N, the N arguments, then the
// environment as KEY, VALUE pairs in key order. disk is what the wasm guest's shutil.disk_usage reports (see
// the worker's diskField); the native runner skips it. The wasm snapshot's bootstrap
// (bundle/bootstrap.py) and the native runner (native.py) read it.
// It fails for a request with both or neither of Code and Path set as a run needs,
// and for a NUL byte in any field.
func Program(req *Request, disk string) ([]byte, error) {
	var fields []string
	switch {
	case req.Code != "" && req.Path != "":
		return nil, fmt.Errorf("request sets both code and path")
	case req.Isolated && req.Path != "":
		return nil, fmt.Errorf("an isolated request runs code, not a path")
	case req.Path != "":
		fields = []string{"path", GuestWorkdir + "/" + req.Path, ""}
	default:
		name := req.Filename
		if name == "" {
			name = "<string>"
		}
		mode := "code"
		if req.Isolated {
			mode = "isolated"
		}
		fields = []string{mode, req.Code, name}
	}
	fields = append(fields, disk, strconv.Itoa(len(req.Args)))
	fields = append(fields, req.Args...)
	return Header(append(fields, EnvFields(req.Env)...))
}

// SessionProgram is the header a warm native worker's runner reads, in place of a
// program's (see Program), when it is claimed for a session: MODE session, the
// other fields empty. The session's cells then come on the control fd.
func SessionProgram() []byte {
	h, _ := Header([]string{"session", "", "", "", "0"})
	return h
}

// EnvFields is env as a program's header carries it: KEY, VALUE pairs in key order.
func EnvFields(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var fields []string
	for _, k := range keys {
		fields = append(fields, k, env[k])
	}
	return fields
}

// Header joins fields with NUL after ten digits giving the length; it fails if a
// field holds a NUL byte.
func Header(fields []string) ([]byte, error) {
	for _, f := range fields {
		if strings.ContainsRune(f, 0) {
			return nil, fmt.Errorf("the program contains a NUL byte")
		}
	}
	h := strings.Join(fields, "\x00")
	return fmt.Appendf(nil, "%010d%s", len(h), h), nil
}

// ModuleName reports whether name is a dotted Python module name made of ASCII
// identifiers ("matplotlib.pyplot"), as Request.Preimport needs.
func ModuleName(name string) bool {
	for _, part := range strings.Split(name, ".") {
		if part == "" || (part[0] >= '0' && part[0] <= '9') {
			return false
		}
		for _, c := range part {
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}
