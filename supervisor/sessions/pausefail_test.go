package sessions

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// A failed pause holds off the next one: a checkpoint that could not be written is
// tried again after 1 minute, then 2, 4, ... at most an hour apart; one past its
// caller's bound only when the caller's paused sessions leave it what it needed
// (never while that is past the bound itself). Each failure is counted and logged
// once.
func TestPauseFailureHoldsOff(t *testing.T) {
	var log bytes.Buffer
	m, err := New(nil, Options{Max: 4, MaxPerCaller: 4, IdleTimeout: time.Hour,
		MaxPausedBytesPerCaller: 100, Log: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s := &Session{ID: "a", Caller: identity.Caller{UID: 1000}}
	m.live[s.ID] = s
	if !m.pauseDue(s) {
		t.Fatal("a session that never failed to pause is not due")
	}
	full := errors.New("write checkpoint.tmp: no space left on device")
	for i, wait := range []time.Duration{1, 2, 4, 8, 16, 32, 60, 60} {
		m.pauseFailed(s, wire.PauseWriteFailed, full, 0)
		f := s.failed
		if f.Failures != i+1 || f.NextTryAt == nil || f.NextTryAt.Sub(f.At) != wait*time.Minute || f.Error != full.Error() {
			t.Fatalf("failure %d: %+v, want the next try %s after it", i+1, f, wait*time.Minute)
		}
		if m.pauseDue(s) {
			t.Fatalf("failure %d: due at once", i+1)
		}
	}
	past := *s.failed
	at := time.Now().Add(-time.Second)
	past.NextTryAt = &at
	s.failed = &past
	if !m.pauseDue(s) {
		t.Fatal("not due once its backoff has passed")
	}
	if n := m.PauseFailures(wire.PauseWriteFailed); n != 8 {
		t.Fatalf("write failures counted: %d", n)
	}
	if n := strings.Count(log.String(), "a session could not be paused"); n != 8 {
		t.Fatalf("%d log lines for 8 failures:\n%s", n, log.String())
	}

	// Past the bound beside another paused session of its caller: due when that
	// one goes.
	other := &Session{ID: "b", Caller: s.Caller, paused: true, saved: 50}
	stranger := &Session{ID: "c", Caller: identity.Caller{UID: 1001}, paused: true, saved: 90}
	m.live[other.ID], m.live[stranger.ID] = other, stranger
	m.pauseFailed(s, wire.PauseOverBound, errPauseRoom, 60)
	if f := s.failed; f.Failures != 1 || f.NextTryAt != nil || f.NeedBytes != 60 || m.pauseDue(s) {
		t.Fatalf("past the bound beside another paused session: %+v, due %v", f, m.pauseDue(s))
	}
	delete(m.live, other.ID)
	if !m.pauseDue(s) {
		t.Fatal("not due once its caller's paused sessions leave it the room")
	}
	// Past the bound alone: never due (until a cell forgets the failure).
	m.pauseFailed(s, wire.PauseOverBound, errPauseRoom, 150)
	if f := s.failed; f.Failures != 2 || m.pauseDue(s) {
		t.Fatalf("past the bound alone: %+v, due %v", f, m.pauseDue(s))
	}
	if n := m.PauseFailures(wire.PauseOverBound); n != 2 {
		t.Fatalf("bound failures counted: %d", n)
	}
	if !strings.Contains(log.String(), "need_bytes=150") || !strings.Contains(log.String(), "uid=1000") {
		t.Fatalf("the log does not say what was needed, or whose:\n%s", log.String())
	}
}
