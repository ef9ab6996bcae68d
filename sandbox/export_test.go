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
