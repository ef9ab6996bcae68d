package api_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandcell/sandcell/supervisor/api"
)

// TestListenTCPPerAddress: one client address holds at most perIP ordinary
// connections; more are kept for the health endpoints (probe slots, four per
// address), and past those closed at once; a connection closed gives its slot back.
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
	var dialed []net.Conn
	defer func() {
		for _, c := range dialed {
			c.Close()
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		dialed = append(dialed, c)
		return c
	}
	probeOnly := func(c net.Conn) bool {
		return api.ProbeOnly(api.ConnContext(context.Background(), c))
	}
	var first net.Conn
	for i := 0; i < 6; i++ {
		dial()
		select {
		case c := <-accepted:
			if want := i >= 2; probeOnly(c) != want {
				t.Fatalf("connection %d from one address: probe only %v, want %v", i+1, probeOnly(c), want)
			}
			if i == 0 {
				first = c
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("connection %d from one address was not accepted", i+1)
		}
	}
	seventh := dial()
	seventh.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := seventh.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a seventh connection from one address was not closed: %v", err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("a seventh connection was accepted: %v", c.RemoteAddr())
	default:
	}
	first.Close()
	dial()
	select {
	case c := <-accepted:
		if probeOnly(c) {
			t.Fatal("an ordinary slot given back was reused as a probe slot")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a slot given back was not reused")
	}
}
