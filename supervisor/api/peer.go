package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/identity"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// Role is what a caller may do.
type Role string

// The roles: runners start runs and statements, approvers decide approvals, and an
// admin may do everything.
const (
	RoleRunner   Role = "runner"
	RoleApprover Role = "approver"
	RoleAdmin    Role = "admin"
)

// Peer is the process at the other end of a Unix socket connection, from SO_PEERCRED
// (unix(7)).
//
// A caller over TCP has no credentials: it is identified by the name of the bearer
// token it presented (Token), with UID, GID and PID -1.
type Peer struct {
	PID, UID, GID int
	// Groups are the peer's supplementary groups, read from /proc/PID/status when
	// the process is still there.
	Groups []int
	// Token is the name of the bearer token of a TCP caller; empty for Unix peers.
	Token string
}

// Caller is the identity runs and workspaces are owned by.
func (p Peer) Caller() identity.Caller { return identity.Caller{UID: p.UID, Token: p.Token} }

type peerKey struct{}

// connKey holds a request's *limitedConn, so that presenting a valid token marks it.
type connKey struct{}

// authenticated marks the connection of ctx's request as carrying a known caller: it
// keeps the ordinary idle timeout from then on.
func authenticated(ctx context.Context) {
	if lc, ok := ctx.Value(connKey{}).(*limitedConn); ok && !lc.probe {
		lc.authenticated.Store(true)
	}
}

// ConnContext stores the peer's credentials in the context of every request on c;
// it is http.Server.ConnContext of the API's server. c is a connection from Listen,
// or a *net.UnixConn.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if lc := connOf(c); lc != nil {
		ctx = context.WithValue(ctx, connKey{}, lc)
	}
	if pc, ok := c.(*peerConn); ok {
		return context.WithValue(ctx, peerKey{}, pc.peer)
	}
	if uc, ok := c.(*net.UnixConn); ok {
		if p, ok := peerOf(uc); ok {
			return context.WithValue(ctx, peerKey{}, p)
		}
	}
	return ctx
}

// peerOf reads SO_PEERCRED of uc (unix(7)) and the peer's supplementary groups.
func peerOf(uc *net.UnixConn) (Peer, bool) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, false
	}
	var cred *unix.Ucred
	var cerr, gerr error
	var groups []int
	raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		groups, gerr = peerGroups(int(fd))
	})
	if cerr != nil || cred == nil {
		return Peer{}, false
	}
	p := Peer{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid), Groups: groups}
	if gerr != nil {
		// Kernels before 4.13: the groups of the process, if it is still there.
		p.Groups = supplementaryGroups(p.PID)
	}
	return p, true
}

// peerGroups reads SO_PEERGROUPS (unix(7), Linux 4.13): the peer's supplementary
// groups as they were at connect(2), an array of 32-bit gids. Unlike
// /proc/PID/status it needs no access to the peer's process (systemd's
// ProtectProc=invisible hides it) and cannot race with the peer's exit.
func peerGroups(fd int) ([]int, error) {
	buf := make([]uint32, 64)
	for {
		size := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno == unix.ERANGE && int(size/4) > len(buf) {
			buf = make([]uint32, size/4) // the kernel said how many there are
			continue
		}
		if errno != 0 {
			return nil, errno
		}
		groups := make([]int, size/4)
		for i := range groups {
			groups[i] = int(buf[i])
		}
		return groups, nil
	}
}

// Listen wraps l so that at most max connections are open at once, at most perUID of
// them from one uid (more are kept for the health endpoints while probe slots last,
// and else answered 429 connection_limit and closed, so one user cannot take every
// slot nor silence its probes; see connLimit.admit), and each carries its peer's credentials, read once at
// accept. At the bound, the connection idle the longest is closed to make room (see
// connLimit.take).
func Listen(l *net.UnixListener, max, perUID int) net.Listener {
	return &peerListener{UnixListener: l, limit: newConnLimit[int](max, perUID)}
}

type peerListener struct {
	*net.UnixListener
	limit *connLimit[int]
}

// Connection bounds that hold whatever other clients do.
const (
	// unauthenticatedIdle is how long a TCP connection that has not presented a
	// valid bearer token may stay idle (a probe's, or a stranger's): such
	// connections cannot pile up and hold the slots the probes need.
	unauthenticatedIdle = 5 * time.Second
	// slotWait is how long a new connection waits for a slot at the bound when no
	// connection is idle to be closed for it; then it is closed.
	slotWait = time.Second
	// probeSlots are kept beyond the bound for the health endpoints: a connection
	// that finds every other one in the middle of a request (callers with valid
	// access sending bodies slowly on all of them, say) takes one of these, and on it
	// only /livez, /healthz and /readyz are answered, each connection closed after
	// its answer. So nothing any caller holds keeps the probes waiting.
	probeSlots = 8
	// probeSlotsPerKey bound the probe slots of one key (a client address, a uid),
	// and a probe connection younger than probeGrace is not closed for another (a
	// prober's TLS handshake and request take milliseconds): a flood of new
	// connections from one address cannot close every prober's before it asks.
	probeSlotsPerKey = 4
	probeGrace       = time.Second
)

// connLimit counts open connections: at most max in all, at most per from one key
// (a uid, a client address). It knows which are idle (ConnState), so a new
// connection at the bound is never kept waiting behind idle keep-alive connections:
// the one idle the longest is closed for it (an HTTP client reopens an idle
// connection the server closed, RFC 9112 section 9.5).
type connLimit[K comparable] struct {
	slots  chan struct{}
	probes chan struct{} // probeSlots more, for the health endpoints only
	per    int

	mu     sync.Mutex
	open   map[K]int
	probed map[K]int          // probe slots held, by key
	conns  map[*limitedConn]K // every admitted connection, with its key
}

func newConnLimit[K comparable](max, per int) *connLimit[K] {
	return &connLimit[K]{slots: make(chan struct{}, max), probes: make(chan struct{}, probeSlots), per: per,
		open: map[K]int{}, probed: map[K]int{}, conns: map[*limitedConn]K{}}
}

// take takes a slot: at once when one is free; at the bound, by closing the
// connection idle the longest. When every connection is in the middle of a request
// it takes a probe slot (probe true), closing the probe connection idle the longest
// if need be, and else waits up to slotWait for either. It reports false when no
// slot came.
func (l *connLimit[K]) take() (probe, ok bool) {
	if try(l.slots) {
		return false, true
	}
	if oldest := l.oldestIdle(false); oldest != nil {
		oldest.Close() // gives its slot back at once, unless another taker has it first
		if try(l.slots) {
			return false, true
		}
	} else {
		if try(l.probes) {
			return true, true
		}
		if oldest := l.oldestIdle(true); oldest != nil {
			oldest.Close()
			if try(l.probes) {
				return true, true
			}
		}
	}
	t := time.NewTimer(slotWait)
	defer t.Stop()
	tick := time.NewTicker(probeGrace / 20)
	defer tick.Stop()
	for {
		select {
		case l.slots <- struct{}{}:
			return false, true
		case l.probes <- struct{}{}:
			return true, true
		case <-tick.C:
			// A probe connection may have grown old enough to be closed for this one.
			if oldest := l.oldestIdle(true); oldest != nil {
				oldest.Close()
			}
		case <-t.C:
			return false, false
		}
	}
}

// try takes a slot of slots if one is free.
func try(slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// oldestIdle is the connection (an ordinary one, or one on a probe slot and older
// than probeGrace) idle the longest, or nil when none is.
func (l *connLimit[K]) oldestIdle(probe bool) *limitedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var oldest *limitedConn
	var since int64
	for c := range l.conns {
		if probe && time.Since(c.opened) < probeGrace {
			continue
		}
		if t := c.idleSince.Load(); t != 0 && c.probe == probe && (oldest == nil || t < since) {
			oldest, since = c, t
		}
	}
	return oldest
}

// admit counts c, from key, in the slot taken by take. A key that already has per
// open ordinary connections gets a probe slot instead when one is free (its slot
// given back): only the health endpoints are answered on it, so a caller that holds
// every connection its uid or address may have does not make the probes of that
// uid or address (a kubelet's, systemd's) fail. A key at its probeSlotsPerKey has
// its own probe connection idle the longest (and older than probeGrace) closed for
// the new one, so its idle connections cannot hold its probe slots either. Else the
// slot is given back and admit reports false.
func (l *connLimit[K]) admit(key K, c *limitedConn) bool {
	for retry := true; ; retry = false {
		ok, idle := l.tryAdmit(key, c)
		if ok {
			return true
		}
		if idle == nil || !retry {
			l.give(c.probe)
			return false
		}
		idle.Close() // gives its probe slot back (release)
	}
}

// tryAdmit is one try of admit: it counts c, or reports the probe connection of key
// that admit may close to make room for it (or nil).
func (l *connLimit[K]) tryAdmit(key K, c *limitedConn) (bool, *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.probe && l.open[key] >= l.per {
		if l.probed[key] >= probeSlotsPerKey {
			return false, l.idleProbeLocked(key)
		}
		if !try(l.probes) {
			return false, nil
		}
		l.give(false)
		c.probe = true
		c.authenticated.Store(false)
	}
	// A probe slot is held for one health request at most (or while idle, until
	// another probe closes it): a key has probeSlotsPerKey of them.
	if c.probe && l.probed[key] >= probeSlotsPerKey {
		return false, l.idleProbeLocked(key)
	}
	if c.probe {
		l.probed[key]++
	} else {
		l.open[key]++
	}
	l.conns[c] = key
	c.release = func() { l.release(key, c) }
	return true, nil
}

// idleProbeLocked is key's probe connection idle the longest among those older than
// probeGrace, or nil; l.mu is held.
func (l *connLimit[K]) idleProbeLocked(key K) *limitedConn {
	var oldest *limitedConn
	var since int64
	for c, k := range l.conns {
		if k != key || !c.probe || time.Since(c.opened) < probeGrace {
			continue
		}
		if t := c.idleSince.Load(); t != 0 && (oldest == nil || t < since) {
			oldest, since = c, t
		}
	}
	return oldest
}

// give gives back a slot taken by take.
func (l *connLimit[K]) give(probe bool) {
	if probe {
		<-l.probes
	} else {
		<-l.slots
	}
}

// release ends c, admitted for key.
func (l *connLimit[K]) release(key K, c *limitedConn) {
	l.mu.Lock()
	count := l.open
	if c.probe {
		count = l.probed
	}
	if count[key]--; count[key] == 0 {
		delete(count, key)
	}
	delete(l.conns, c)
	l.mu.Unlock()
	l.give(c.probe)
}

// tooManyConnections is the whole answer to a connection over the per-uid limit (or
// over the global one with no connection idle),
// sent before its request is read (RFC 9110 lets a server answer early) and closed.
var tooManyConnections = func() []byte {
	a := &rawAnswer{header: http.Header{"Retry-After": {retryAfter(wire.CodeConnLimit)}, "Connection": {"close"}}}
	wire.WriteProblem(a, wire.NewProblem(http.StatusTooManyRequests, wire.CodeConnLimit,
		"too many connections are open to the daemon, from this uid or in all"), nil)
	var out bytes.Buffer
	(&http.Response{StatusCode: a.status, ProtoMajor: 1, ProtoMinor: 1, Header: a.header,
		ContentLength: int64(a.body.Len()), Body: io.NopCloser(&a.body)}).Write(&out)
	return out.Bytes()
}()

// rawAnswer keeps an answer written as to an http.ResponseWriter, to be sent on a
// connection no server reads.
type rawAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *rawAnswer) Header() http.Header         { return a.header }
func (a *rawAnswer) WriteHeader(status int)      { a.status = status }
func (a *rawAnswer) Write(b []byte) (int, error) { return a.body.Write(b) }

// refuse answers a connection over a limit and closes it gracefully: the
// answer, then the end of our side, then whatever the client still sends is read
// (for at most a second), so its request does not meet a reset before it reads
// the answer.
func refuse(c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(tooManyConnections); err != nil {
		return
	}
	c.CloseWrite()
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.UnixListener.AcceptUnix()
		if err != nil {
			return nil, err
		}
		probe, ok := l.limit.take()
		if !ok {
			go refuse(c)
			continue
		}
		p, _ := peerOf(c)
		pc := &peerConn{limitedConn: newLimitedConn(c, true, probe), peer: p}
		if !l.limit.admit(p.UID, pc.limitedConn) {
			go refuse(c)
			continue
		}
		return pc, nil
	}
}

// ListenTCP wraps a TCP listener (before any TLS) so that at most max connections
// are open at once and at most perIP of them come from one client address (more are
// kept for the health endpoints while probe slots last, and else closed at once,
// unanswered: the bytes of an HTTP answer would not be TLS). A
// connection that has not presented a valid bearer token is closed after
// unauthenticatedIdle idle, and at the bound the connection idle the longest is
// closed for a new one: whatever connections other clients hold, the kubelet's
// probes are answered.
func ListenTCP(l net.Listener, max, perIP int) net.Listener {
	return &ipListener{Listener: l, limit: newConnLimit[netip.Addr](max, perIP)}
}

type ipListener struct {
	net.Listener
	limit *connLimit[netip.Addr]
}

func (l *ipListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		probe, ok := l.limit.take()
		if !ok {
			c.Close()
			continue
		}
		var ip netip.Addr
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			ip = a.AddrPort().Addr().Unmap()
		}
		lc := newLimitedConn(c, false, probe)
		if !l.limit.admit(ip, lc) {
			c.Close()
			continue
		}
		return lc, nil
	}
}

// limitedConn gives its connLimit slot back on its first Close, and knows whether it
// is idle (idleSince, Unix nanoseconds; 0 while a request is being served) and
// whether its caller is known (a Unix peer, or a TCP caller that presented a valid
// bearer token).
type limitedConn struct {
	net.Conn
	once          sync.Once
	release       func()
	idleSince     atomic.Int64
	authenticated atomic.Bool
	// probe: the connection holds a probe slot (see probeSlots); it is treated as
	// unauthenticated whatever its peer, so the bounds on those apply to it.
	probe  bool
	opened time.Time

	mu   sync.Mutex
	idle *time.Timer // closes an unauthenticated connection left idle
}

func newLimitedConn(c net.Conn, authenticated, probe bool) *limitedConn {
	lc := &limitedConn{Conn: c, release: func() {}, probe: probe, opened: time.Now()}
	lc.idleSince.Store(time.Now().UnixNano())
	lc.authenticated.Store(authenticated && !probe)
	return lc
}

// ProbeOnly reports whether the request of ctx came on a connection that holds a
// probe slot: only the health endpoints are answered on it (see probeSlots).
func ProbeOnly(ctx context.Context) bool {
	lc, ok := ctx.Value(connKey{}).(*limitedConn)
	return ok && lc.probe
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		if c.idle != nil {
			c.idle.Stop()
		}
		c.mu.Unlock()
		c.release()
	})
	return err
}

// state follows the HTTP server's view of c (http.Server.ConnState).
func (c *limitedConn) state(st http.ConnState) {
	switch st {
	case http.StateActive:
		c.idleSince.Store(0)
	case http.StateNew, http.StateIdle:
		now := time.Now()
		c.idleSince.Store(now.UnixNano())
		if c.authenticated.Load() {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.idle != nil {
			c.idle.Stop()
		}
		c.idle = time.AfterFunc(unauthenticatedIdle, func() {
			if c.idleSince.Load() == now.UnixNano() && !c.authenticated.Load() {
				c.Close()
			}
		})
	}
}

// connOf is the limitedConn beneath c (a TLS connection's included), or nil.
func connOf(c net.Conn) *limitedConn {
	for {
		switch v := c.(type) {
		case *limitedConn:
			return v
		case *peerConn:
			return v.limitedConn
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
}

// ConnState is http.Server.ConnState of the API's server: it tells each connection
// from Listen or ListenTCP when it is idle.
func ConnState(c net.Conn, st http.ConnState) {
	if lc := connOf(c); lc != nil {
		lc.state(st)
	}
}

// peerConn is a socket connection with its peer's credentials, read at accept.
type peerConn struct {
	*limitedConn
	peer Peer
}

// supplementaryGroups reads the Groups line of /proc/PID/status (proc(5)).
func supplementaryGroups(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Groups:"); ok {
			var out []int
			for _, f := range strings.Fields(rest) {
				if g, err := strconv.Atoi(f); err == nil {
					out = append(out, g)
				}
			}
			return out
		}
	}
	return nil
}

// PeerFrom returns the caller's credentials, if the request came over a Unix socket.
func PeerFrom(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(peerKey{}).(Peer)
	return p, ok
}

// Principals is a resolved access list: uids and gids.
type Principals struct {
	UIDs map[int]bool
	GIDs map[int]bool
}

// ResolvePrincipals turns entries (a user name, a uid, "@group" or "@gid") into ids.
// Names must exist on this host.
func ResolvePrincipals(entries []string) (Principals, error) {
	p := Principals{UIDs: map[int]bool{}, GIDs: map[int]bool{}}
	var errs []error
	for _, e := range entries {
		if g, ok := strings.CutPrefix(e, "@"); ok {
			if id, err := strconv.Atoi(g); err == nil {
				p.GIDs[id] = true
			} else if grp, err := user.LookupGroup(g); err == nil {
				id, _ := strconv.Atoi(grp.Gid)
				p.GIDs[id] = true
			} else {
				errs = append(errs, fmt.Errorf("group %q: %w", g, err))
			}
			continue
		}
		if id, err := strconv.Atoi(e); err == nil {
			p.UIDs[id] = true
		} else if u, err := user.Lookup(e); err == nil {
			id, _ := strconv.Atoi(u.Uid)
			p.UIDs[id] = true
		} else {
			errs = append(errs, fmt.Errorf("user %q: %w", e, err))
		}
	}
	return p, errors.Join(errs...)
}

// Has reports whether peer is one of p, by uid, primary gid or a supplementary group
// (never a TCP caller: tokens carry their own roles).
func (p Principals) Has(peer Peer) bool {
	if peer.Token != "" {
		return false
	}
	if p.UIDs[peer.UID] || p.GIDs[peer.GID] {
		return true
	}
	for _, g := range peer.Groups {
		if p.GIDs[g] {
			return true
		}
	}
	return false
}

// Access maps callers to roles.
type Access struct {
	Runners, Approvers, Admins Principals
	// Native is who of the callers that may run code may run it on the native
	// backend ([native] runners).
	Native NativeAccess
	// Tokens are the bearer tokens TCP callers may present.
	Tokens Tokens
}

// Allows reports whether peer holds role (admins hold every role).
func (a Access) Allows(peer Peer, role Role) bool {
	if peer.Token != "" {
		t, ok := a.Tokens.named(peer.Token)
		return ok && (t.has(RoleAdmin) || t.has(role))
	}
	if a.Admins.Has(peer) {
		return true
	}
	switch role {
	case RoleRunner:
		return a.Runners.Has(peer)
	case RoleApprover:
		return a.Approvers.Has(peer)
	}
	return false
}

// ListenUnix listens on a Unix socket at path whose file has mode (and group gid, if
// gid >= 0) before anyone can connect: it is created under a umask that leaves only
// the owner's bits, then widened to mode, never beyond. A stale socket file (nothing
// listening) is replaced; a live one is not: the error says a daemon is running.
// The socket's directory must not be writable by group or others: whoever can write
// it can replace the socket with their own and see every caller's code.
func ListenUnix(path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil {
		return nil, err
	} else if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("the socket's directory %s is writable by others (mode %v): anyone who can write it can replace the socket", dir, fi.Mode().Perm())
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another daemon is listening on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(true)
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
	}
	if err := os.Chmod(path, mode&0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	return l, nil
}

// NativeAccess is who may run code on the native backend: every runner (All), or
// the listed principals and TCP tokens.
type NativeAccess struct {
	All        bool
	Principals Principals
	Tokens     []string // token names
}

// ResolveNative turns [native] runners entries into a NativeAccess: "*" is every
// runner, "token:NAME" a TCP token, anything else as ResolvePrincipals reads it.
func ResolveNative(entries []string) (NativeAccess, error) {
	var n NativeAccess
	var rest []string
	for _, e := range entries {
		switch name, ok := strings.CutPrefix(e, "token:"); {
		case e == "*":
			n.All = true
		case ok:
			n.Tokens = append(n.Tokens, name)
		default:
			rest = append(rest, e)
		}
	}
	var err error
	n.Principals, err = ResolvePrincipals(rest)
	return n, err
}

// MayUseBackend reports whether peer, who may run code, may run it on backend.
// The wasm backend is every runner's.
func (a Access) MayUseBackend(peer Peer, backend string) bool {
	if backend != protocol.BackendNative {
		return true
	}
	if a.Native.All {
		return true
	}
	if peer.Token != "" {
		return slices.Contains(a.Native.Tokens, peer.Token)
	}
	return a.Native.Principals.Has(peer)
}
