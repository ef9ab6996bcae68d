// Package packaging holds the files the packages install, embedded where the binary
// needs them: the commented default configuration (`sandcell config default`).
package packaging

import _ "embed"

//go:embed sandcell.toml
var defaultConfig string

// DefaultConfig returns packaging/sandcell.toml, installed as /etc/sandcell/sandcell.toml.
func DefaultConfig() string { return defaultConfig }
