package bundle

// The bytes of the pinned interpreter build. bundle/interpreter/build.sh reproduces
// them exactly (`make interpreter-verify` checks); change them only together with the
// recipe.
const (
	wasmSize     = 11043739
	wasmSHA256   = "06871bd59d19530be4b99562728b31efa694b80f98f7a528bdb87cfb8855502f"
	stdlibSize   = 10634439
	stdlibSHA256 = "fcf8a3fe23e2774733f7ff177e8697c1b26dc7a1537bc605109c3141d641711d"
)

// SnapshotSHA256 is the SHA-256 of the snapshot of the pinned python.wasm and library
// made with hash seed 0 by this build's bootstrap (Bundle.SnapshotWasm). A snapshot is
// a function of those inputs alone; a test checks these bytes, and `make
// interpreter-verify` checks them for a freshly built python.wasm. Change it together
// with bootstrap.py.
const SnapshotSHA256 = "ba44a8ad985bb39c99f83d7b0b614cb59262a01415fe41930f0c03a8faa76e49"
