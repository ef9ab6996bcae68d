package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/engine"
)

func newBundleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Install, verify and precompile the pinned python.wasm",
	}
	var dir string
	cmd.PersistentFlags().StringVar(&dir, "dir", defaultBundleDir(), "bundle directory")

	install := &cobra.Command{
		Use:   "install BUILD_DIR",
		Short: "Verify an interpreter build (python.wasm, python313.zip, site.zip) against the pinned hashes and install it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := bundle.Install(args[0], dir); err != nil {
				return err
			}
			fmt.Printf("installed CPython %s (python.wasm sha256 %s) in %s\n", bundle.Pinned().Version, bundle.Pinned().Wasm.SHA256, dir)
			return nil
		},
	}
	var variant, into string
	precompile := &cobra.Command{
		Use:   "precompile",
		Short: "Snapshot python.wasm and compile the snapshot to .cwasm in the bundle directory for each engine variant (plain, fuel-metered and epochless)",
		Long: `Make the snapshot of python.wasm (the interpreter initialised once, with the
directory's hash seed: see the hash-seed file, drawn at random when absent) and
compile it to .cwasm in the bundle directory for each engine variant: "plain"
(epoch interruption: sessions), "fuel" (fuel metering) and "epochless" (neither:
runs without fuel, whose CPU limit ends the worker), or only the one --variant names; a
variant without its .cwasm is compiled into the cache directory when first needed.
With --into, each variant is compiled afresh into that directory instead, with its
hash seed (a new one where it has none), whatever the bundle holds: the daemon
makes each new hash secret's modules this way (bundle.hash_secret_rotation, through
the hidden verb bundle.PrecompileCommand).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			variants, err := parseVariants(variant)
			if err != nil {
				return err
			}
			b, err := bundle.Open(dir)
			if err != nil {
				return err
			}
			if err := b.Verify(); err != nil {
				return err
			}
			for _, v := range variants {
				if into != "" {
					p, err := b.Precompile(engine.New(v.Options()), into)
					if err != nil {
						return err
					}
					fmt.Printf("%s: compiled (%s)\n", p, v)
					continue
				}
				pre, err := b.Precompiled(engine.New(v.Options()), dir)
				if err != nil {
					return err
				}
				state := "up to date"
				if pre.Rebuilt {
					state = "compiled"
				}
				fmt.Printf("%s: %s (%s)\n", pre.Path, state, v)
			}
			return nil
		},
	}
	precompile.Flags().StringVar(&variant, "variant", "all", `engine variants to compile: "plain", "fuel", "epochless" or "all"`)
	precompile.Flags().StringVar(&into, "into", "", "compile afresh into this directory, with its own hash seed")
	var all, snapshot bool
	var native string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check python.wasm, MANIFEST, every .cwasm present and the native root (--snapshot: and the snapshot's bytes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if native != "if-present" && native != "required" && native != "never" {
				return fmt.Errorf("--native %q: if-present, required or never", native)
			}
			b, err := bundle.Open(dir)
			if err != nil {
				return err
			}
			if err := b.Verify(); err != nil {
				return err
			}
			fmt.Printf("%s: CPython %s python.wasm, %s and the site layer (%s) ok\n", b.Dir, bundle.Pinned().Version, bundle.Pinned().Stdlib.Name, bundle.Pinned().Site.Name)
			if snapshot {
				var sums [2][32]byte
				for i := range sums {
					snap, err := b.SnapshotWasm(engine.New(engine.Options{}), 0)
					if err != nil {
						return err
					}
					sums[i] = sha256.Sum256(snap)
				}
				if sums[0] != sums[1] {
					return fmt.Errorf("%w: two snapshots with hash seed 0 differ (sha256 %x and %x)", bundle.ErrMismatch, sums[0], sums[1])
				}
				fmt.Printf("%s: the snapshot with hash seed 0 is reproducible (sha256 %x)\n", b.Dir, sums[0])
			}
			for _, v := range engine.Variants() {
				e := engine.New(v.Options())
				key := bundle.Key(e.Fingerprint(), bundle.Pinned().Wasm.SHA256)
				p := filepath.Join(b.Dir, bundle.PrecompiledName(key))
				err := bundle.CheckPrecompiled(e, p, key)
				if errors.Is(err, os.ErrNotExist) {
					if _, serr := os.Stat(filepath.Join(b.Dir, bundle.CompressedName(key))); serr == nil {
						// Unpacked into a scratch directory: the same checks as at start.
						tmp, terr := os.MkdirTemp("", "sandcell-verify-")
						if terr != nil {
							return terr
						}
						_, err = b.Unpack(e, key, tmp)
						os.RemoveAll(tmp)
						p = filepath.Join(b.Dir, bundle.CompressedName(key))
					} else if !all {
						fmt.Printf("%s: absent, compiled into the cache when first needed (%s)\n", p, v)
						continue
					}
				}
				if err != nil {
					return err
				}
				fmt.Printf("%s: ok (%s)\n", p, v)
			}
			if native == "never" {
				return nil
			}
			root, err := bundle.OpenNative(b.Dir)
			switch {
			case errors.Is(err, bundle.ErrNoNative) && native == "if-present":
				fmt.Printf("%s: no native root (the wasm backend alone; make native installs one)\n", filepath.Join(b.Dir, bundle.NativeDir))
				return nil
			case err != nil:
				return err
			}
			fmt.Printf("%s: native root ok: %d entries, %d MiB, every file as its manifest (sha256 %s) says\n",
				root.Dir, root.Entries, root.Bytes>>20, root.ManifestSHA256)
			return nil
		},
	}
	verify.Flags().BoolVar(&all, "all", true, "fail unless every variant has its .cwasm (or its compressed form)")
	verify.Flags().StringVar(&native, "native", "if-present", "the native root: if-present (verify it where the bundle has one), required, or never")
	verify.Flags().BoolVar(&snapshot, "snapshot", false, "also make the snapshot with hash seed 0 twice and check the two are the same bytes (seconds)")
	cmd.AddCommand(install, precompile, verify)
	return cmd
}

// parseVariants maps a --variant value to the engine variants it names.
func parseVariants(v string) ([]engine.Variant, error) {
	if v == "all" {
		return engine.Variants(), nil
	}
	if slices.Contains(engine.Variants(), engine.Variant(v)) {
		return []engine.Variant{engine.Variant(v)}, nil
	}
	return nil, fmt.Errorf("--variant %q: want plain, fuel, epochless or all", v)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the wasmtime release and the pinned interpreter",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			p := bundle.Pinned()
			fmt.Printf("sandcell %s (revision %s)\nwasmtime %s\nCPython %s for WASI: %s\n  %s sha256 %s\n  %s sha256 %s\n",
				version, revision, engine.WasmtimeVersion, p.Version, p.Build, p.Wasm.Name, p.Wasm.SHA256, p.Stdlib.Name, p.Stdlib.SHA256)
			if len(leanWorker) > 0 {
				sum := sha256.Sum256(leanWorker)
				fmt.Printf("worker: the lean worker this binary carries (%d bytes, sha256 %x), run from a sealed memfd\n", len(leanWorker), sum)
			} else {
				fmt.Println("worker: this binary, re-executed (built without the leanworker tag)")
			}
		},
	}
}

// precompileMain is the hidden verb bundle.PrecompileCommand: `sandcell __precompile
// BUNDLE_DIR INTO_DIR`, which the daemon runs to make a new hash secret's modules
// (`bundle precompile --dir BUNDLE_DIR --into INTO_DIR`), dispatched before the CLI as
// the worker is: the daemon gives it no environment.
func precompileMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: sandcell %s BUNDLE_DIR INTO_DIR\n", bundle.PrecompileCommand)
		return exitUsage
	}
	// When memory runs out, the kernel kills this compile (430-500 MB at its peak) before
	// the daemon, which tries again later (proc(5): raising one's own score needs no
	// privilege).
	os.WriteFile("/proc/self/oom_score_adj", []byte("500"), 0)
	return execute([]string{"bundle", "precompile", "--dir", args[0], "--into", args[1]})
}
