package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// SendFile is Send for a frame that carries an open file (SCM_RIGHTS) to the other
// end of conn, a Unix stream socket: a native session's worker sends its seccomp
// listener with its contract (StepExec), so that the interpreter it becomes never
// holds it. file stays open here; the caller closes it.
func SendFile(conn *os.File, f Frame, file *os.File) error {
	buf, err := Encode(f)
	if err != nil {
		return err
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("protocol: send file: %w", err)
	}
	n, serr := 0, error(nil)
	if err := rc.Write(func(fd uintptr) bool {
		n, serr = unix.SendmsgN(int(fd), buf, unix.UnixRights(int(file.Fd())), nil, 0)
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return fmt.Errorf("protocol: send file: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("protocol: send file: %w", serr)
	}
	if _, err := conn.Write(buf[n:]); err != nil {
		return fmt.Errorf("protocol: write frame: %w", err)
	}
	return nil
}

// ReceiveFile is ReceiveMax for a frame that may carry a file (SendFile) on conn, a
// Unix stream socket: it returns the file too, or nil when the frame carries none.
// Files arrive with a frame's first bytes, which only this reads with their
// ancillary data (a plain read discards them, and the kernel closes them): a file
// anything else sends is never received.
func ReceiveFile(conn *os.File, max int, want ...Step) (Frame, *os.File, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return Frame{}, nil, fmt.Errorf("protocol: receive file: %w", err)
	}
	head, oob := make([]byte, 4), make([]byte, unix.CmsgSpace(4*4))
	var n, oobn int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), head, oob, unix.MSG_CMSG_CLOEXEC)
		return !errors.Is(rerr, unix.EAGAIN)
	}); err != nil {
		return Frame{}, nil, fmt.Errorf("protocol: receive file: %w", err)
	}
	if rerr != nil {
		return Frame{}, nil, fmt.Errorf("protocol: receive file: %w", rerr)
	}
	if n == 0 {
		return Frame{}, nil, io.EOF
	}
	var files []*os.File
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), "received"))
			}
		}
	}
	f, err := ReceiveMax(io.MultiReader(bytes.NewReader(head[:n]), conn), max, want...)
	if err != nil || len(files) > 1 {
		for _, file := range files {
			file.Close()
		}
		if err == nil {
			err = fmt.Errorf("%w: a frame carried %d files, at most one", ErrStep, len(files))
		}
		return f, nil, err
	}
	if len(files) == 0 {
		return f, nil, nil
	}
	return f, files[0], nil
}
