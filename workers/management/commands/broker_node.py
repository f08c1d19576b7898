"""Run a broker node of the HA pair, or ask the pair something.

    python manage.py broker_node --name A        run node A (until SIGTERM)
    python manage.py broker_node status          the local node's view
    python manage.py broker_node resolve --primary A
    python manage.py broker_node switchover

The node's settings are HA_* (see .env.example); its DATABASE_URL is its own
PostgreSQL server. The other actions talk to the node at HA_LISTEN, or at
``--address``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker.errors import BrokerError
from broker.ha.admin import ha_resolve, ha_status, ha_switchover, validate_node_name
from broker.ha.node import BrokerNode, NodeConfig
from broker.ha.postgres import Server, conninfo_of
from broker.ha.witness import Witness
from workers.celery import app
from workers.duties import CeleryDuties

WAIT_SECONDS = 120.0


class Command(BaseCommand):
    help = "Run a broker node of the HA pair (--name), or: status, resolve, switchover."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--name", help="this node's name, to run it (1-64 of A-Z a-z 0-9 . _ -)"
        )
        commands = parser.add_subparsers(dest="action")
        for action, text in (
            ("status", "what the node at HA_LISTEN (or --address) says"),
            ("resolve", "end a split brain: the named node stays primary, the other rejoins"),
            ("switchover", "swap the roles with no loss (needs a synchronised standby)"),
        ):
            sub = commands.add_parser(action, help=text)
            sub.add_argument("--address", help="host:port of a node (default: HA_LISTEN)")
            if action == "resolve":
                sub.add_argument("--primary", required=True, help="the node that stays primary")
            if action != "status":
                sub.add_argument(
                    "--no-wait", action="store_true", help="return once the node accepted"
                )

    def handle(self, *args: Any, action: str | None, **options: Any) -> None:
        try:
            if action is None:
                self._run(options.get("name"))
            elif action == "status":
                self.stdout.write(
                    json.dumps(ha_status(addresses=self._addresses(options)), indent=2)
                )
            elif action == "resolve":
                self._resolve(options)
            else:
                self._switchover(options)
        except BrokerError as error:
            raise CommandError(error.detail) from None

    @staticmethod
    def _addresses(options: dict[str, Any]) -> list[str]:
        return [options.get("address") or settings.HA_LISTEN]

    # -- run a node --------------------------------------------------------

    def _run(self, name: str | None) -> None:
        if not name:
            raise CommandError("Name the node to run: broker_node --name A (or give an action).")
        validate_node_name(name)
        interval, timeout = settings.HA_HEARTBEAT_INTERVAL, settings.HA_HEARTBEAT_TIMEOUT
        self._check_settings(interval=interval, timeout=timeout)
        node = self._node(name, interval=interval, timeout=timeout)
        stopping = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stopping.set())
        node.run(stopping)

    @staticmethod
    def _check_settings(*, interval: float, timeout: float) -> None:
        """Refuse HA_* settings a node cannot run with, naming the fix."""
        if timeout < 2 * interval:
            raise CommandError(
                f"HA_HEARTBEAT_TIMEOUT ({timeout:g} s) must be at least twice "
                f"HA_HEARTBEAT_INTERVAL ({interval:g} s)."
            )
        if settings.HA_PEER and settings.HA_PEER == settings.HA_LISTEN:
            raise CommandError(f"HA_PEER and HA_LISTEN are both {settings.HA_LISTEN}.")
        if settings.HA_PEER and not settings.HA_SECRET and not settings.DEBUG:
            raise CommandError(
                "HA_SECRET is not set: the nodes of a pair sign their heartbeats and commands "
                "with it. "
                "Give both nodes (and the web processes) the same long random value, e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'."
            )
        if settings.HA_PEER and settings.HA_PEER_DATABASE_URL is None:
            raise CommandError("HA_PEER is set but HA_PEER_DATABASE_URL is not.")

    @staticmethod
    def _node(name: str, *, interval: float, timeout: float) -> BrokerNode:
        """The node the settings describe: its own PostgreSQL server, the
        peer's (if any), the witness of a pair, and the Celery duties of a
        primary; listening on HA_LISTEN."""
        from broker.ha.admin import ha_secret

        config = NodeConfig(
            name=name,
            listen=settings.HA_LISTEN,
            peer=settings.HA_PEER or None,
            secret=ha_secret(),
            interval=interval,
            timeout=timeout,
            discovery_timeout=settings.HA_DISCOVERY_TIMEOUT,
            standalone=settings.HA_STARTUP_MODE == "standalone",
        )
        local = Server(
            conninfo=conninfo_of(settings.DATABASES["default"]),
            pgdata=settings.HA_PGDATA,
            bindir=settings.HA_PG_BINDIR,
            os_user=settings.HA_PG_OS_USER or None,
            options=settings.HA_PG_OPTIONS,
            log_file=settings.HA_PG_LOG,
        )
        peer_store = (
            Server(conninfo=conninfo_of(settings.HA_PEER_DATABASE_URL))
            if settings.HA_PEER_DATABASE_URL
            else None
        )
        witness = (
            Witness(
                settings.HA_WITNESS_URL,
                lease_seconds=timeout,
                timeout=min(1.0, interval),
            )
            if settings.HA_PEER
            else None
        )
        try:
            return BrokerNode(
                config,
                local=local,
                peer_store=peer_store,
                duties=CeleryDuties(app, settings.LAZARETTO_PRIMARY_DUTIES),
                witness=witness,
            )
        except OSError as error:
            raise CommandError(
                f"Cannot listen on {settings.HA_LISTEN} (HA_LISTEN): {error.strerror}. "
                "Is a node already running there?"
            ) from None

    # -- admin actions -------------------------------------------------------

    def _resolve(self, options: dict[str, Any]) -> None:
        primary = validate_node_name(options["primary"])
        addresses = self._addresses(options)
        ha_resolve(primary=primary, actor=None, addresses=addresses)
        self.stdout.write(f"{primary} was picked as primary; the other node rejoins as standby.")
        if not options["no_wait"]:
            self._wait(
                addresses,
                lambda s: (s["name"] == primary and s["role"] == "primary")
                or (s["name"] != primary and s["role"] in ("standby", "synchronising")),
                "the resolve to take effect",
            )

    def _switchover(self, options: dict[str, Any]) -> None:
        addresses = self._addresses(options)
        before = ha_status(addresses=addresses)
        ha_switchover(actor=None, addresses=addresses)
        self.stdout.write("Switchover accepted.")
        if not options["no_wait"]:
            was_primary = before["role"] == "primary"
            self._wait(
                addresses,
                lambda s: s["role"] == ("standby" if was_primary else "primary"),
                "the roles to swap",
            )

    def _wait(self, addresses: list[str], done: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                status = ha_status(addresses=addresses)
            except BrokerError:
                status = None
            if status is not None and done(status):
                self.stdout.write(f"Done: {status['name']} is {status['role']}.")
                return
            time.sleep(0.5)
        raise CommandError(f"Gave up after {WAIT_SECONDS:g} s waiting for {what}.")
