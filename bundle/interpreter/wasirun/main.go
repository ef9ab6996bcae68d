// Command wasirun runs a WASI preview1 command module with host directories mapped in,
// as `wasmtime run` would. It is the host runner of the interpreter build (Debian has
// no wasmtime command): CPython's Tools/wasm/wasi.py calls it to run the python.wasm it
// is building. It is a build tool with full access to the directories it is given and
// is never installed.
//
// Usage: wasirun [--dir HOST::GUEST]... [--env NAME=VALUE]... MODULE.wasm [ARGS...]
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

func main() {
	var spec engine.Spec
	spec.Env = map[string]string{}
	args := os.Args[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "--") {
		flag, val := args[0], ""
		if k, v, ok := strings.Cut(flag, "="); ok {
			flag, val = k, v
			args = args[1:]
		} else if len(args) > 1 {
			val = args[1]
			args = args[2:]
		} else {
			fail("flag %s needs a value", flag)
		}
		switch flag {
		case "--dir":
			host, guest, ok := strings.Cut(val, "::")
			if !ok {
				guest = host
			}
			spec.Preopens = append(spec.Preopens, engine.Preopen{Host: host, Guest: guest})
		case "--env":
			k, v, _ := strings.Cut(val, "=")
			spec.Env[k] = v
		default:
			fail("unknown flag %s", flag)
		}
	}
	if len(args) == 0 {
		fail("usage: wasirun [--dir HOST::GUEST]... [--env NAME=VALUE]... MODULE.wasm [ARGS...]")
	}
	wasm, err := os.ReadFile(args[0])
	if err != nil {
		fail("%v", err)
	}
	e := engine.New(engine.Options{})
	mod, err := e.Compile(wasm)
	if err != nil {
		fail("%v", err)
	}
	spec.Argv = args
	spec.InheritStdin = true
	spec.MemoryBytes = 4 << 30
	out := e.Run(mod, spec)
	if out.Reason != protocol.Exited {
		fail("%s: %v", out.Reason, out.Diagnostics)
	}
	os.Exit(out.ExitCode)
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "wasirun: "+format+"\n", a...)
	os.Exit(125)
}
