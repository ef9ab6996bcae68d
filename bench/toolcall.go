package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandcell/sandcell/bench/harness"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// toolCalls is how many calls each timed program makes.
const toolCalls = 200

// toolCallTable measures the round trip of one read call of a guest's (code mode):
// the reference "everything" server's echo, declared as [tools.every], called
// toolCalls times from a program on each backend, against the same server called
// as often directly by an MCP client here. Sandcell's own cost of a call is the
// difference: the guest's channel, the worker, the broker's checks and its audit
// record (goal: under 1 ms).
func toolCallTable(bin, bundleDir, dir string) error {
	server, err := filepath.Abs("test/mcp-client/node_modules/.bin/mcp-server-everything")
	if err == nil {
		_, err = os.Stat(server)
	}
	if err != nil {
		fmt.Printf("\ntool call round trip: skipped, the reference MCP server is not installed (make mcp-client): %v\n", err)
		return nil
	}
	direct, err := directCalls(server)
	if err != nil {
		return err
	}
	d, err := harness.Start(bin, filepath.Join(dir, "tools"), harness.Config(os.Getuid(),
		fmt.Sprintf("[tools.every]\ncommand = [%q]\nallow = [\"echo\"]\n", server)),
		"SANDCELL_BUNDLE_DIR="+bundleDir, "SANDCELL_BUNDLE_HASH_SECRET_ROTATION=0")
	if err != nil {
		return err
	}
	defer d.Stop()
	fmt.Printf("\ntool call round trip (the everything server's echo, %d calls a program; median of 3):\n", toolCalls)
	fmt.Printf("  %-34s %8.3f ms a call\n", "MCP client here, directly", ms(direct))
	for _, backend := range []string{"wasm", "native"} {
		per, err := guestCalls(d, backend)
		if err != nil {
			fmt.Printf("  %-34s skipped: %v\n", "from a guest ("+backend+")", err)
			continue
		}
		fmt.Printf("  %-34s %8.3f ms a call; Sandcell's own %.3f ms (goal < 1 ms)\n", "from a guest ("+backend+")", ms(per), ms(per-direct))
	}
	return nil
}

// directCalls is the median over 3 rounds of one call's time, toolCalls calls a
// round, of server's echo from a client here.
func directCalls(server string) (time.Duration, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: exec.Command(server)}, nil)
	if err != nil {
		return 0, err
	}
	defer cs.Close()
	return median3(func() (time.Duration, error) {
		t := time.Now()
		for range toolCalls {
			if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "x"}}); err != nil {
				return 0, err
			}
		}
		return time.Since(t) / toolCalls, nil
	})
}

// guestCalls is the median over 3 rounds of one call's time from a program on
// backend: a run making toolCalls+1 calls less one making 1 (the server's
// connection, the list, the run itself), over toolCalls.
func guestCalls(d *harness.Daemon, backend string) (time.Duration, error) {
	run := func(n int) (time.Duration, error) {
		code := "from sandcell.tools import every\nfor i in range(" + strconv.Itoa(n) + "):\n    every.echo(message='x')\n"
		t := time.Now()
		v, err := d.Client.Run(context.Background(), wire.RunRequest{Code: code, Backend: backend})
		if err != nil {
			return 0, err
		}
		if v.Result == nil || v.Result.Reason != "exited" || v.Result.ExitCode != 0 {
			return 0, fmt.Errorf("the program: %+v", v.Result)
		}
		return time.Since(t), nil
	}
	return median3(func() (time.Duration, error) {
		one, err := run(1)
		if err != nil {
			return 0, err
		}
		many, err := run(toolCalls + 1)
		if err != nil {
			return 0, err
		}
		return (many - one) / toolCalls, nil
	})
}

func median3(f func() (time.Duration, error)) (time.Duration, error) {
	var ds []time.Duration
	for range 3 {
		d, err := f()
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[1], nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
