package sandbox

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// A session's saved state, as Session.Save writes it and ResumeSession reads it,
// is a checkpoint file: checkpointMagic, a 4-byte big-endian length, that many
// bytes of a protocol.Checkpoint in JSON, then its body (the non-zero pages of the
// interpreter's memory, checksummed: see protocol.Checkpoint). The
// format is this package's own, not the worker protocol's, so a checkpoint stays
// readable across versions of the protocol; what it holds is one interpreter's
// memory, which only that interpreter can run (the caller keeps track of which).
const checkpointMagic = "sandcell checkpoint 1\n"

// maxCheckpointHeader bounds a checkpoint file's header (its extents and globals).
const maxCheckpointHeader = 4 << 20

// ErrCheckpoint is wrapped by the errors of a checkpoint that cannot be restored:
// not a checkpoint file, malformed, truncated, or past the session's memory limit.
var ErrCheckpoint = errors.New("sandbox: the checkpoint cannot be restored")

// ReadCheckpointHeader reads a checkpoint file's header from r, leaving r at its
// body, and checks it against maxMemory, the memory limit of the session it will
// be restored into. Errors wrap ErrCheckpoint.
func ReadCheckpointHeader(r io.Reader, maxMemory int64) (*protocol.Checkpoint, error) {
	var hdr [len(checkpointMagic) + 4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || string(hdr[:len(checkpointMagic)]) != checkpointMagic {
		return nil, fmt.Errorf("%w: not a checkpoint file", ErrCheckpoint)
	}
	n := binary.BigEndian.Uint32(hdr[len(checkpointMagic):])
	if n > maxCheckpointHeader {
		return nil, fmt.Errorf("%w: a header of %d bytes", ErrCheckpoint, n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	var c protocol.Checkpoint
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	if err := c.Check(maxMemory); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	return &c, nil
}

// writeCheckpointHeader writes c as a checkpoint file's header.
func writeCheckpointHeader(w io.Writer, c *protocol.Checkpoint) error {
	body, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if len(body) > maxCheckpointHeader {
		return fmt.Errorf("a checkpoint header of %d bytes", len(body))
	}
	buf := append([]byte(checkpointMagic), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(buf[len(checkpointMagic):], uint32(len(body)))
	_, err = w.Write(append(buf, body...))
	return err
}

// saveTimeout bounds how long a session's worker may take to send its checkpoint
// (a gibibyte of memory, checksummed and copied: seconds at most).
const saveTimeout = 60 * time.Second

// Save writes the session's state to w as a checkpoint file (see ResumeSession):
// its interpreter as the last cell that ended by itself left it (or as it was
// resumed), without its open files. It returns the bytes written; the session goes
// on. An error of w loses nothing (the worker's checkpoint is read to its end and
// the session stays as it was); a worker that does not send it within saveTimeout
// is killed, and the session lost. Errors: ErrSessionLost, or w's.
func (ss *Session) Save(w io.Writer) (int64, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.lost != "" {
		return 0, fmt.Errorf("%w: %s", ErrSessionLost, ss.lost)
	}
	if ss.native {
		return 0, ErrNoCheckpoint
	}
	if err := protocol.Send(ss.p.ctl, protocol.Frame{Step: protocol.StepSave}); err != nil {
		ss.lose("the worker is gone")
		return 0, fmt.Errorf("%w: the worker is gone", ErrSessionLost)
	}
	type saved struct {
		n          int64
		werr, rerr error
	}
	done := make(chan saved, 1)
	go func() {
		var s saved
		f, err := protocol.Receive(ss.p.ctl, protocol.StepCheckpoint)
		if err == nil {
			err = f.Checkpoint.Check(ss.memory)
		}
		if err != nil {
			done <- saved{rerr: err}
			return
		}
		c := f.Checkpoint
		bw := bufio.NewWriterSize(&countingWriter{w: w, n: &s.n}, 1<<20)
		s.werr = writeCheckpointHeader(bw, c)
		// The whole body is read whatever becomes of w, so that the channel stays
		// in step; a failure of w only ends the writing.
		buf := make([]byte, 1<<20)
		for rest := c.BodyBytes(); rest > 0; {
			chunk := buf[:min(rest, int64(len(buf)))]
			if _, err := io.ReadFull(ss.p.ctl, chunk); err != nil {
				s.rerr = err
				break
			}
			rest -= int64(len(chunk))
			if s.werr == nil {
				_, s.werr = bw.Write(chunk)
			}
		}
		if s.werr == nil {
			s.werr = bw.Flush()
		}
		done <- s
	}()
	t := time.NewTimer(saveTimeout)
	defer t.Stop()
	var s saved
	select {
	case s = <-done:
	case <-t.C:
		ss.p.kill()
		s = <-done
		s.rerr = fmt.Errorf("no checkpoint within %s", saveTimeout)
	}
	if s.rerr != nil {
		ss.lose("its checkpoint could not be read: " + s.rerr.Error())
		ss.p.kill()
		return s.n, fmt.Errorf("%w: its checkpoint could not be read: %v", ErrSessionLost, s.rerr)
	}
	return s.n, s.werr
}

// countingWriter counts what it passes on to w.
type countingWriter struct {
	w io.Writer
	n *int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	*c.n += int64(n)
	return n, err
}
