"""Network namespaces for the HA fault suite (root only).

Each node runs with its PostgreSQL server in a namespace of its own, joined
by a veth pair to a bridge in the tests' namespace, where Redis (the
witness), the web, the workers and the publishing client run. A link is cut
by blackhole routes on both ends: packets are dropped, as on a real cut,
not refused, so every timeout on the path is the one that counts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

HOST = "host"


def _ip(*args: str, netns: str | None = None, check: bool = True) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def available() -> str:
    """Why namespaces cannot be used here (empty: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"lzprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return ""


@dataclass
class Network:
    """A bridge at ``<subnet>.1`` in the tests' namespace and one namespace
    per member at ``<subnet>.2``, ``.3``, … (names unique to this process,
    so parallel test processes do not meet)."""

    members: tuple[str, ...]
    tag: str = field(default_factory=lambda: str(os.getpid() % 100000))
    cuts: set[tuple[str, str]] = field(default_factory=set)

    @property
    def subnet(self) -> str:
        return f"10.213.{int(self.tag) % 250}"

    @property
    def bridge(self) -> str:
        return f"lzb{self.tag}"

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.1"

    def namespace(self, member: str) -> str:
        return f"lz{self.tag}{member.lower()}"

    def address(self, member: str) -> str:
        if member == HOST:
            return self.host_address
        return f"{self.subnet}.{self.members.index(member) + 2}"

    def prefix(self, member: str) -> list[str]:
        """What runs a command inside ``member``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(member)]

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for member in self.members:
            ns, end = self.namespace(member), f"{self.namespace(member)}h"
            _ip("netns", "add", ns)
            _ip("link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", end, "master", self.bridge, "up")
            _ip("addr", "add", f"{self.address(member)}/24", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)

    def destroy(self) -> None:
        for member in self.members:
            _ip("netns", "del", self.namespace(member), check=False)
            _ip("link", "del", f"{self.namespace(member)}h", check=False)
        _ip("link", "del", self.bridge, check=False)

    def _route(self, action: str, at: str, to: str) -> None:
        _ip(
            "route",
            action,
            "blackhole",
            f"{self.address(to)}/32",
            netns=None if at == HOST else self.namespace(at),
            check=action == "add",
        )

    def cut(self, one: str, other: str) -> None:
        """Drop every packet between ``one`` and ``other`` (either may be HOST)."""
        for at, to in ((one, other), (other, one)):
            if (at, to) not in self.cuts:
                self._route("add", at, to)
                self.cuts.add((at, to))

    def isolate(self, member: str) -> None:
        """Cut ``member`` from everything: the other members and the host."""
        for other in (*self.members, HOST):
            if other != member:
                self.cut(member, other)

    def heal(self) -> None:
        for at, to in sorted(self.cuts):
            self._route("del", at, to)
        self.cuts.clear()


@contextlib.contextmanager
def network(*members: str) -> Iterator[Network]:
    made = Network(members)
    made.destroy()  # what a killed run of this process id left
    made.create()
    try:
        yield made
    finally:
        made.destroy()
