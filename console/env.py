"""Typed readers for settings that come from the environment.

Each reader fails loudly, naming the variable, when a value is present but
wrong: a typo in production configuration must stop start-up, not silently
fall back to a default.
"""

import os
import re
from collections.abc import Callable
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

N = TypeVar("N", int, float)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SPARK_MASTER = re.compile(
    r"^(local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|(spark|k8s|mesos)://\S+|yarn)$"
)


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def _bad(name: str, value: str, expected: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{name}: {value!r} is not valid; expected {expected}.")


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _bad(name, value, "one of 1/0, true/false, yes/no, on/off")


def env_str(name: str, default: str | None = None) -> str:
    value = _raw(name)
    if value:
        return value
    if default is None:
        raise ImproperlyConfigured(f"{name}: not set and has no default; see .env.example.")
    return default


def env_secret(name: str, minimum: int) -> str:
    """A shared secret of at least ``minimum`` characters, or "" when unset.
    A refusal says how long it was, never what it was."""
    value = _raw(name)
    if not value:
        return ""
    if len(value) < minimum:
        raise ImproperlyConfigured(
            f"{name}: a secret of {len(value)} characters is too short; "
            f"expected at least {minimum}."
        )
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return default
    items = [item.strip() for item in value.split(",")]
    if not all(items):
        raise _bad(name, value, "a comma-separated list without empty items")
    return items


def env_database(name: str) -> dict[str, Any]:
    url = env_str(name)
    scheme = urlsplit(url).scheme
    if scheme not in {"postgres", "postgresql", "pgsql"}:
        raise _bad(name, url, "a postgres://user:password@host:port/dbname URL")
    try:
        config = environ.Env.db_url_config(url)
    except (ValueError, KeyError) as error:
        raise _bad(name, url, f"a postgres:// URL ({error})") from error
    if not config.get("NAME"):
        raise _bad(name, url, "a URL that names the database")
    config["ENGINE"] = "broker.store"
    return config


def env_redis_url(name: str, default: str) -> str:
    url = env_str(name, default)
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a non-numeric port
    except ValueError as error:
        raise _bad(name, url, "a redis://host:port/db URL") from error
    if parts.scheme not in {"redis", "rediss"} or not parts.hostname:
        raise _bad(name, url, "a redis://host:port/db URL")
    return url


def env_spark_master(name: str, default: str) -> str:
    value = env_str(name, default)
    if not _SPARK_MASTER.match(value):
        raise _bad(name, value, "local, local[N], local[*], spark://host:port, k8s://… or yarn")
    return value


def env_spark_remote(name: str) -> str:
    """A Spark Connect server's URL, ``sc://host[:port][/;param=value…]``;
    unset or empty means none (the jobs run their own driver)."""
    value = _raw(name)
    if not value:
        return ""
    expected = "sc://host:port, the Spark Connect server's address (e.g. sc://127.0.0.1:15002)"
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise _bad(name, value, expected) from None
    if (
        parts.scheme != "sc"
        or not parts.hostname
        or port == 0
        or parts.query
        or parts.fragment
        or (parts.path and not parts.path.startswith("/;"))
        or any(char.isspace() for char in value)
    ):
        raise _bad(name, value, expected)
    return value


def env_path(name: str, default: Path, base: Path) -> Path:
    """A directory; a relative value is taken from ``base``."""
    value = _raw(name)
    path = base / value if value else default
    if path.exists() and not path.is_dir():
        raise _bad(name, str(path), "a directory (the path exists and is a file)")
    return path


def env_file(name: str, default: Path, base: Path) -> Path:
    """A file; a relative value is taken from ``base``. Whether it exists is
    checked by what uses it, which says what to install."""
    value = _raw(name)
    path = base / value if value else default
    if path.is_dir():
        raise _bad(name, str(path), "a file (the path is a directory)")
    return path


def env_int(name: str, default: int, minimum: int = 1, maximum: int | None = None) -> int:
    return _number(name, default, minimum, int, "a whole number", maximum)


def env_float(name: str, default: float, minimum: float = 0.05) -> float:
    return _number(name, default, minimum, float, "a number")


def _number(
    name: str,
    default: N,
    minimum: N,
    parse: Callable[[str], N],
    kind: str,
    maximum: N | None = None,
) -> N:
    """``name``'s value read by ``parse``, at least ``minimum`` (not NaN)
    and at most ``maximum``, if given."""
    value = _raw(name)
    if not value:
        return default
    try:
        number = parse(value)
    except ValueError:
        raise _bad(name, value, kind) from None
    if maximum is not None and not minimum <= number <= maximum:
        raise _bad(name, value, f"{kind} from {minimum} to {maximum}")
    if not number >= minimum:
        raise _bad(name, value, f"{kind} of at least {minimum}")
    return number


_RATE = re.compile(r"^[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)$")


def env_rate(name: str, default: str) -> str:
    """A request rate as DRF writes it: ``N/s``, ``N/min``, ``N/hour``, ``N/day``."""
    value = _raw(name)
    if not value:
        return default
    if not _RATE.match(value):
        raise _bad(name, value, "N/s, N/min, N/hour or N/day with N a whole number above 0")
    return value


def next_redis_database(url: str) -> str:
    """``url`` with the next of Redis's 16 databases (0 when it names none)."""
    parts = urlsplit(url)
    current = parts.path.strip("/")
    number = int(current) if current.isdigit() else 0
    return parts._replace(path=f"/{(number + 1) % 16}").geturl()


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (case-insensitive), returned in lower case."""
    value = _raw(name)
    if not value:
        return default
    if value.lower() not in choices:
        raise _bad(name, value, f"one of {', '.join(choices)}")
    return value.lower()


def env_networks(name: str, default: list[str]) -> list[IPv4Network | IPv6Network]:
    """A comma-separated list of networks in CIDR notation (``10.0.0.0/8``,
    ``::1/128``; a bare address is one host); set and empty means none."""
    value = _raw(name)
    items = (
        default if value is None else [item.strip() for item in value.split(",") if item.strip()]
    )
    networks = []
    for item in items:
        try:
            networks.append(ip_network(item))
        except ValueError as error:
            raise _bad(
                name, str(value), f"networks in CIDR notation, comma-separated ({error})"
            ) from None
    return networks


def env_address(name: str, default: str) -> str:
    """``host:port`` (``[v6]:port`` too); set and empty means none."""
    value = _raw(name)
    if value is None:
        value = default
    if not value:
        return ""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(name, value, "host:port")
    return value


def env_optional_database(name: str) -> dict[str, Any] | None:
    """Like ``env_database``, or None when the variable is unset or empty."""
    return env_database(name) if _raw(name) else None
