package bundle

// The bytes of the pinned interpreter build. bundle/interpreter/build.sh reproduces
// them exactly (`make interpreter-verify` checks); change them only together with the
// recipe.
const (
	wasmSize     = 11053266
	wasmSHA256   = "109daf841d4cc0c3ef128137a8ea056e4c69bfb5527035db4bd81398e2218e86"
	stdlibSize   = 10634439
	stdlibSHA256 = "fcf8a3fe23e2774733f7ff177e8697c1b26dc7a1537bc605109c3141d641711d"
)
