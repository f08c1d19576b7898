"""HA failover: how long the pair takes to fail over when its primary dies,
and whether any acknowledged publish is lost.

The pair is rig.ha's, started for real in temporary directories:
DATABASE_URL and CELERY_BROKER_URL are not used. Each run injects the fault
into the primary, times the failover, ends the fault and waits for the old
primary to rejoin as standby; the next run hits the other node. At the end
every publish answered 201 must be in the final primary's store.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from bench import _harness as harness

if TYPE_CHECKING:
    from rig.ha import NodeProcess, Pair, WebServer
    from rig.processes import Workers

QUEUE = "BENCH.FAILOVER"
PAYLOAD_PREFIX = "bench-failover"
RUNS = 5
# Failover target: the heartbeat timeout plus this.
TARGET_MARGIN_SECONDS = 2.0
STATUS_POLL_SECONDS = 0.02
POLL_SECONDS = 0.1
# Before each kill, once the pair is synchronous: this many publishes
# answered 201, and at least this long, then a random part of a heartbeat
# interval (so the kill lands at any phase of the heartbeats).
WARMUP_ACKS = 20
WARMUP_SECONDS = 1.0
# After the kill: publishing counts as resumed after this many 201s of
# requests sent after the kill.
RESUMED_ACKS = 20
# Give-ups (the bench fails, exit 1, with the node logs).
FAILOVER_GRACE_SECONDS = 30.0
RESUME_TIMEOUT_SECONDS = 60.0
DELIVERY_TIMEOUT_SECONDS = 60.0
REJOIN_TIMEOUT_SECONDS = 120.0
SYNCHRONOUS_TIMEOUT_SECONDS = 60.0
# At the end, how long the workers get to deliver what is left (reported only).
SETTLE_SECONDS = 30.0
# A delivery seen this long after the first one found still gets a chance
# to be earlier (a later publish delivered first by another process).
RECHECK_SECONDS = 1.0
LOG_TAIL = 4000
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")

FIRST_DLVD_SQL = """
SELECT state, extract(epoch FROM updated_at)::float8 FROM broker_message
WHERE id = %s AND convert_from(payload, 'UTF8') = %s
"""
PAYLOADS_SQL = """
SELECT convert_from(m.payload, 'UTF8') FROM broker_message m
JOIN broker_queue q ON q.id = m.queue_id WHERE q.name = %s
"""
STATES_SQL = """
SELECT m.state, count(*) FROM broker_message m
JOIN broker_queue q ON q.id = m.queue_id WHERE q.name = %s GROUP BY 1
"""


FAULTS = {
    "crash": "SIGKILL of the primary's node and PostgreSQL, the node then started again",
    "freeze": "the primary's node and PostgreSQL stopped (SIGSTOP) for 3 x the timeout",
    "server-freeze": "the primary's PostgreSQL stopped (SIGSTOP) for 3 x the timeout",
    "isolated": (
        "the primary's node and PostgreSQL, in a network namespace of their own, cut from "
        "everything for 20 s (root)"
    ),
}
# How long the primary stays cut off (fault "isolated").
CUT_SECONDS = 20.0


@dataclass(frozen=True)
class Options:
    runs: int
    timeout: float
    interval: float
    fault: str = "crash"

    @property
    def target(self) -> float:
        return self.timeout + TARGET_MARGIN_SECONDS

    def node_env(self) -> dict[str, str]:
        """What every node start gets: the heartbeat the bench runs with."""
        return {
            "HA_HEARTBEAT_INTERVAL": f"{self.interval:g}",
            "HA_HEARTBEAT_TIMEOUT": f"{self.timeout:g}",
        }


def parse_args(argv: Sequence[str] | None) -> Options:
    from rig.ha import INTERVAL, TIMEOUT

    default = "of the nodes (default: rig.ha's, {:g} s)"
    parser = harness.parser(
        __doc__,
        runs=(harness.positive_int, RUNS, "failovers"),
        timeout=(
            harness.positive_float,
            TIMEOUT,
            "HA_HEARTBEAT_TIMEOUT " + default.format(TIMEOUT),
        ),
        interval=(
            harness.positive_float,
            INTERVAL,
            "HA_HEARTBEAT_INTERVAL " + default.format(INTERVAL),
        ),
    )
    parser.add_argument(
        "--fault", choices=sorted(FAULTS), default="crash", help="what happens to the primary"
    )
    args = parser.parse_args(argv)
    if args.timeout < 2 * args.interval:
        parser.error(
            f"--timeout ({args.timeout:g} s) must be at least twice --interval "
            f"({args.interval:g} s), as the node requires"
        )
    return Options(runs=args.runs, timeout=args.timeout, interval=args.interval, fault=args.fault)


# --- the publishing client ----------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One publish request: its payload, when it was sent and answered
    (time.time()), the status (0: no answer) and the stored ids."""

    payload: str
    sent: float
    answered: float
    status: int
    ids: tuple[int, ...]
    # The start of a body other than a 201's.
    detail: str = ""


class Publisher(threading.Thread):
    """Publishes bench-failover-0, -1, … one at a time through the API, each
    retried until answered 201 (what a client of a failing-over server does),
    and keeps every answer."""

    def __init__(self, web: WebServer) -> None:
        super().__init__(daemon=True, name="publisher")
        self.web = web
        self.answers: list[Answer] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        number = 0
        try:
            while not self.stopping.is_set():
                payload = f"{PAYLOAD_PREFIX}-{number}"
                sent = time.time()
                status, body = self.web.publish(QUEUE, payload)
                ids: tuple[int, ...] = ()
                detail = ""
                if status == 201 and isinstance(body, dict):
                    ids = tuple(int(i) for i in body.get("ids", ()))
                else:
                    detail = str(body)[:300]
                self.answers.append(Answer(payload, sent, time.time(), status, ids, detail))
                if status == 201:
                    number += 1
                else:
                    time.sleep(0.05)
        except BaseException as error:  # reported by the bench's own thread
            self.error = error

    def snapshot(self) -> list[Answer]:
        if self.error is not None:
            raise harness.BenchError(f"the publishing client failed: {self.error!r}")
        return list(self.answers)

    def acked(self) -> list[Answer]:
        return [answer for answer in self.snapshot() if answer.status == 201]

    def stop(self) -> None:
        stop_publisher(self)


# --- one failover ---------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    index: int
    killed: str
    promoted: str
    # (a) kill -> the standby's node took the primary role.
    failover: float
    # (b) kill -> the demo consumer is handed the first message published
    # after the kill (once the old primary's PostgreSQL was dead); and ->
    # that message's DLVD (updated_at of the ack).
    first_delivery: float
    first_delivery_dlvd: float
    # (c) the longest time between two 201s, from the last before the kill
    # until publishing resumed; and kill -> the first 201 of a request sent
    # once the old primary's PostgreSQL was dead.
    publish_gap: float
    first_ack: float
    # From the first SIGKILL (the node's) to its PostgreSQL dead.
    kill_span: float
    # Answers other than 201 during the failover, by status (0: no answer).
    failed: dict[str, int]
    # Restart of the killed node -> both roles back and synchronous; the
    # longest time between two 201s meanwhile.
    rejoin: float
    rejoin_gap: float


@dataclass
class Roles:
    primary: NodeProcess
    standby: NodeProcess

    def swap(self) -> None:
        self.primary, self.standby = self.standby, self.primary


def wait_synchronous(pair: Pair, roles: Roles, timeout: float) -> None:
    """Both roles as wanted, the primary's mode synchronous."""
    try:
        pair.wait_roles(
            {roles.primary.name: "primary", roles.standby.name: "standby"}, timeout=timeout
        )
    except AssertionError as error:
        raise harness.BenchError(str(error)) from None
    try:
        harness.wait_for(
            lambda: (roles.primary.status() or {}).get("mode") == "synchronous",
            timeout=SYNCHRONOUS_TIMEOUT_SECONDS,
            interval=POLL_SECONDS,
            what=f"{roles.primary.name} to replicate synchronously",
        )
    except harness.BenchError as error:
        raise harness.BenchError(f"{error}\n{pair.logs()}") from None


def warm_up(publisher: Publisher, interval: float) -> None:
    count = len(publisher.acked())
    started = time.monotonic()
    harness.wait_for(
        lambda: len(publisher.acked()) >= count + WARMUP_ACKS
        and time.monotonic() - started >= WARMUP_SECONDS,
        timeout=RESUME_TIMEOUT_SECONDS,
        interval=POLL_SECONDS,
        what=f"{WARMUP_ACKS} publishes before the kill",
    )
    time.sleep(random.uniform(0, interval))


def wait_promoted(pair: Pair, standby: NodeProcess, killed: float, options: Options) -> float:
    """time.time() when ``standby``'s node took the primary role: the poll
    that first sees it, less the ``since_seconds`` the node gives for its
    role (so the poll's period does not count)."""
    deadline = time.monotonic() + options.timeout + FAILOVER_GRACE_SECONDS
    while True:
        status = standby.status()
        now = time.time()
        if status is not None and status.get("role") == "primary":
            return max(killed, now - float(status.get("since_seconds") or 0.0))
        if time.monotonic() > deadline:
            raise harness.BenchError(
                f"{standby.name} was not primary {time.monotonic() - deadline:.0f} s past "
                f"{options.timeout:g} + {FAILOVER_GRACE_SECONDS:g} s after the kill "
                f"(last status {status})\n{pair.logs()}"
            )
        time.sleep(STATUS_POLL_SECONDS)


def acked_after(answers: list[Answer], dead: float) -> dict[int, str]:
    """Message id -> payload of the publishes answered 201 whose request was
    sent once the old primary's PostgreSQL was dead."""
    return {
        message_id: answer.payload
        for answer in answers
        if answer.status == 201 and answer.sent > dead
        for message_id in answer.ids
    }


def first_delivery(
    publisher: Publisher, workers: Workers, dead: float
) -> tuple[dict[str, Any], str] | None:
    """The earliest delivery (the demo consumer's record) of a message
    published once the old primary's PostgreSQL was dead, with its payload."""
    published = acked_after(publisher.snapshot(), dead)
    seen = [
        record
        for record in workers.records()
        if record["id"] in published and float(record["time"]) > dead
    ]
    if not seen:
        return None
    first = min(seen, key=lambda record: float(record["time"]))
    return first, published[first["id"]]


def wait_first_delivery(
    pair: Pair, publisher: Publisher, workers: Workers, dead: float
) -> tuple[dict[str, Any], str]:
    try:
        harness.wait_for(
            lambda: first_delivery(publisher, workers, dead),
            timeout=DELIVERY_TIMEOUT_SECONDS,
            interval=POLL_SECONDS,
            what="a message published after the kill to be delivered",
        )
    except harness.BenchError as error:
        raise harness.BenchError(
            f"{error}\n--- deliveries worker\n{workers.log('deliveries')[-LOG_TAIL:]}\n"
            f"--- control worker\n{workers.log('control')[-LOG_TAIL:]}\n{pair.logs()}"
        ) from None
    # A message published later may have been delivered earlier by another
    # process; its record is in the file by now.
    time.sleep(RECHECK_SECONDS)
    found = first_delivery(publisher, workers, dead)
    assert found is not None
    return found


def wait_dlvd(pair: Pair, node: NodeProcess, message_id: int, payload: str) -> float:
    """time.time() of the message's DLVD in ``node``'s store (its
    updated_at: the ack's transaction)."""

    def dlvd() -> float | None:
        rows = node.cluster.query(FIRST_DLVD_SQL, [message_id, payload])
        if not rows:
            raise harness.BenchError(
                f"message {message_id} ({payload}), delivered after the failover, is not in "
                f"{node.name}'s store"
            )
        state, updated = rows[0]
        return float(updated) if state == "DLVD" else None

    try:
        return float(
            harness.wait_for(
                dlvd,
                timeout=DELIVERY_TIMEOUT_SECONDS,
                interval=POLL_SECONDS,
                what=f"message {message_id} to be DLVD in {node.name}'s store",
            )
        )
    except harness.BenchError as error:
        raise harness.BenchError(f"{error}\n{pair.logs()}") from None


def longest_gap(answers: list[Answer], start: float, end: float) -> float:
    """The longest time between two consecutive 201s, from the last 201
    answered at or before ``start`` to the last answered by ``end``."""
    times = [answer.answered for answer in answers if answer.status == 201]
    before = [t for t in times if t <= start]
    window = [before[-1]] if before else []
    window += [t for t in times if start < t <= end]
    return max((b - a for a, b in itertools.pairwise(window)), default=0.0)


def failover_once(
    index: int,
    pair: Pair,
    roles: Roles,
    publisher: Publisher,
    workers: Workers,
    options: Options,
) -> RunResult:
    """One fault of the primary: time the failover, the first delivery and
    the publish gap, then end the fault and time the rejoin."""
    primary, standby = roles.primary, roles.standby
    warm_up(publisher, options.interval)
    killed = time.time()
    frozen = inject(options.fault, pair, primary)
    # Until its PostgreSQL is dead or stopped, the old primary may still
    # commit, and acknowledge, a publish.
    dead = time.time()
    harness.log(
        f"run {index}: {options.fault} of node {primary.name}, its PostgreSQL out "
        f"{dead - killed:.3f} s later"
    )
    promoted = wait_promoted(pair, standby, killed, options)
    harness.log(f"run {index}: {standby.name} primary after {promoted - killed:.3f} s")
    record, payload = wait_first_delivery(pair, publisher, workers, dead)
    delivered = float(record["time"])
    harness.log(
        f"run {index}: first message published after the kill ({payload}, id {record['id']}) "
        f"handed to the consumer after {delivered - killed:.3f} s"
    )
    resumption = wait_resumed(index, pair, standby, publisher, record, payload, killed, dead)
    rejoin, rejoin_gap = end_and_rejoin(index, pair, roles, publisher, options, frozen, killed)
    return RunResult(
        index=index,
        killed=primary.name,
        promoted=standby.name,
        failover=promoted - killed,
        first_delivery=delivered - killed,
        first_delivery_dlvd=resumption.dlvd - killed,
        publish_gap=resumption.gap,
        first_ack=resumption.first_ack - killed,
        kill_span=dead - killed,
        failed=resumption.failed,
        rejoin=rejoin,
        rejoin_gap=rejoin_gap,
    )


@dataclass(frozen=True)
class Resumption:
    """How publishing came back after a fault: the first delivered
    message's DLVD time, the first 201 of a request sent after the kill, the
    longest gap between two 201s, and the other answers meanwhile."""

    dlvd: float
    first_ack: float
    gap: float
    failed: dict[str, int]


def wait_resumed(
    index: int,
    pair: Pair,
    standby: NodeProcess,
    publisher: Publisher,
    record: dict[str, Any],
    payload: str,
    killed: float,
    dead: float,
) -> Resumption:
    harness.wait_for(
        lambda: sum(
            1 for answer in publisher.snapshot() if answer.status == 201 and answer.sent > dead
        )
        >= RESUMED_ACKS,
        timeout=RESUME_TIMEOUT_SECONDS,
        interval=POLL_SECONDS,
        what=f"{RESUMED_ACKS} publishes after the kill",
    )
    dlvd = wait_dlvd(pair, standby, int(record["id"]), payload)
    resumed = time.time()
    answers = publisher.snapshot()
    first_ack = min(a.answered for a in answers if a.status == 201 and a.sent > dead)
    failures = [a for a in answers if a.status != 201 and killed < a.answered <= resumed]
    failed = collections.Counter(str(a.status) for a in failures)
    for status in sorted(failed):
        example = next(a for a in failures if str(a.status) == status)
        harness.log(f"run {index}: a {status} answer during the failover: {example.detail}")
    gap = longest_gap(answers, killed, resumed)
    harness.log(
        f"run {index}: publish gap {gap:.3f} s, first 201 after {first_ack - killed:.3f} s; "
        f"answers other than 201: {dict(failed) or 'none'}"
    )
    return Resumption(dlvd=dlvd, first_ack=first_ack, gap=gap, failed=dict(failed))


def end_and_rejoin(
    index: int,
    pair: Pair,
    roles: Roles,
    publisher: Publisher,
    options: Options,
    frozen: list[int],
    killed: float,
) -> tuple[float, float]:
    """End the fault (once it lasted its time); the old primary rejoins as
    standby by itself. How long that took, and the longest publish gap
    meanwhile."""
    primary = roles.primary
    if frozen or options.fault == "isolated":
        lasts = CUT_SECONDS if options.fault == "isolated" else 3 * options.timeout
        time.sleep(max(0.0, killed + lasts - time.time()))
    rejoin_started = time.time()
    end_fault(options, pair, primary, frozen)
    roles.swap()
    wait_synchronous(pair, roles, REJOIN_TIMEOUT_SECONDS)
    rejoined = time.time()
    rejoin_gap = longest_gap(publisher.snapshot(), rejoin_started, rejoined)
    harness.log(
        f"run {index}: {primary.name} back as synchronous standby after "
        f"{rejoined - rejoin_started:.1f} s (longest publish gap meanwhile {rejoin_gap:.3f} s)"
    )
    return rejoined - rejoin_started, rejoin_gap


def inject(fault: str, pair: Pair, primary: NodeProcess) -> list[int]:
    """Hit ``primary`` with ``fault``; the processes it stopped (SIGSTOP)."""
    if fault == "crash":
        primary.kill()
        primary.cluster.kill()
        return []
    if fault == "isolated":
        assert pair.network is not None
        pair.network.isolate(primary.name)
        return []
    if fault == "freeze":
        primary.signal(signal.SIGSTOP)
    return primary.cluster.freeze()


def end_fault(options: Options, pair: Pair, primary: NodeProcess, frozen: list[int]) -> None:
    if options.fault == "crash":
        primary.start(**options.node_env())
        return
    if options.fault == "isolated":
        assert pair.network is not None
        pair.network.heal()
        return
    primary.cluster.thaw(frozen)
    if options.fault == "freeze":
        primary.signal(signal.SIGCONT)


# --- zero loss ----------------------------------------------------------------------


@dataclass(frozen=True)
class Loss:
    acknowledged: int
    found: int
    lost: list[str]
    # Stored though never answered 201 (the answer was lost in a failover),
    # and payloads stored more than once (a retry of such a publish).
    unacknowledged_stored: int
    duplicates: int
    requests: int
    final_primary: str
    # The queue's messages by state in the final primary's store, at the end.
    states: dict[str, int]


def check_loss(pair: Pair, node: NodeProcess, publisher: Publisher) -> Loss:
    answers = publisher.snapshot()
    acked = [answer.payload for answer in answers if answer.status == 201]
    stored = [row[0] for row in node.cluster.query(PAYLOADS_SQL, [QUEUE])]
    present = set(stored)
    lost = [payload for payload in acked if payload not in present]
    return Loss(
        acknowledged=len(acked),
        found=len(acked) - len(lost),
        lost=lost,
        unacknowledged_stored=len(present - set(acked)),
        duplicates=len(stored) - len(present),
        requests=len(answers),
        final_primary=node.name,
        states=settled_states(node),
    )


def settled_states(node: NodeProcess) -> dict[str, int]:
    """The queue's messages by state once nothing is waiting or in flight
    (or after SETTLE_SECONDS)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        states = {
            str(state): int(count) for state, count in node.cluster.query(STATES_SQL, [QUEUE])
        }
        if not {"TBDL", "DLNG"} & states.keys() or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


# --- set-up -------------------------------------------------------------------------


@dataclass
class Figures:
    runs: list[RunResult]
    loss: Loss
    durability: dict[str, dict[str, str]]
    replication: dict[str, str]
    setup_seconds: float
    # Handler calls the demo consumer recorded (more than the messages:
    # redeliveries).
    deliveries: int
    # The web's log: each distinct exception line, how many times.
    web_errors: dict[str, int] = field(default_factory=dict)


def clusters_durability(
    pair: Pair, primary: NodeProcess
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each cluster's durability settings (both must be durable), and the
    primary's replication settings."""
    durability = {node.name: harness.read_durability(node.cluster.url) for node in pair.nodes}
    weak = {name: found for name, found in durability.items() if found["profile"] != "durable"}
    if weak:
        raise harness.BenchError(f"the clusters are not durable: {weak}")
    [(names,)] = primary.cluster.query("SHOW synchronous_standby_names")
    return durability, {
        "mode": str((primary.status() or {}).get("mode")),
        "synchronous_standby_names": str(names),
    }


def make_queue(pair: Pair) -> None:
    """The bench's queue, consumer demo, made through the queue service in a
    process that loads the demo's consumer module (the web, which only
    publishes, does not: its API would refuse the consumer's name)."""
    from rig.ha import shell

    code = "from broker.services.queues import queue_create; "
    code += f"queue_create(name={QUEUE!r}, consumer='demo')"
    try:
        shell({**pair.app_env(), "LAZARETTO_CONSUMER_MODULES": "demo_consumers"}, code)
    except AssertionError as error:
        raise harness.BenchError(f"creating {QUEUE}: {str(error)[-LOG_TAIL:]}") from None


@contextlib.contextmanager
def running_pair(directory: Path, options: Options) -> Iterator[tuple[Pair, Roles]]:
    """A private redis-server and the durable pair, A primary and B its
    synchronous standby (each in a network namespace of its own for the
    fault "isolated"); everything stopped and removed on the way out."""
    from rig import netns
    from rig.ha import ha_pair
    from rig.processes import RedisServer

    with contextlib.ExitStack() as stack:
        network = None
        if options.fault == "isolated":
            why = netns.available()
            if why:
                raise harness.BenchError(f"--fault isolated needs network namespaces: {why}")
            network = stack.enter_context(netns.network("A", "B"))
        redis = RedisServer(directory, host=network.host_address if network else "127.0.0.1")
        stack.callback(redis.stop)
        redis.start()
        pair = stack.enter_context(
            ha_pair(redis.url, dump_dir=directory / "dumps", durable=True, network=network)
        )
        roles = Roles(primary=pair.a, standby=pair.b)
        pair.a.start(**options.node_env())
        pair.b.start(**options.node_env())
        wait_synchronous(pair, roles, REJOIN_TIMEOUT_SECONDS)
        yield pair, roles


@contextlib.contextmanager
def clients(pair: Pair, directory: Path) -> Iterator[tuple[WebServer, Workers, Publisher]]:
    """gunicorn on the pair's URL, Celery workers (the demo consumer, no
    beat: the primary node sends the duties) and the publishing client."""
    from rig.ha import SECRET, WebServer
    from rig.processes import Workers

    # rig.processes.Workers reads the test database's URL from Django's
    # settings before extra_env replaces it: give this process settings
    # that name the pair.
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = pair.app_url
    os.environ.setdefault("SECRET_KEY", SECRET)
    web = WebServer(pair.app_env(), directory / "web.log")
    workers = Workers(
        directory / "workers",
        pair.redis_url,
        beat=False,
        extra_env={"DATABASE_URL": pair.app_url, "DEBUG": "0", "SECRET_KEY": SECRET},
    )
    (directory / "workers").mkdir()
    publisher = Publisher(web)
    # Each stop is registered before its start and runs whatever the others do.
    with contextlib.ExitStack() as stack:
        make_queue(pair)
        stack.callback(web.stop)
        web.start()
        stack.callback(workers.stop)
        workers.start()
        stack.callback(stop_publisher, publisher)
        publisher.start()
        yield web, workers, publisher


def stop_publisher(publisher: Publisher) -> None:
    publisher.stopping.set()
    if publisher.is_alive():
        publisher.join(timeout=30)


def run_all(options: Options) -> Figures:
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp,
        running_pair(Path(tmp), options) as (pair, roles),
        clients(pair, Path(tmp)) as (web, workers, publisher),
    ):
        durability, replication = clusters_durability(pair, roles.primary)
        harness.record_environment(durability[roles.primary.name])
        profiles = ", ".join(f"{name} {found['profile']}" for name, found in durability.items())
        print(
            f"replication: {replication['mode']} "
            f"(synchronous_standby_names {replication['synchronous_standby_names']}); "
            f"clusters: {profiles}",
            flush=True,
        )
        setup = time.monotonic() - started
        harness.log(f"pair, web and workers up in {setup:.1f} s")
        results = []
        for index in range(1, options.runs + 1):
            results.append(failover_once(index, pair, roles, publisher, workers, options))
        publisher.stop()
        loss = check_loss(pair, roles.primary, publisher)
        deliveries = len(workers.records())
        web_errors = exception_lines(web.log)
    return Figures(
        runs=results,
        loss=loss,
        durability=durability,
        replication=replication,
        setup_seconds=setup,
        deliveries=deliveries,
        web_errors=web_errors,
    )


def exception_lines(path: Path) -> dict[str, int]:
    """The last line of each traceback in a log (``psycopg.OperationalError:
    …``), cut at 200 characters, with how often it came."""
    if not path.exists():
        return {}
    found = collections.Counter(
        line[:200]
        for line in path.read_text(errors="replace").splitlines()
        if EXCEPTION_LINE.match(line)
    )
    return dict(found.most_common(10))


# --- report ---------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "runs": [round(value, 3) for value in values],
    }


# JSON key: (RunResult attribute, what it times).
FIGURES = {
    "failover_s": ("failover", "kill -> the standby's node reports primary"),
    "first_delivery_s": ("first_delivery", "kill -> first message published after it delivered"),
    "first_delivery_dlvd_s": ("first_delivery_dlvd", "kill -> that message DLVD (its ack)"),
    "publish_gap_s": ("publish_gap", "longest time between two 201s around the kill"),
    "first_ack_s": ("first_ack", "kill -> first 201 of a request sent after it"),
    "kill_s": ("kill_span", "the fault -> its PostgreSQL dead or stopped"),
    "rejoin_s": ("rejoin", "the fault's end -> back as synchronous standby (healed)"),
    "rejoin_publish_gap_s": ("rejoin_gap", "longest time between two 201s while rejoining"),
}


def summary(options: Options, figures: Figures, seconds: float) -> dict[str, Any]:
    runs, loss = figures.runs, figures.loss
    failover_max = max(run.failover for run in runs)
    return {
        "bench": "failover",
        "fault": options.fault,
        "runs": options.runs,
        "heartbeat": {"interval_s": options.interval, "timeout_s": options.timeout},
        **{key: spread([getattr(run, attr) for run in runs]) for key, (attr, _) in FIGURES.items()},
        "killed": [run.killed for run in runs],
        "failed_answers": [run.failed for run in runs],
        "publishes": {
            "requests": loss.requests,
            "acknowledged": loss.acknowledged,
            "found": loss.found,
            "lost": len(loss.lost),
            "unacknowledged_stored": loss.unacknowledged_stored,
            "duplicates": loss.duplicates,
            "final_primary": loss.final_primary,
            "states": loss.states,
            "deliveries_recorded": figures.deliveries,
        },
        "web_errors": figures.web_errors,
        "clocks": {
            "kill": "time.time() just before the primary's node is SIGKILLed (its PostgreSQL "
            "next); 'after the kill' for a publish means its request was sent once that "
            "PostgreSQL was dead",
            "failover": "the standby's role as primary, from its status (answer time less "
            "since_seconds), polled every 20 ms",
            "first_delivery": "the demo consumer's record (time.time() as the handler is "
            "called) of the first message whose publish was sent after the kill and answered 201",
            "first_delivery_dlvd": "that message's updated_at in the new primary's store once "
            "DLVD (the ack transaction's now())",
            "publish_gap": "answer times of the client's 201s, from the last before the kill to "
            f"{RESUMED_ACKS} 201s after it",
        },
        "durability_clusters": figures.durability,
        "replication": figures.replication,
        "targets": {"failover_max_s": options.target, "lost": 0},
        "failover_within_target": failover_max <= options.target,
        "zero_loss": not loss.lost,
        "setup_s": round(figures.setup_seconds, 1),
        "total_s": round(seconds, 1),
    }


def print_report(options: Options, figures: Figures, seconds: float) -> None:
    runs, loss = figures.runs, figures.loss
    harness.title(
        f"failover bench: {options.runs} run{'s' if options.runs > 1 else ''}, "
        f"heartbeat every {options.interval:g} s, "
        f"timeout {options.timeout:g} s (HA_HEARTBEAT_INTERVAL / HA_HEARTBEAT_TIMEOUT); "
        f"fault {options.fault}: {FAULTS[options.fault]}; the old primary then rejoins",
        "one API client publishing one message per request; Celery workers, consumer demo",
    )
    rows = []
    for key, (attr, what) in FIGURES.items():
        values = [getattr(run, attr) for run in runs]
        spread = (min(values), statistics.median(values), max(values))
        rows.append([key, *(f"{value:.3f}" for value in spread), what])
    harness.table(["figure", "min", "median", "max", "what"], rows, align="<>>><")
    print()
    for run in runs:
        print(
            f"run {run.index}: killed {run.killed}, {run.promoted} primary after "
            f"{run.failover:.3f} s; delivered {run.first_delivery:.3f} s; gap "
            f"{run.publish_gap:.3f} s; rejoin {run.rejoin:.1f} s; failed answers "
            f"{run.failed or 'none'}"
        )
    print()
    failover_max = max(run.failover for run in runs)
    print(
        f"failover max {failover_max:.3f} s  target <= {options.target:g} s "
        f"(heartbeat timeout {options.timeout:g} s + {TARGET_MARGIN_SECONDS:g} s) "
        f"{harness.verdict(failover_max <= options.target)}"
    )
    print_loss(loss, figures)
    print(f"total {seconds:.0f} s (set-up {figures.setup_seconds:.0f} s)")
    harness.print_figures(summary(options, figures, seconds))


def print_loss(loss: Loss, figures: Figures) -> None:
    print(
        f"publishes: {loss.acknowledged} acknowledged (201), {loss.found} found in "
        f"{loss.final_primary}'s store, {len(loss.lost)} lost  target lost == 0 "
        f"{'PASS' if not loss.lost else 'FAIL'}"
    )
    print(
        f"  {loss.requests} requests; stored without a 201 {loss.unacknowledged_stored}, "
        f"stored twice {loss.duplicates}; queue at the end {loss.states}"
    )
    if loss.lost:
        print(f"  lost: {loss.lost[:20]}")
    print(f"  the demo consumer was called {figures.deliveries} times")
    for line, count in figures.web_errors.items():
        print(f"  web log, {count}x: {line}")


# --- driver -----------------------------------------------------------------------------


def interrupted(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C or SIGTERM: stop measuring; the clean-up that follows is not
    interrupted again."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    options = parse_args(argv)
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        figures = run_all(options)
    except (harness.BenchError, AssertionError) as error:
        harness.log(f"bench failed: {error}")
        return 1
    except KeyboardInterrupt:
        harness.log("interrupted: every process stopped")
        return 130
    print_report(options, figures, harness.since(started))
    return 1 if figures.loss.lost else 0


if __name__ == "__main__":
    sys.exit(main())
