package api_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/workspace"
)

// A run's /tmp shares its workspace's quota: the guest's shutil.disk_usage says so
// (the quota, what /ws and /tmp hold), /tmp alone cannot grow past it (its tmpfs is
// no larger), and a run whose /ws and /tmp together pass it is ended quota_exceeded
// as one whose /ws alone does, cold or warm.
func TestTmpCountsAgainstTheQuota(t *testing.T) {
	for _, pool := range []int{0, 1} {
		t.Run(fmt.Sprintf("pool %d", pool), func(t *testing.T) {
			d := start(t, setup{quota: workspace.Quota{Bytes: 1 << 20, Files: 100}, pool: pool})
			v := d.run(t, `{"code":"import shutil\nprint(*shutil.disk_usage('/ws'))\n`+
				`try:\n  for n in 'ab':\n    open('/tmp/' + n, 'wb').write(b'x' * (700 << 10))\nexcept OSError as e:\n  print(e.strerror)\n`+
				`import os\nfor n in 'ab': os.remove('/tmp/' + n)\nprint(*shutil.disk_usage('/tmp'))"}`)
			if out := string(v.Result.Stdout); v.Result.Reason != protocol.Exited ||
				out != "1048576 0 1048576\nNo space left on device\n1048576 0 1048576\n" {
				t.Fatalf("%s %q %q", v.Result.Reason, out, v.Result.Stderr)
			}
			v = d.run(t, `{"code":"import time\nopen('/ws/a', 'wb').write(b'x' * (600 << 10))\n`+
				`open('/tmp/b', 'wb').write(b'x' * (600 << 10))\ntime.sleep(15)","limits":{"timeout_ms":20000}}`)
			r := v.Result
			if r.Reason != protocol.QuotaExceeded || r.ElapsedMS > 10000 || len(r.Diagnostics) != 1 ||
				!strings.Contains(r.Diagnostics[0], "past its quota") {
				t.Fatalf("%s after %.0f ms, %v, stderr %q", r.Reason, r.ElapsedMS, r.Diagnostics, r.Stderr)
			}
		})
	}
}
