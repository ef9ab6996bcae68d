package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad reads fuzzed configuration files and SANDCELL_* values: never a panic,
// and what is accepted validates.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("[limits]\ntimeout = \"30s\"\n"), "SANDCELL_LIMITS_TIMEOUT=1s")
	f.Add([]byte("[sessions]\nmax = 8\npause_after = \"5m\"\nmemory_budget = \"2GiB\"\n"), "")
	f.Add([]byte("[state]\ndir = \"/var/lib/sandcell\"\n[[x]]\n"), "SANDCELL_STATE_DIR=")
	f.Add([]byte("unknown = 1\n"), "SANDCELL_SESSIONS_MAX=-1")
	f.Add([]byte("[limits]\nmemory = \"1e400\"\n"), "SANDCELL_LIMITS_MEMORY=99999999999999999999GiB")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, file []byte, env string) {
		p := filepath.Join(dir, "sandcell.toml")
		if err := os.WriteFile(p, file, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p, []string{env})
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted %q (env %q), which does not validate: %v", file, env, err)
		}
	})
}
