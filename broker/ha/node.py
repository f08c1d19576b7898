"""A broker node: one of the HA pair, beside one PostgreSQL server.

A thread of the node exchanges statuses with its peer every ``interval``;
the node's main loop, as often, looks at its own server and acts by role.

- DISCOVERING: starting (or back from a pause). It waits up to the
  discovery timeout for its peer. A peer that is primary makes it a standby:
  it rewinds its store onto the primary's (exporting any messages only it
  had) and follows it. A peer that is a standby, or none at all, makes the
  node whose store is a primary's the primary. ``standalone`` skips the wait.
- PRIMARY: renews its lease with the witness (broker.ha.witness) at every
  step, keeps the standby synchronous while it streams and goes on alone
  (asynchronous) once it has been lost for the heartbeat timeout and the
  witness recorded it; refuses configuration changes while the standby
  synchronises; runs the primary duties under the pair's epoch. A refused
  renewal steps it down (fenced). Finding its peer primary too is a split
  brain: both go to MAINTENANCE.
- STANDBY / SYNCHRONISING: follows the primary. When the primary has been
  silent for the heartbeat timeout and the witness grants the next epoch
  (the lease lapsed, the term names this standby synchronous), the
  primary's server is fenced (read-only) if it still answers, and the
  standby promotes its own.
- MAINTENANCE: the store refuses every write and no duty runs until an admin
  picks the survivor (``resolve``); the other rejoins as standby.

A node whose own loop stalled past the heartbeat timeout (a pause, SIGSTOP)
no longer trusts its role: it fences its store, tells its peer it was
suspended and discovers again before doing anything.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from broker.errors import (
    BrokerError,
    HaCommandRefused,
    HaMisconfigured,
    HaNodeUnreachable,
    HaSecretMismatch,
)
from broker.ha import wire
from broker.ha.diverged import diverged_export
from broker.ha.postgres import PostgresError, Probe, Server, slot_name
from broker.ha.witness import Witness, WitnessRefused, WitnessUnreachable
from broker.models import HaEventKind, NodeRole

logger = logging.getLogger(__name__)

# A standby this close to the primary (bytes of WAL) counts as caught up.
CAUGHT_UP_BYTES = 16 * 1024 * 1024
# How long a switchover waits for the standby to replay the last WAL.
SWITCHOVER_WAIT_SECONDS = 30.0


class Duties(Protocol):
    """The primary-only duties (the sweeper, the dispatcher, the dead-letter
    scans, the archive schedule), issued under an epoch."""

    def start(self, epoch: int) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class NodeConfig:
    name: str
    listen: str
    peer: str | None
    secret: bytes
    interval: float = 1.0
    timeout: float = 10.0
    discovery_timeout: float = 30.0
    standalone: bool = False


@dataclass
class PeerView:
    """The peer's last status and when (monotonic) it was heard."""

    status: dict[str, Any]
    seen: float

    @property
    def name(self) -> str:
        return str(self.status.get("name", ""))

    @property
    def role(self) -> str:
        return "" if self.status.get("suspended") else str(self.status.get("role", ""))


@dataclass
class _Command:
    op: str
    args: dict[str, Any] = field(default_factory=dict)


class BrokerNode:
    def __init__(
        self,
        config: NodeConfig,
        *,
        local: Server,
        peer_store: Server | None,
        duties: Duties,
        witness: Witness | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.peer and witness is None:
            raise HaMisconfigured("a node with a peer needs a witness (HA_WITNESS_URL)")
        self.config = config
        self.witness = witness
        self.local = local
        self.peer_store = peer_store
        self.duties = duties
        self.clock = clock
        self.role = NodeRole.DISCOVERING
        self.mode = "starting"
        self.epoch = 0
        self.synchronous_standby = ""
        self._role_since = clock()
        self._discovery_started = clock()
        self._last_tick: float | None = None
        self._busy = False
        self._peer: PeerView | None = None
        self._peer_lock = threading.Lock()
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._standalone_pending = config.standalone
        # Why this node waits for its peer to become primary (it lost a
        # resolve, or handed over): it does not become primary itself then.
        self._awaiting_primary = ""
        self._primary_seen = clock()
        self._standby_streaming_seen: float | None = None
        self._not_receiving_since: float | None = None
        # Since when the own store has not answered (None: it answers).
        self._store_lost_since: float | None = None
        # When the peer last answered but refused our signature (HA_SECRET).
        self._peer_refuses_us: float | None = None
        self._configuration_checked = False
        # A standby named in synchronous_standby_names, not yet announced.
        self._sync_pending = ""
        # When (monotonic) the last renewal the witness granted was sent.
        self._witness_granted = -float("inf")
        # Rejoins since the store last streamed from the primary: a second
        # one clones instead of rewinding.
        self._rejoins_without_streaming = 0
        self._slot_for: str | None = None
        self._store: Probe | None = None
        self._said: dict[str, str] = {}
        self.listener = wire.Listener(config.listen, secret=config.secret, handler=self.handle)

    # -- what the node says about itself -------------------------------------

    def suspended(self) -> bool:
        """The main loop has not run for longer than the heartbeat timeout
        (and is not busy with a long step: a rewind, a clone, a switchover)."""
        last = self._last_tick
        return not self._busy and last is not None and self.clock() - last > self.config.timeout

    @contextlib.contextmanager
    def _long_step(self) -> Iterator[None]:
        """A step that may outlast the heartbeat timeout without the node
        counting itself paused."""
        self._busy = True
        try:
            yield
        finally:
            self._last_tick = self.clock()
            self._busy = False

    def status(self) -> dict[str, Any]:
        store = self._store
        peer = self._peer
        return {
            "name": self.config.name,
            "role": str(self.role),
            "mode": self.mode,
            "epoch": self.epoch,
            "address": self.config.listen,
            "suspended": self.suspended(),
            "store": None if store is None else ("standby" if store.in_recovery else "primary"),
            "lsn": None if store is None else store.lsn,
            "synchronous_standby": self.synchronous_standby,
            "peer": None if peer is None else peer.name,
            "peer_address": None if peer is None else peer.status.get("address"),
            "peer_seen_seconds_ago": None if peer is None else round(self.clock() - peer.seen, 3),
            "since_seconds": round(self.clock() - self._role_since, 3),
        }

    # -- requests from the peer and from admins ------------------------------

    def handle(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one request (the listener's threads)."""
        if op == "heartbeat":
            status = body.get("status")
            if not isinstance(status, dict):
                raise HaCommandRefused("a heartbeat carries the sender's status")
            if status.get("name") == self.config.name:
                raise HaCommandRefused(
                    f"a node named {self.config.name!r} is already live at {self.config.listen}"
                )
            self._heard(status)
            return self.status()
        if op == "status":
            return self.status()
        if op == "resolve":
            return self._accept_resolve(str(body.get("primary", "")), relay=bool(body.get("relay")))
        if op == "switchover":
            return self._accept_switchover()
        if op == "promote":
            if self.role != NodeRole.STANDBY:
                raise HaCommandRefused(
                    f"{self.config.name} is {self.role}, not a synchronised standby"
                )
            if "epoch" in body and int(body["epoch"] or 0) != self.epoch:
                raise HaCommandRefused(
                    f"the request is of epoch {body['epoch']}; the pair is at epoch {self.epoch}"
                )
            self._commands.put(_Command("promote", {k: body.get(k) for k in ("reason", "silent")}))
            return {"accepted": True}
        raise HaCommandRefused(f"unknown request {op!r}")

    def _known_names(self) -> set[str]:
        peer = self._peer
        return {self.config.name} | ({peer.name} if peer is not None else set())

    def _accept_resolve(self, primary: str, *, relay: bool) -> dict[str, Any]:
        if primary not in self._known_names():
            raise HaCommandRefused(
                f"there is no node named {primary!r}; the pair is "
                + " and ".join(sorted(self._known_names()))
            )
        if self.role != NodeRole.MAINTENANCE:
            raise HaCommandRefused(
                f"{self.config.name} is {self.role}, not in maintenance: there is no split brain "
                "to resolve"
            )
        if relay and self.config.peer:
            try:
                self._call("resolve", primary=primary, relay=False)
            except BrokerError as error:
                logger.warning("ha: could not pass the resolve on to the peer: %s", error.detail)
        self._commands.put(_Command("resolve", {"primary": primary}))
        return {"accepted": True}

    def _accept_switchover(self) -> dict[str, Any]:
        peer = self._fresh_peer()
        if self.role == NodeRole.STANDBY and peer is not None and peer.role == NodeRole.PRIMARY:
            return self._call("switchover")
        if self.role != NodeRole.PRIMARY:
            raise HaCommandRefused(
                f"{self.config.name} is {self.role}: a switchover needs a primary"
            )
        if self.mode != "synchronous" or peer is None or peer.role != NodeRole.STANDBY:
            raise HaCommandRefused(
                "a switchover needs a synchronised standby; the standby is "
                + ("not answering" if peer is None else str(peer.role or "suspended"))
            )
        self._commands.put(_Command("switchover"))
        return {"accepted": True}

    def _heard(self, status: dict[str, Any]) -> None:
        with self._peer_lock:
            self._peer = PeerView(status=status, seen=self.clock())

    def _fresh_peer(self) -> PeerView | None:
        """The peer as last heard, if heard within the heartbeat timeout."""
        peer = self._peer
        if peer is None or self.clock() - peer.seen > self.config.timeout:
            return None
        return peer

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        if not self.config.peer:
            raise HaNodeUnreachable("this node has no peer (HA_PEER is not set)")
        return wire.call(
            self.config.peer,
            op,
            secret=self.config.secret,
            timeout=max(1.0, self.config.interval),
            **fields,
        )

    # -- the loop --------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse to start beside a live node of the same name (one on this
        node's own address already failed to bind it)."""
        if not self.config.peer:
            return
        try:
            answer = self._call("status")
        except BrokerError:
            return
        if answer.get("name") == self.config.name:
            raise HaCommandRefused(
                f"a node named {self.config.name!r} is already live at {self.config.peer}"
            )
        if answer.get("peer") != self.config.name:
            return
        address = answer.get("peer_address")
        if not address or address == self.config.listen:
            return
        try:
            other = wire.call(address, "status", secret=self.config.secret, timeout=1.0)
        except BrokerError:
            return
        if other.get("name") == self.config.name:
            raise HaCommandRefused(
                f"a node named {self.config.name!r} is already live at {address}"
            )

    def run(self, stopping: threading.Event) -> None:
        self.preflight()
        self.listener.start()
        logger.info(
            "ha: node %s listening on %s, peer %s",
            self.config.name,
            self.config.listen,
            self.config.peer or "none",
        )
        heartbeats = threading.Thread(
            target=self._heartbeat, args=(stopping,), name="ha-heartbeat", daemon=True
        )
        heartbeats.start()
        try:
            while not stopping.is_set():
                started = self.clock()
                try:
                    self.tick()
                except HaMisconfigured:
                    raise
                except Exception:
                    logger.exception("ha: node %s: tick failed", self.config.name)
                stopping.wait(max(0.0, self.config.interval - (self.clock() - started)))
        finally:
            stopping.set()
            self.duties.stop()
            self.listener.stop()
            self.local.disconnect()

    def _heartbeat(self, stopping: threading.Event) -> None:
        """Exchange statuses with the peer every interval, in a thread of its
        own: a silent peer (each call waits for its answer) never slows the
        loop that decides, nor a long step (a rewind, a clone) the heartbeat."""
        while not stopping.is_set():
            started = self.clock()
            try:
                self._exchange()
            except Exception:
                logger.exception("ha: node %s: heartbeat failed", self.config.name)
            stopping.wait(max(0.0, self.config.interval - (self.clock() - started)))

    def tick(self) -> None:
        now = self.clock()
        paused = self._last_tick is not None and now - self._last_tick > self.config.timeout
        if paused and self.config.peer:
            # Without a peer, nobody could have taken over meanwhile.
            self._resume_after_pause(now - (self._last_tick or now))
        self._last_tick = now
        self._store = self.local.probe()
        if self._store is not None:
            self._store_lost_since = None
            if self.witness is not None and not self.witness.bound:
                # The pair's keys are named after its cluster.
                self.witness.bind(str(self.local.identity().system_identifier))
        elif self._store_lost_since is None:
            self._store_lost_since = now
        while not self._commands.empty():
            self._run_command(self._commands.get_nowait())
        handler = {
            NodeRole.DISCOVERING: self._discovering,
            NodeRole.PRIMARY: self._primary,
            NodeRole.STANDBY: self._standby,
            NodeRole.SYNCHRONISING: self._standby,
            NodeRole.MAINTENANCE: self._maintenance,
        }[NodeRole(self.role)]
        handler(self._store)
        if self.role in (NodeRole.PRIMARY, NodeRole.MAINTENANCE):
            self._publish_rows()

    def _exchange(self) -> None:
        if not self.config.peer:
            return
        try:
            self._heard(self._call("heartbeat", status=self.status()))
        except HaSecretMismatch as mismatch:
            # Alive, but deaf to us: not a silent peer to take over from.
            self._peer_refuses_us = self.clock()
            self._say("exchange", mismatch.detail)
        except HaCommandRefused as refused:
            logger.error("ha: the peer refused our heartbeat: %s", refused.detail)
        except HaNodeUnreachable:
            pass

    def _resume_after_pause(self, paused: float) -> None:
        logger.warning(
            "ha: node %s did not run for %.1f s (longer than the heartbeat timeout): "
            "its role is no longer trusted; discovering again",
            self.config.name,
            paused,
        )
        if self.role == NodeRole.PRIMARY:
            self._step_down("back from a pause")
        else:
            self.duties.stop()
            self._set_role(NodeRole.DISCOVERING, "back from a pause")
        self._peer = None

    def _set_role(self, role: NodeRole, mode: str) -> None:
        if role != self.role:
            self._role_since = self.clock()
            if role == NodeRole.DISCOVERING:
                self._discovery_started = self.clock()
            logger.info("ha: node %s is %s (%s)", self.config.name, role, mode)
        self.role, self.mode = role, mode

    def _say(self, key: str, text: str) -> None:
        """Log ``text`` once until the node says something else under ``key``."""
        if self._said.get(key) != text:
            self._said[key] = text
            logger.warning("ha: %s", text)

    # -- roles -----------------------------------------------------------------

    def _discovering(self, store: Probe | None) -> None:
        if store is None and self._hand_over_if_store_lost():
            return
        if self.local.pgdata is not None and not self._ensure_server_up():
            return
        if store is None:
            self._say("discover", f"{self.local.describe()} does not answer yet")
            return
        if not self._configuration_checked:
            self._check_configuration()
        self._read_epoch()
        if self._standalone_pending:
            self._standalone_pending = False
            self._become_primary(HaEventKind.STARTED, "started standalone", store)
            return
        peer = self._fresh_peer()
        if peer is not None:
            if peer.role == NodeRole.PRIMARY:
                self._awaiting_primary = ""
                if store.in_recovery and store.receiving:
                    self._primary_seen = self.clock()
                    self._set_role(NodeRole.SYNCHRONISING, "following the primary")
                else:
                    self._rejoin(store)
                return
            if self._awaiting_primary:
                self._say("discover", self._awaiting_primary)
                return
            if peer.role == NodeRole.MAINTENANCE:
                self._enter_maintenance("the peer is in maintenance")
                return
            if not store.in_recovery:
                if peer.role == NodeRole.DISCOVERING and peer.status.get("store") == "primary":
                    self._enter_maintenance("both stores are primaries")
                else:
                    self._become_primary(HaEventKind.STARTED, "the peer is not primary", store)
                return
            self._say("discover", "the store is a standby's: waiting for a primary")
            return
        if self.clock() - self._discovery_started < self.config.discovery_timeout:
            self._say("discover", "waiting for the peer (discovery timeout)")
            return
        if not store.in_recovery:
            self._become_primary(
                HaEventKind.STARTED, "no peer answered within the discovery timeout", store
            )
        else:
            self._say(
                "discover",
                "no peer answered and the store is a standby's, which may be behind its "
                "former primary: waiting for it",
            )

    def _hand_over_if_store_lost(self) -> bool:
        """This node's store has not answered for the heartbeat timeout and
        its peer is the synchronous standby: stop the store for good (it
        starts again fenced, and rejoins) and ask the peer to take over under
        the current epoch. True once handed over."""
        lost = self._store_lost_since
        peer = self._fresh_peer()
        if (
            lost is None
            or self.clock() - lost <= self.config.timeout
            or peer is None
            or peer.role != NodeRole.STANDBY
        ):
            return False
        if self.local.pgdata is None:
            self._say(
                "handover",
                f"{self.local.describe()} does not answer, and this node cannot stop it "
                "(HA_PGDATA is not set): the standby does not take over",
            )
            return False
        silent = self.clock() - lost
        self.local.kill()
        self._release_lease()
        try:
            self._call("promote", epoch=self.epoch, reason="handover", silent=round(silent, 1))
        except BrokerError as error:
            self._say("handover", f"the standby did not take over: {error.detail}")
            return False
        logger.warning(
            "ha: %s did not answer for %.1f s: stopped, and %s asked to take over",
            self.local.describe(),
            silent,
            peer.name,
        )
        self._store_lost_since = None
        # Until the peer is primary, this node's server (started again,
        # fenced) must not make it primary: the peer promotes under the epoch
        # it was handed, and two primaries would follow.
        self._awaiting_primary = f"handed over to {peer.name}: waiting for it to become primary"
        return True

    def _check_configuration(self) -> None:
        """Refuse to run (HaMisconfigured, naming the setting) beside a
        server pg_rewind cannot rewind, or a peer store that is this node's
        own server or of another cluster. Done once both stores answered."""
        local = self.local.identity()
        if self.config.peer and self.local.pgdata is not None and not local.rewindable:
            raise HaMisconfigured(
                f"wal_log_hints is off on {self.local.describe()} (and data checksums too): "
                "pg_rewind cannot rejoin it after a failover. Set wal_log_hints = on in its "
                "postgresql.conf and restart it."
            )
        if self.peer_store is None:
            self._configuration_checked = True
            return
        try:
            peer = self.peer_store.identity()
        except PostgresError:
            return  # the peer's store does not answer yet: checked later
        if peer == local:
            raise HaMisconfigured(
                f"HA_PEER_DATABASE_URL reaches this node's own server ({self.local.describe()}); "
                "it must name the peer's."
            )
        if peer.system_identifier != local.system_identifier:
            raise HaMisconfigured(
                f"HA_PEER_DATABASE_URL reaches {self.peer_store.describe()}, a server of another "
                f"cluster (system identifier {peer.system_identifier}; this node's server: "
                f"{local.system_identifier}): the pair's servers must be one cluster and its "
                "copy. Empty this node's HA_PGDATA to have it cloned from the peer."
            )
        self._configuration_checked = True

    def _ensure_server_up(self) -> bool:
        """Start the own server (fenced: it takes no application writes
        until the node knows its role), cloning the peer's first when the
        data directory is empty. False while it is not up yet."""
        try:
            if not self.local.has_data():
                peer = self._fresh_peer()
                if peer is None or peer.role != NodeRole.PRIMARY:
                    self._say("discover", "empty data directory: waiting for a primary to clone")
                    return False
                self._clone()
                return False
            if not self.local.running():
                with self._long_step():  # crash recovery may take a while
                    self.local.fence_stopped()
                    self.local.start()
                return False
        except PostgresError as error:
            self._say("server", f"PostgreSQL: {error}")
            return False
        return True

    def _read_epoch(self) -> None:
        rows = self.local.execute("SELECT epoch FROM broker_hapair WHERE id = 1")
        if rows:
            self.epoch = max(self.epoch, int(rows[0][0]))

    def _granted_epoch(self, *, takeover: bool) -> int | None:
        """The epoch the witness grants this node to be primary in (0 for a
        node without a peer, which needs no grant); None, said why, if not."""
        if self.witness is None:
            return 0
        try:
            return self.witness.begin(self.config.name, epoch=self.epoch, takeover=takeover)
        except (WitnessRefused, WitnessUnreachable) as error:
            self._say("witness", f"not becoming primary: {error}")
            return None

    def _become_primary(
        self, kind: HaEventKind, detail: str, store: Probe | None, *, granted: int | None = None
    ) -> None:
        """Promote the store (a standby's) and open the next epoch, once the
        witness granted it (``granted``: already, to a takeover)."""
        if granted is None:
            granted = self._granted_epoch(takeover=False)
            if granted is None:
                return
        promoted = store is not None and store.in_recovery
        if promoted:
            self.local.promote()
        self.epoch = self._open_epoch(granted)
        # A synchronous standby stays synchronous across its primary's
        # restart: it would take over from a silent primary, so nothing may
        # be acknowledged without it until it is told otherwise.
        peer = self._fresh_peer()
        keep = peer.name if peer is not None and peer.role == NodeRole.STANDBY else ""
        self.local.set_settings(
            {
                "default_transaction_read_only": None,
                "lazaretto.ha_mode": None,
                "synchronous_standby_names": f'"{keep}"' if keep else None,
            }
        )
        self.synchronous_standby = keep
        self._sync_pending = ""
        self._witness_granted = self.clock()
        # The witness names the kept standby (which may then take over) once
        # every commit waits for it.
        if (
            keep
            and self.local.wait_setting("synchronous_standby_names", f'"{keep}"')
            and not self._hold_term()
        ):
            return
        self._standby_streaming_seen = self.clock() if keep else None
        self._slot_for = None
        self._peer = None
        # "alone": a pair's primary without its standby; "standalone": one
        # node with no peer at all (make run), nothing missing.
        mode = "synchronous" if keep else "alone" if self.config.peer else "standalone"
        self._set_role(NodeRole.PRIMARY, mode)
        self._record(kind, f"{self.config.name} is primary at epoch {self.epoch}: {detail}")
        self.duties.start(self.epoch)
        if promoted:
            # The control file names the new timeline only after a
            # checkpoint; until then pg_rewind, reading it, takes the former
            # primary for one on the same timeline and rewinds nothing.
            with self._long_step():
                self.local.checkpoint()

    def _open_epoch(self, granted: int) -> int:
        """The store's next epoch, this node's: at least the one granted."""
        rows = self.local.execute(
            """
            INSERT INTO broker_hapair (id, epoch, primary_name, changed_at)
            VALUES (1, GREATEST(1, %(granted)s), %(name)s, now())
            ON CONFLICT (id) DO UPDATE
               SET epoch = GREATEST(broker_hapair.epoch + 1, %(granted)s),
                   primary_name = excluded.primary_name, changed_at = now()
            RETURNING epoch
            """,
            {"name": self.config.name, "granted": granted},
        )
        return int(rows[0][0])

    def _primary(self, store: Probe | None) -> None:
        if store is None:
            self._say("primary", f"{self.local.describe()} does not answer: duties stop")
            self.duties.stop()
            self._set_role(NodeRole.DISCOVERING, "the store stopped answering")
            return
        if store.read_only:
            # Only a standby taking over fences a primary's store.
            self._say("primary", "the store was fenced by the peer: the peer took over")
            self.duties.stop()
            self._set_role(NodeRole.DISCOVERING, "fenced by the peer")
            return
        if not self._hold_term():
            return
        peer = self._fresh_peer()
        if peer is not None and peer.role == NodeRole.PRIMARY and peer.seen > self._role_since:
            self._enter_maintenance(f"split brain: {peer.name} is primary too")
            return
        if (
            peer is not None
            and peer.role == NodeRole.MAINTENANCE
            and int(peer.status.get("epoch") or 0) >= self.epoch
        ):
            # The peer found the split brain first (a resolve advances the
            # survivor's epoch past the loser's, so the loser's last word
            # from maintenance is not taken for a new split brain).
            self._enter_maintenance(f"split brain: {peer.name} found it and is in maintenance")
            return
        if peer is not None and self._slot_for != peer.name:
            self.local.ensure_slot(slot_name(peer.name))
            self._slot_for = peer.name
        streaming = self._follow_standby(store, peer)
        # A standby rejoining (rewinding, catching up) blocks configuration
        # changes until it streams caught up, the moment it turns synchronous.
        synchronising = (
            peer is not None
            and peer.role in (NodeRole.SYNCHRONISING, NodeRole.STANDBY)
            and not streaming
        )
        wanted = "synchronising" if synchronising else ""
        if store.ha_mode != wanted:
            self.local.set_settings({"lazaretto.ha_mode": wanted or None})

    def _follow_standby(self, store: Probe, peer: PeerView | None) -> bool:
        """Keep the standby synchronous while it streams and replies, and go on
        alone once it has not for the heartbeat timeout and knows it; whether
        it streams."""
        replica = next((r for r in store.replicas if peer is None or r.name == peer.name), None)
        # A standby counts as streaming while it replies: a frozen one keeps
        # its connection (its kernel acknowledges) but sends no reply, and
        # commits waiting for it must not outlive the heartbeat timeout.
        streaming = (
            replica is not None
            and replica.state == "streaming"
            and replica.lag_bytes < CAUGHT_UP_BYTES
            and replica.reply_age is not None
            and replica.reply_age <= self.config.timeout
        )
        now = self.clock()
        if streaming and replica is not None and replica.reply_age is not None:
            self._standby_streaming_seen = now - replica.reply_age
            if self.synchronous_standby != replica.name and self._sync_pending != replica.name:
                # Commits wait for it once the server has taken the setting
                # in (a reload is asynchronous): announced on the next step.
                self.local.set_settings({"synchronous_standby_names": f'"{replica.name}"'})
                self._sync_pending = replica.name
            elif self.synchronous_standby != replica.name and self._witness_records(replica.name):
                # Announced (the standby turns STANDBY, and may take over)
                # only once the witness names it.
                self._sync_pending = ""
                self.synchronous_standby = replica.name
                self.mode = "synchronous"
                self._record(
                    HaEventKind.STANDBY_SYNCHRONOUS,
                    f"{replica.name} is synchronised: a write is answered once both stores have it",
                )
        elif (
            self.synchronous_standby
            and (
                self._standby_streaming_seen is None
                or now - self._standby_streaming_seen > self.config.timeout
            )
            and self._witness_records("")
        ):
            lost = self.synchronous_standby
            self.local.set_settings({"synchronous_standby_names": None})
            # Its walsender, on a link that may be cut, would hold the slot
            # (and the standby out) until wal_sender_timeout.
            self.local.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_replication "
                "WHERE application_name = %s",
                [lost],
            )
            self.synchronous_standby = ""
            self.mode = "alone"
            self._record(
                HaEventKind.STANDBY_LOST,
                f"{lost} lost for {self.config.timeout:g} s: the primary goes on alone "
                "(asynchronous)",
            )
        return streaming

    def _witness_records(self, standby: str) -> bool:
        """Whether the witness now names ``standby`` as the one every commit
        waits for (empty: the primary goes on alone). A standby is announced
        synchronous, and so may take over, only once it is named; the
        primary acknowledges writes without it only once the witness says
        so, after which the standby's grant is refused. Until then nothing
        changes: commits keep waiting, or the standby stays unannounced."""
        if self.witness is None:
            return True
        try:
            self.witness.renew(self.config.name, epoch=self.epoch, standby=standby)
        except (WitnessRefused, WitnessUnreachable) as error:
            change = f"{standby} synchronous" if standby else "going on alone"
            self._say("primary", f"the witness did not record {change}: {error}")
            return False
        return True

    def _hold_term(self) -> bool:
        """Renew this primary's lease with the witness. False once the
        primary stepped down: the witness granted the term to the standby,
        or neither the witness nor the standby has answered for half the
        timeout while the standby is synchronous (it may be taking over)."""
        if self.witness is None:
            return True
        sent = self.clock()
        try:
            self.witness.renew(self.config.name, epoch=self.epoch, standby=self.synchronous_standby)
            self._witness_granted = sent
            return True
        except WitnessRefused as refused:
            self._step_down(f"the witness refused the lease: {refused}")
            return False
        except WitnessUnreachable as error:
            peer = self._peer
            heard = max(self._witness_granted, peer.seen if peer is not None else -float("inf"))
            if self.synchronous_standby and sent - heard > self.config.timeout / 2:
                self._step_down(
                    f"neither the witness nor {self.synchronous_standby} answered for "
                    f"{sent - heard:.1f} s: the standby may be taking over"
                )
                return False
            self._say("witness", str(error))
            return True

    def _step_down(self, reason: str) -> None:
        """Stop being primary: duties stop and the store is fenced before
        anything else, then the node discovers its role again."""
        self.duties.stop()
        try:
            self.local.fence()
        except Exception as error:
            logger.warning("ha: could not fence the local store: %s", error)
        self._set_role(NodeRole.DISCOVERING, reason)
        self._say("primary", f"stepped down: {reason}")

    def _standby(self, store: Probe | None) -> None:
        now = self.clock()
        peer = self._fresh_peer()
        # A store that stopped is started again, as the standby it is; one
        # that will not start (a history the primary's does not continue) is
        # cloned.
        if (
            store is None
            and self.local.pgdata is not None
            and not self._ensure_server_up()
            and peer is not None
            and peer.role == NodeRole.PRIMARY
            and self._store_lost_since is not None
            and now - self._store_lost_since > 3 * self.config.timeout
        ):
            self._say("standby", "the store does not start as the primary's standby: cloning")
            self._clone()
            return
        if peer is not None and peer.role == NodeRole.PRIMARY:
            self._follow_primary(store, peer, now)
            return
        if peer is not None and peer.role in (NodeRole.SYNCHRONISING, NodeRole.STANDBY):
            # The former primary is rejoining after a switchover or a pause.
            return
        if peer is not None and peer.role == NodeRole.DISCOVERING:
            # The primary's node answers: it is restarting its server or
            # finding its role again. It is not silent; it hands over itself
            # (a promote request under its epoch) if its server is gone.
            self._primary_seen = peer.seen
            return
        if now - self._primary_seen <= self.config.timeout:
            return
        if self._peer_refuses_us is not None and now - self._peer_refuses_us <= self.config.timeout:
            self._say(
                "standby",
                "the primary's node answers but refuses this node's signature (HA_SECRET "
                "differs between the nodes): not taking over",
            )
            return
        if self.role != NodeRole.STANDBY:
            self._say(
                "standby",
                "the primary is silent but this standby was not synchronous: it may lack "
                "acknowledged writes, so it does not take over (an admin may switch over "
                "once the primary is back)",
            )
            return
        self._take_over(store, silent=now - self._primary_seen)

    def _follow_primary(self, store: Probe | None, peer: PeerView, now: float) -> None:
        """The peer is primary: take its epoch, turn synchronous or not as it
        says, and rejoin when the store has not followed it for 3 times the
        timeout."""
        self._primary_seen = peer.seen
        self.epoch = max(self.epoch, int(peer.status.get("epoch") or 0))
        if store is not None and store.receiving:
            self._not_receiving_since = None
            self._rejoins_without_streaming = 0
            synchronous = peer.status.get("synchronous_standby") == self.config.name
            if self.role == NodeRole.SYNCHRONISING and synchronous:
                self._set_role(NodeRole.STANDBY, "synchronous")
            elif self.role == NodeRole.STANDBY and not synchronous:
                self._set_role(NodeRole.SYNCHRONISING, "the primary goes on without it")
        else:
            if self._not_receiving_since is None:
                self._not_receiving_since = now
            elif now - self._not_receiving_since > 3 * self.config.timeout:
                self._not_receiving_since = None
                if store is not None:
                    self._say("standby", "the store does not follow the primary: rejoining")
                    self._rejoin(store)

    def _take_over(self, store: Probe | None, *, silent: float) -> None:
        """The primary is silent and this standby synchronous: once the
        witness grants it the next epoch (the primary's lease lapsed and the
        primary never dropped this standby), fence the primary's server if it
        answers, and promote this one."""
        if store is None:
            self._say(
                "standby", f"the primary is silent but {self.local.describe()} does not answer"
            )
            return
        self._read_epoch()  # a restart of the primary's may have opened an epoch unheard
        granted = self._granted_epoch(takeover=True)
        if granted is None:
            return
        # A postmaster that answers is alive: its server is fenced before
        # this one promotes. One that does not answer (dead, frozen, cut off)
        # takes no session; its node, refused by the witness, fences it, and
        # its commits wait for this standby anyway.
        detail = "the primary node and its store's postmaster were unreachable"
        if self.peer_store is not None and self.peer_store.answers():
            try:
                self.peer_store.fence()
                detail = "the primary node was silent; its store was fenced"
            except Exception as error:
                detail = f"the primary node was silent; its store could not be fenced ({error})"
        self._become_primary(
            HaEventKind.FAILOVER,
            f"{detail} for {silent:.1f} s (heartbeat timeout)",
            store,
            granted=granted,
        )

    def _maintenance(self, store: Probe | None) -> None:
        if store is not None and store.ha_mode != "maintenance":
            self.local.set_settings({"lazaretto.ha_mode": "maintenance"})

    # -- transitions -----------------------------------------------------------

    def _enter_maintenance(self, reason: str) -> None:
        self.duties.stop()
        self._release_lease()
        self.local.set_settings({"lazaretto.ha_mode": "maintenance"})
        self.local.terminate_clients()
        self._set_role(NodeRole.MAINTENANCE, reason)
        self._record(
            HaEventKind.SPLIT_BRAIN,
            f"{self.config.name} entered maintenance: {reason}; an admin picks the primary "
            "(broker_node resolve --primary NAME)",
        )

    def _source_conninfo(self) -> str:
        if self.peer_store is None:
            raise PostgresError("the peer's store is not configured (HA_PEER_DATABASE_URL)")
        params = conninfo_to_dict(self.peer_store.conninfo)
        params["application_name"] = self.config.name
        # The standby's walreceiver finds a cut link within the timeout, and
        # connects again (wal_retrieve_retry_interval) once it heals.
        seconds = max(1, round(self.config.timeout))
        params.update(
            connect_timeout=seconds,
            keepalives=1,
            keepalives_idle=1,
            keepalives_interval=1,
            keepalives_count=seconds,
            tcp_user_timeout=seconds * 1000,
        )
        return make_conninfo("", **params)

    def _rejoin(self, store: Probe) -> None:
        """Become the standby of the primary peer: export what only this
        store has, rewind it onto the primary's and follow it."""
        if self.local.pgdata is None or self.peer_store is None:
            self._say(
                "rejoin",
                "the peer is primary but this node cannot rewind its store "
                "(HA_PGDATA and HA_PEER_DATABASE_URL are needed)",
            )
            return
        self.duties.stop()
        self._set_role(NodeRole.SYNCHRONISING, "rejoining")
        self._exchange()  # the primary refuses configuration changes from now on
        with self._long_step():
            self._rewind_and_follow(store)

    def _rewind_and_follow(self, store: Probe) -> None:
        assert self.peer_store is not None
        if not store.in_recovery:
            self.local.fence()
            exported = diverged_export(
                local=self.local, survivor=self.peer_store, node=self.config.name
            )
            if exported is not None:
                path, count = exported
                logger.warning(
                    "ha: %s message(s) only %s had were exported to %s",
                    count,
                    self.config.name,
                    path,
                )
        self.local.stop()
        slot = slot_name(self.config.name)
        self.peer_store.ensure_slot(slot)
        source = self._source_conninfo()
        self._rejoins_without_streaming += 1
        try:
            if self._rejoins_without_streaming > 1:
                raise PostgresError("the last rewind did not make it follow the primary")
            self.peer_store.checkpoint_if_behind()
            self.local.rewind(source_conninfo=source)
            self.local.write_standby_config(primary_conninfo=source, slot=slot)
            self.local.start()
        except PostgresError as error:
            logger.warning("ha: rejoining by pg_rewind failed (%s); cloning the primary", error)
            self.local.stop("immediate")
            self.local.clone(source_conninfo=source, slot=slot)
            self.local.write_standby_config(primary_conninfo=source, slot=slot)
            self.local.start()
        self._primary_seen = self.clock()
        self._not_receiving_since = None

    def _clone(self) -> None:
        assert self.peer_store is not None
        self._set_role(NodeRole.SYNCHRONISING, "cloning the primary")
        self._exchange()
        slot = slot_name(self.config.name)
        self.peer_store.ensure_slot(slot)
        source = self._source_conninfo()
        with self._long_step():
            self.local.stop("immediate")
            self.local.clone(source_conninfo=source, slot=slot)
            self.local.write_standby_config(primary_conninfo=source, slot=slot)
            self.local.start()
        self._primary_seen = self.clock()

    def _run_command(self, command: _Command) -> None:
        try:
            if command.op == "resolve":
                self._resolve(str(command.args["primary"]))
            elif command.op == "switchover":
                with self._long_step():
                    self._switchover()
            elif command.op == "promote" and command.args.get("reason") == "handover":
                self._become_primary(
                    HaEventKind.FAILOVER,
                    f"the primary's store did not answer for {command.args.get('silent')} s; "
                    "its node stopped it and handed over",
                    self._store,
                )
            elif command.op == "promote":
                self._become_primary(
                    HaEventKind.SWITCHOVER,
                    "switchover requested by the former primary",
                    self._store,
                )
        except Exception:
            logger.exception("ha: %s failed", command.op)

    def _resolve(self, primary: str) -> None:
        if self.role != NodeRole.MAINTENANCE:
            return
        if primary == self.config.name:
            self._become_primary(
                HaEventKind.RESOLVED, "picked by an admin to end the split brain", self._store
            )
        else:
            self._awaiting_primary = f"{primary} was picked as primary: waiting for it"
            self._peer = None
            self._set_role(NodeRole.DISCOVERING, f"{primary} picked as primary: rejoining it")

    def _switchover(self) -> None:
        peer = self._fresh_peer()
        if self.role != NodeRole.PRIMARY or peer is None:
            return
        standby = peer.name
        self.duties.stop()
        self.local.fence()
        [(lsn,)] = self.local.execute("SELECT pg_current_wal_lsn() - '0/0'")
        deadline = self.clock() + SWITCHOVER_WAIT_SECONDS
        while not self.local.wait_replayed(standby, int(lsn)):
            if self.clock() > deadline:
                logger.error("ha: switchover abandoned: %s did not catch up", standby)
                self.local.unfence()
                self.duties.start(self.epoch)
                return
            time.sleep(0.05)
        self._set_role(NodeRole.SYNCHRONISING, f"switching over to {standby}")
        self.synchronous_standby = ""
        self.local.stop()
        self._release_lease()
        try:
            self._call("promote")
        except BrokerError as error:
            logger.error(
                "ha: switchover abandoned: %s refused to promote: %s", standby, error.detail
            )
            self.local.start()
            self._become_primary(HaEventKind.STARTED, "switchover abandoned", self.local.probe())
            return
        assert self.peer_store is not None
        slot = slot_name(self.config.name)
        source = self._source_conninfo()
        self.local.write_standby_config(primary_conninfo=source, slot=slot)
        self.local.start()
        self._primary_seen = self.clock()
        self._not_receiving_since = None

    def _release_lease(self) -> None:
        """Let the peer be granted the next epoch at once (it is asked to
        take over, or an admin picks the primary)."""
        if self.witness is not None:
            try:
                self.witness.release(self.config.name)
            except WitnessUnreachable as error:
                self._say("witness", f"the lease lapses by itself: {error}")

    # -- what the store records ------------------------------------------------

    def _record(self, kind: HaEventKind, detail: str) -> None:
        """An HA event and its audit event, on the local store (a primary's)."""
        logger.warning("ha: %s", detail)
        try:
            self.local.execute(
                """
                WITH event AS (
                    INSERT INTO broker_haevent (kind, node, epoch, detail)
                    VALUES (%s, %s, %s, %s)
                )
                INSERT INTO broker_auditevent
                    (created_at, actor_name, action, queue_name, reason, details)
                VALUES (now(), 'system', %s, '', %s, %s)
                """,
                [
                    str(kind),
                    self.config.name,
                    self.epoch,
                    detail,
                    f"ha.{kind}",
                    detail,
                    Jsonb({"node": self.config.name, "epoch": self.epoch}),
                ],
            )
        except Exception as error:
            logger.warning("ha: could not record %s: %s", kind, error)

    def _publish_rows(self) -> None:
        """Both nodes as this primary sees them, for the console and the API."""
        rows = [self._row(self.status(), heard_ago=0.0)]
        peer = self._peer
        if peer is not None:
            ago = self.clock() - peer.seen
            status = dict(peer.status)
            if ago > self.config.timeout:
                status["role"] = NodeRole.UNREACHABLE
            rows.append(self._row(status, heard_ago=ago))
        lag = {r.name: r.lag_bytes for r in (self._store.replicas if self._store else ())}
        for row in rows:
            row["lag"] = lag.get(row["name"]) if row["name"] != self.config.name else None
            self.local.execute_named(
                """
                INSERT INTO broker_node (name, role, mode, epoch, address, last_heartbeat_at,
                                         replication_lag_bytes, updated_at)
                VALUES (%(name)s, %(role)s, %(mode)s, %(epoch)s, %(address)s,
                        now() - make_interval(secs => %(ago)s), %(lag)s, now())
                ON CONFLICT (name) DO UPDATE SET
                    role = excluded.role, mode = excluded.mode, epoch = excluded.epoch,
                    address = excluded.address, last_heartbeat_at = excluded.last_heartbeat_at,
                    replication_lag_bytes = excluded.replication_lag_bytes, updated_at = now()
                """,
                row,
            )

    @staticmethod
    def _row(status: dict[str, Any], *, heard_ago: float) -> dict[str, Any]:
        role = "" if status.get("suspended") else str(status.get("role", ""))
        return {
            "name": str(status.get("name", ""))[:64],
            "role": (role or NodeRole.UNREACHABLE)[:16],
            "mode": str(status.get("mode", ""))[:32],
            "epoch": int(status.get("epoch") or 0),
            "address": str(status.get("address", ""))[:255],
            "ago": heard_ago,
        }
