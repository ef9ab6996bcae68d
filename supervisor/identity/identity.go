// Package identity is who acts on the daemon: the caller of a request (a local
// process's uid, or a bearer token's name over TCP) and the daemon itself. It is
// the leaf the daemon's concerns share (runs, sessions, approvals, audit, the
// API): it imports nothing of Sandcell's, and nothing of theirs belongs in it.
package identity

import "os"

// Caller is who starts a run, opens a session, asks for or decides an approval: a
// local process's uid (SO_PEERCRED), or, over TCP, the name of the bearer token it
// presented (UID -1). Only the same caller (or an admin) sees what it started. As
// JSON (an approval's requester, a saved session's record): {"UID": N, "Token": S}.
type Caller struct {
	UID   int
	Token string
}

// Daemon is the daemon itself as the actor of an audit record (its start, reloads,
// pruning): its own uid.
func Daemon() Caller { return Caller{UID: os.Getuid()} }
