"""Where a webhook may go (docs/WEBHOOKS.md, "Safety"): the one rule, applied when an endpoint is
saved (its URL) and again at every connect (the address its name resolves to then).

Production allows ``https`` to global addresses only: no loopback, private, link-local (the cloud
metadata service at 169.254.169.254), shared, reserved or multicast address, so an API client
cannot make the platform call into its own network (SSRF). The name is resolved, each address
checked, and the connection made to the checked address, so a name that resolves to a public
address at save and to 127.0.0.1 at send (DNS rebinding) is refused at send. An IPv6 address
carrying an IPv4 one (NAT64, SIIT, 6to4, Teredo…) is judged by that one too, and the IPv4 forms
the resolver reads (``2130706433``, ``0177.0.0.1``, ``127.1``) are IP literals.
``WEBHOOKS["ALLOW_INSECURE"]`` (local development and tests) allows ``http`` and any address.
A URL is ASCII in every mode (an IDN host in its punycode form): what is checked at save is what
is called, never a name a library would map first (fullwidth ``ｌｏｃａｌｈｏｓｔ``, ``127。0。0。1``).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from urllib.parse import urlsplit

from django.conf import settings


class Refused(ValueError):
    """The URL or the address it resolves to is not allowed; the message says which rule."""


def insecure_allowed() -> bool:
    return bool(settings.WEBHOOKS["ALLOW_INSECURE"])


#: IPv6 prefixes that carry an IPv4 address in their last 32 bits: NAT64 (RFC 6052), SIIT
#: (RFC 6145), IPv4-compatible (deprecated, RFC 4291). 6to4 and Teredo have their own properties.
_LAST_32_BITS = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "::ffff:0:0:0/96", "::/96"))
#: The IANA special-purpose blocks (iana-ipv4-special-registry, iana-ipv6-special-registry) that are
#: not globally reachable or are deprecated, refused on top of ``is_global``: Python 3.11's list
#: misses some (site-local, SRv6, the RFC 9637 documentation range, 6to4 relay anycast, local-use
#: NAT64…) and changes between versions; this one does not.
_SPECIAL_PURPOSE = tuple((ipaddress.ip_network(net), name) for net, name in (
    ("0.0.0.0/8", "this network"), ("10.0.0.0/8", "private"), ("100.64.0.0/10", "shared"),
    ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"), ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"), ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"), ("192.168.0.0/16", "private"), ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"), ("203.0.113.0/24", "documentation"), ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"), ("::1/128", "loopback"), ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"), ("100:0:0:1::/64", "dummy IPv6 prefix"),
    ("2001::/23", "IETF protocol assignments"), ("2001:db8::/32", "documentation"), ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 SIDs"), ("fc00::/7", "unique local"), ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local")))


def _special_purpose(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """``"<name>, <block>"`` of the special-purpose block ``ip`` is in ("": none)."""
    return next((f"{name}, {net}" for net, name in _SPECIAL_PURPOSE if ip.version == net.version and ip in net), "")


def _embedded(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (NAT64, SIIT, compatible, 6to4, Teredo)."""
    found = [ip.sixtofour] if ip.sixtofour is not None else []
    if ip.teredo is not None:
        found += list(ip.teredo)
    found += [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) for net in _LAST_32_BITS if ip in net]
    return found


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address when it is one, including the forms ``inet_aton`` (and so the
    resolver) reads as IPv4: decimal ``2130706433``, octal ``0177.0.0.1``, hex, short ``127.1``."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if not host or any(c not in "0123456789abcdefxABCDEFX." for c in host):
        return None  # inet_aton ignores what follows a space: only digits, dots and hex are read by it
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_address(address: str) -> None:
    """Raise :class:`Refused` unless ``address`` (an IP literal) is a global unicast address outside
    the special-purpose blocks, and every IPv4 address it embeds (an IPv6 translation or tunnel form)
    is one too. The one rule of both the save (an IP literal) and each connect (every address)."""
    ip = _literal(address)
    if ip is None:
        raise ValueError(f"{address!r} is not an IP address")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:a.b.c.d is that IPv4 address
    if insecure_allowed():
        return
    inner = _embedded(ip) if isinstance(ip, ipaddress.IPv6Address) else []
    for one in (ip, *inner):
        shown = f"{one} (in {ip})" if one is not ip else str(ip)
        if not one.is_global or one.is_multicast:
            raise Refused(f"{shown} is not a public address (loopback, private, link-local or reserved): refused")
        if special := _special_purpose(one):
            raise Refused(f"{shown} is not a public address ({special}): refused")


def check_url(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an allowed endpoint URL, or :class:`Refused` naming the rule. A
    host given as an IP literal is checked here; a name is checked on each connect (:func:`resolve`)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"not a URL: {exc}") from None
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise Refused("must not contain spaces or control characters (CR, LF, tab…)")
    schemes = ("https", "http") if insecure_allowed() else ("https",)
    if parts.scheme not in schemes:
        raise Refused(f"must start with {' or '.join(s + '://' for s in schemes)}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise Refused("has no host")
    if not host.isascii():
        raise Refused(f"host {host!r} is not ASCII: use its punycode form (xn--…)")
    if not url.isascii():
        raise Refused("must be ASCII: percent-encode the path and query (%C3%BC for ü)")
    if parts.username or parts.password:
        raise Refused("must not carry a user name or password")
    try:
        check_address(host)
    except ValueError as exc:
        if isinstance(exc, Refused):
            raise
        # A name, not an address: local names are refused here, the rest when resolved.
        if not insecure_allowed() and (host == "localhost" or host.endswith((".localhost", ".local", ".internal"))):
            raise Refused(f"{host} is a local name: refused") from None
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def getaddrinfo(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to now (a seam: tests patch it to play a rebinding resolver)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class ResolveTimeout(Refused):
    """The name did not resolve within the time left to the request (a slow or dead resolver)."""


def _lookup(host: str, port: int, timeout: float | None) -> list[str]:
    """:func:`getaddrinfo` bounded by ``timeout``: the lookup runs in a daemon thread, abandoned (it
    ends when the resolver answers) when it outlasts the request's deadline."""
    if timeout is None:
        return getaddrinfo(host, port)
    found: list = []

    def run() -> None:
        try:
            found.append(getaddrinfo(host, port))
        except OSError as exc:
            found.append(exc)

    worker = threading.Thread(target=run, name=f"resolve {host}", daemon=True)
    worker.start()
    worker.join(max(timeout, 0.0))
    if not found:
        raise ResolveTimeout(f"{host} did not resolve in time")
    if isinstance(found[0], OSError):
        raise found[0]
    return found[0]


def resolve(host: str, port: int, timeout: float | None = None) -> str:
    """The address to connect to for ``host``: resolved now, within ``timeout`` seconds when given,
    every address checked (one refused: all refused, a name answering with a private address is not
    trusted for its others)."""
    literal = _literal(host)
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = _lookup(host, port, timeout)
        except OSError as exc:
            raise Refused(f"{host} does not resolve: {exc}") from None
    if not addresses:
        raise Refused(f"{host} does not resolve")
    for address in addresses:
        check_address(address)
    return addresses[0]
