package api_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/api"
)

// TestListenTCPPerAddress: one client address holds at most perIP connections (more
// are closed at once); a connection closed gives its slot back.
func TestListenTCPPerAddress(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := api.ListenTCP(raw, 10, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	first := <-accepted
	<-accepted
	third := dial()
	third.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a third connection from one address was not closed: %v", err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("a third connection was accepted: %v", c.RemoteAddr())
	default:
	}
	first.Close()
	fourth := dial()
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("a slot given back was not reused")
	}
	for _, c := range []net.Conn{a, b, third, fourth} {
		c.Close()
	}
}
