"""Where Lazaretto may send a request of its own: a queue's webhook and the
alarm webhook post to public addresses only, unless the operator lists the
network in LAZARETTO_WEBHOOK_ALLOWED_NETWORKS. A URL is checked when it is
saved, and again at every connection, on the very address the connection
then uses: a name that resolves elsewhere later (DNS rebinding) is caught,
and an address written in another form (``2130706433``, ``0177.0.0.1``,
``[::ffff:127.0.0.1]``) is the address it stands for."""

from __future__ import annotations

import socket
from functools import cache
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings

if TYPE_CHECKING:
    import httpx

Address = IPv4Address | IPv6Address

# The resolver, one place to replace it (the tests' DNS stub).
getaddrinfo = socket.getaddrinfo


class DestinationRefused(ValueError):
    """The URL names no address a webhook may be sent to."""


class Unresolved(DestinationRefused):
    """The URL's host name does not resolve (now)."""


def _literal(host: str) -> Address | None:
    """The address ``host`` writes, in any form the C library reads as one
    (dotted, decimal, octal or hexadecimal IPv4; IPv6), else None."""
    try:
        address = ip_address(host.strip("[]"))
    except ValueError:
        try:
            address = IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def addresses_of(host: str, port: int) -> list[Address]:
    """Every address ``host`` stands for (resolved by DNS unless literal)."""
    literal = _literal(host)
    if literal is not None:
        return [literal]
    try:
        found = getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:  # UnicodeError: not a name IDNA can encode
        raise Unresolved(f"{host} does not resolve ({error})") from None
    addresses: list[Address] = []
    for *_, sockaddr in found:
        address = _literal(str(sockaddr[0]).split("%", 1)[0])
        if address is not None and address not in addresses:
            addresses.append(address)
    if not addresses:
        raise Unresolved(f"{host} resolves to no address")
    return addresses


def _why_not(address: Address) -> str:
    """Why a webhook may not go to ``address`` (empty: it may)."""
    if any(address in network for network in settings.LAZARETTO_WEBHOOK_ALLOWED_NETWORKS):
        return ""
    for kind in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return "" if address.is_global else "not public"


def checked(host: str, port: int) -> list[Address]:
    """``host``'s addresses, all allowed; DestinationRefused naming the first
    that is not, and why."""
    addresses = addresses_of(host, port)
    for address in addresses:
        why = _why_not(address)
        if why:
            shown = host if str(address) == host else f"{host} ({address})"
            raise DestinationRefused(
                f"{shown} is a {why} address: webhooks go to public addresses only, "
                "unless LAZARETTO_WEBHOOK_ALLOWED_NETWORKS lists its network"
            )
    return addresses


def check_url(url: str, *, unresolved_ok: bool = False) -> None:
    """Refuse (DestinationRefused) a URL whose host is not allowed. With
    ``unresolved_ok`` (saving a URL), a name that does not resolve now
    passes: each connection checks it again."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise DestinationRefused("the URL names no host")
    try:
        checked(parts.hostname, parts.port or _default_port(parts.scheme))
    except Unresolved:
        if not unresolved_ok:
            raise


@cache
def checked_transport_class() -> type[httpx.HTTPTransport]:
    """httpx's transport, connecting only to allowed addresses: each request
    resolves its host, checks every address, and connects to the first one
    (the Host header and TLS's server name stay the URL's host).

    Made at the first client, not at import: httpx takes a fifth of a
    second to import, which every process that validates a queue's URL
    (each web and worker process) would pay and few of them need."""
    import httpx

    class CheckedTransport(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            host = request.url.host
            [address, *_] = checked(host, request.url.port or _default_port(request.url.scheme))
            if str(address) != host:
                if request.url.scheme == "https":
                    request.extensions = {**request.extensions, "sni_hostname": host}
                request.url = request.url.copy_with(host=str(address))
            return super().handle_request(request)

    return CheckedTransport


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def outbound_client(**options: Any) -> httpx.Client:
    """An httpx client that sends only where webhooks may go."""
    import httpx

    return httpx.Client(transport=checked_transport_class()(), follow_redirects=False, **options)
