package builtin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// HTTPGuard decides which addresses the `http` handler may connect to (docs/security.md). It is checked on the resolved
// address at dial time, for every connection the handler's client opens (redirects included), so neither a
// DNS name that resolves to a forbidden address (DNS rebinding) nor a redirect can get around it.
//
// Link-local addresses (169.254.0.0/16, fe80::/10: cloud metadata services) are refused always; with
// DenyPrivate, loopback, private (RFC 1918, fc00::/7), shared (100.64.0.0/10) and unspecified addresses too.
// AllowHosts are exceptions: host names (matched against the request's host, case-insensitively), IP addresses
// or CIDR prefixes (matched against the resolved address).
type HTTPGuard struct {
	// DenyPrivate refuses loopback and private ranges as well as link-local ones.
	DenyPrivate bool
	// AllowHosts lists exceptions: host names, IP addresses or CIDR prefixes.
	AllowHosts []string
}

// DeniedAddressError is the error of a connection the guard refused. The http handler reports it as a
// `permanent` failure naming the address.
type DeniedAddressError struct {
	// Host is the host the request named.
	Host string
	// Addr is the resolved address that was refused.
	Addr netip.Addr
	// Reason names the range: "link-local", "loopback", "private", …
	Reason string
}

func (e *DeniedAddressError) Error() string {
	return fmt.Sprintf("http guard: %s resolves to %s (%s): refused (allow it with --http-allow-hosts)", e.Host, e.Addr, e.Reason)
}

var (
	sharedRange = netip.MustParsePrefix("100.64.0.0/10")
)

// reason returns why addr is refused, or "" when it is allowed.
func (g *HTTPGuard) reason(addr netip.Addr) string {
	addr = addr.Unmap()
	switch {
	case addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast():
		return "link-local"
	case !g.DenyPrivate:
		return ""
	case addr.IsLoopback():
		return "loopback"
	case addr.IsPrivate():
		return "private"
	case sharedRange.Contains(addr):
		return "shared address space"
	case addr.IsUnspecified():
		return "unspecified"
	}
	return ""
}

// allowedHost reports whether host is listed by name in AllowHosts.
func (g *HTTPGuard) allowedHost(host string) bool {
	for _, h := range g.AllowHosts {
		if strings.EqualFold(strings.TrimSpace(h), host) {
			return true
		}
	}
	return false
}

// allowedAddr reports whether addr is listed in AllowHosts as an address or a prefix.
func (g *HTTPGuard) allowedAddr(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, h := range g.AllowHosts {
		h = strings.TrimSpace(h)
		if p, err := netip.ParsePrefix(h); err == nil && p.Contains(addr) {
			return true
		}
		if a, err := netip.ParseAddr(h); err == nil && a.Unmap() == addr {
			return true
		}
	}
	return false
}

// Validate checks AllowHosts: every entry is a host name, an IP address or a CIDR prefix.
func (g *HTTPGuard) Validate() error {
	for _, h := range g.AllowHosts {
		h = strings.TrimSpace(h)
		if h == "" || strings.ContainsAny(h, " /:") && !validAddrOrPrefix(h) {
			return fmt.Errorf("http allow-hosts: %q is not a host name, an IP address or a CIDR prefix", h)
		}
	}
	return nil
}

func validAddrOrPrefix(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// dialContext wraps dial: a host listed by name in AllowHosts is dialled as is; any other is dialled with a
// check of every resolved address just before connecting.
func (g *HTTPGuard) dialContext(dialer *net.Dialer) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return nil, err
		}
		if g.allowedHost(host) {
			return dialer.DialContext(ctx, network, address)
		}
		d := *dialer
		d.Control = func(_, resolved string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(resolved)
			if err != nil {
				return fmt.Errorf("http guard: unexpected address %q: %w", resolved, err)
			}
			if why := g.reason(ap.Addr()); why != "" && !g.allowedAddr(ap.Addr()) {
				return &DeniedAddressError{Host: host, Addr: ap.Addr().Unmap(), Reason: why}
			}
			return nil
		}
		return d.DialContext(ctx, network, address)
	}
}

// deniedAddress returns the guard's refusal inside err, if any.
func deniedAddress(err error) (*DeniedAddressError, bool) {
	var denied *DeniedAddressError
	ok := errors.As(err, &denied)
	return denied, ok
}
