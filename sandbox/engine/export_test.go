package engine

// NewWithoutEpoch returns an engine with epoch interruption off, for benchmarks that
// measure what the epoch checks cost.
func NewWithoutEpoch() *Engine { return New(Options{noEpoch: true}) }
