// Package systemd is the daemon's side of the service manager protocol
// (sd_notify(3), sd_listen_fds(3), sd_watchdog_enabled(3)) over coreos/go-systemd,
// plus, in this directory, the unit files, sysusers.d and tmpfiles.d entries.
//
// Outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS) every function is a no-op and
// reports so; nothing here changes what the daemon does, only what it tells.
package systemd

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends state changes to the service manager. The zero value sends to
// $NOTIFY_SOCKET; Send may be replaced (tests record the messages).
type Notifier struct {
	// Send delivers one message; nil means daemon.SdNotify.
	Send func(state string) (bool, error)
}

func (n Notifier) send(lines ...string) error {
	state := strings.Join(lines, "\n")
	if n.Send != nil {
		_, err := n.Send(state)
		return err
	}
	// unsetEnvironment false: the watchdog keeps using $NOTIFY_SOCKET. Workers never
	// see it: their environment is built from nothing.
	_, err := daemon.SdNotify(false, state)
	return err
}

// status is a STATUS= line: one line, at most 200 bytes (what systemctl shows).
func status(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:197] + "..."
	}
	return "STATUS=" + s
}

// Ready says start-up is complete (READY=1) with a STATUS= line.
func (n Notifier) Ready(msg string) error { return n.send(daemon.SdNotifyReady, status(msg)) }

// Status sets the STATUS= line.
func (n Notifier) Status(msg string) error { return n.send(status(msg)) }

// Extend asks for d more time to start or stop (EXTEND_TIMEOUT_USEC=, systemd 236+).
func (n Notifier) Extend(d time.Duration, msg string) error {
	return n.send(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", d.Microseconds()), status(msg))
}

// Stopping says shutdown began (STOPPING=1).
func (n Notifier) Stopping(msg string) error { return n.send(daemon.SdNotifyStopping, status(msg)) }

// Reloading says a configuration reload began (RELOADING=1); Ready ends it.
func (n Notifier) Reloading() error {
	return n.send(daemon.SdNotifyReloading, status("reloading the configuration"))
}

// Watchdog pings the watchdog (WATCHDOG=1).
func (n Notifier) Watchdog() error { return n.send(daemon.SdNotifyWatchdog) }

// WatchdogInterval returns WatchdogSec (from $WATCHDOG_USEC, for this process) and
// whether the watchdog is on. Pings are due at least every interval.
func WatchdogInterval() (time.Duration, bool) {
	d, err := daemon.SdWatchdogEnabled(false)
	return d, err == nil && d > 0
}

// UnixListener returns the Unix socket passed by socket activation ($LISTEN_FDS,
// sd_listen_fds(3)): the one named "api" (FileDescriptorName=), else the only one.
// It returns nil when none was passed. The LISTEN_* variables are removed from the
// environment, so no child inherits them.
func UnixListener() (*net.UnixListener, error) {
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	var all []net.Listener
	for name, ls := range named {
		if name == "api" && len(ls) > 0 {
			all = ls[:1]
			break
		}
		all = append(all, ls...)
	}
	switch {
	case len(all) == 0:
		return nil, nil
	case len(all) > 1:
		return nil, fmt.Errorf("socket activation: %d sockets passed and none named \"api\"", len(all))
	}
	ul, ok := all[0].(*net.UnixListener)
	if !ok {
		return nil, fmt.Errorf("socket activation: the passed socket is %s, not a Unix stream socket", all[0].Addr().Network())
	}
	return ul, nil
}
