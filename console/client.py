"""Who a request comes from: its connecting address, or, when that is a
trusted reverse proxy (LAZARETTO_TRUSTED_PROXIES), the address the proxies
say they were reached from. /metrics, the login throttle and the audit log
all see this one address."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address

from django.conf import settings
from django.http import HttpRequest

Address = IPv4Address | IPv6Address


def _parsed(text: str) -> Address | None:
    """An address; one of IPv4 mapped into IPv6 counts as the IPv4 one."""
    try:
        address = ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: Address) -> bool:
    return any(address in network for network in settings.LAZARETTO_TRUSTED_PROXIES)


def client_address(request: HttpRequest) -> Address | None:
    """The connecting address, unless it is a trusted proxy: then
    X-Forwarded-For read from the right, each trusted proxy passed over, up
    to the first address that is not one (a client may write anything to the
    left of it). A hop that is not an address stops the walk at the proxy
    that added it."""
    address = _parsed(request.META.get("REMOTE_ADDR", ""))
    if address is None or not _trusted(address):
        return address
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for hop in reversed([hop for hop in forwarded.split(",") if hop.strip()]):
        parsed = _parsed(hop)
        if parsed is None:
            return address
        address = parsed
        if not _trusted(address):
            return address
    return address


def client_ip(request: HttpRequest) -> str:
    """``client_address`` as text (django-axes's AXES_CLIENT_IP_CALLABLE)."""
    address = client_address(request)
    return "" if address is None else str(address)
