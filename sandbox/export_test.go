package sandbox

import "time"

// WithoutPidNamespace makes s start workers without a pid namespace of their own, as
// it does where its probe finds that a procfs cannot be mounted (a container's
// masked /proc), and gives why as the reason in the contract.
func WithoutPidNamespace(s *Spawner, why string) {
	s.pidProbe.Lock()
	defer s.pidProbe.Unlock()
	s.pidProbed = true
	s.pidnsErr.Store(&why)
}

// PrepareDespiteMatplotlibrc makes s prepare warm native workers for workspaces
// holding a matplotlibrc too (it does not: their runs are served cold), so that a
// test can show that such a worker's imports read nothing of the workspace's.
func PrepareDespiteMatplotlibrc(s *Spawner) {
	s.native.mu.Lock()
	defer s.native.mu.Unlock()
	s.native.anyRC = true
}

// SetSessionCPU sets the CPU time in all the daemon keeps a native session with
// checkpoints to (SessionCPU), until the returned func restores it. Tests that
// call it must not run in parallel.
func SetSessionCPU(d time.Duration) (restore func()) {
	old := sessionCPU
	sessionCPU = d
	return func() { sessionCPU = old }
}
