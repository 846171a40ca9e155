"""Where a webhook may go (docs/WEBHOOKS.md, "Safety"): the one rule, applied when an endpoint is
saved (its URL) and again at every connect (the address its name resolves to then).

Production allows ``https`` to global addresses only: no loopback, private, link-local (the cloud
metadata service at 169.254.169.254), shared, reserved or multicast address, so an API client
cannot make the platform call into its own network (SSRF). The name is resolved, each address
checked, and the connection made to the checked address, so a name that resolves to a public
address at save and to 127.0.0.1 at send (DNS rebinding) is refused at send.
``WEBHOOKS["ALLOW_INSECURE"]`` (local development and tests) allows ``http`` and any address.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings


class Refused(ValueError):
    """The URL or the address it resolves to is not allowed; the message says which rule."""


def insecure_allowed() -> bool:
    return bool(settings.WEBHOOKS["ALLOW_INSECURE"])


def check_address(address: str) -> None:
    """Raise :class:`Refused` unless ``address`` (an IP literal) is a global unicast address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if insecure_allowed():
        return
    if not ip.is_global or ip.is_multicast:
        raise Refused(f"{ip} is not a public address (loopback, private, link-local or reserved): refused")


def check_url(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an allowed endpoint URL, or :class:`Refused` naming the rule. A
    host given as an IP literal is checked here; a name is checked on each connect (:func:`resolve`)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"not a URL: {exc}") from None
    schemes = ("https", "http") if insecure_allowed() else ("https",)
    if parts.scheme not in schemes:
        raise Refused(f"must start with {' or '.join(s + '://' for s in schemes)}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise Refused("has no host")
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


def resolve(host: str, port: int) -> str:
    """The address to connect to for ``host``: resolved now, every address checked (one refused:
    all refused, a name answering with a private address is not trusted for its others)."""
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            addresses = getaddrinfo(host, port)
        except OSError as exc:
            raise Refused(f"{host} does not resolve: {exc}") from None
    if not addresses:
        raise Refused(f"{host} does not resolve")
    for address in addresses:
        check_address(address)
    return addresses[0]
