package bundle

// The bytes of the pinned interpreter build. bundle/interpreter/build.sh reproduces
// them exactly (`make interpreter-verify` checks); change them only together with the
// recipe.
const (
	wasmSize     = 11043739
	wasmSHA256   = "080c98d3aaaad22bacd9269635fc49fc7b6b8815f2aebec59629bcbd4efce7bd"
	stdlibSize   = 10634439
	stdlibSHA256 = "fcf8a3fe23e2774733f7ff177e8697c1b26dc7a1537bc605109c3141d641711d"
)
