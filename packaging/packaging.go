// Package packaging holds the files the packages install, embedded where the binary
// needs them: the commented default configuration (`sandcell config default`).
package packaging

import _ "embed"

// DefaultConfig is packaging/sandcell.toml, installed as /etc/sandcell/sandcell.toml.
//
//go:embed sandcell.toml
var DefaultConfig string
