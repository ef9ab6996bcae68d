package sandbox

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
