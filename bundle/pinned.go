package bundle

// The bytes of the pinned interpreter build. bundle/interpreter/build.sh reproduces
// them exactly (`make interpreter-verify` checks); change them only together with the
// recipe.
const (
	wasmSize     = 8111058
	wasmSHA256   = "9995eb15898f49e57cfb1523867292cd4f5239796a7fa62116e1aa993d2690ac"
	stdlibSize   = 10634439
	stdlibSHA256 = "fcf8a3fe23e2774733f7ff177e8697c1b26dc7a1537bc605109c3141d641711d"
)
