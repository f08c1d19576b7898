"""The HA pair with real processes: two PostgreSQL clusters, two broker nodes,
gunicorn on the multi-host URL, Celery workers; nodes and servers killed,
stopped and restarted."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.ha import wire
from tests.ha_harness import TIMEOUT, Pair, WebServer, WritableProbe, ha_pair
from tests.harness import ROOT, RedisServer, Workers, wait_until

pytestmark = pytest.mark.slow

QUEUE = "HA.ORDERS"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        with ha_pair(redis.url, dump_dir=tmp_path / "dumps") as made:
            yield made
    finally:
        redis.stop()


def start_pair(pair: Pair) -> None:
    pair.a.start()
    pair.b.start()
    pair.wait_roles({"A": "primary", "B": "standby"})
    wait_until(
        lambda: (pair.a.status() or {}).get("mode") == "synchronous",
        timeout=30,
        what="synchronous replication",
    )


def shell(env: dict[str, str], code: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def make_queue(env: dict[str, str]) -> None:
    shell(
        env,
        "from broker.models import Queue; "
        f"Queue.objects.get_or_create(name={QUEUE!r}, defaults={{'consumer': 'demo'}})",
    )


class Publisher(threading.Thread):
    """Publishes p-0, p-1, … one at a time through the API, each retried
    until answered 201 (what a client of a failing-over server does)."""

    def __init__(self, web: WebServer) -> None:
        super().__init__(daemon=True)
        self.web = web
        self.acked: list[str] = []
        self.ack_times: list[float] = []
        self.failures = 0
        self.longest_gap = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        number = 0
        last_ack = time.monotonic()
        while not self.stopping.is_set():
            payload = f"p-{number}"
            status, _ = self.web.publish(QUEUE, payload)
            if status == 201:
                now = time.monotonic()
                self.longest_gap = max(self.longest_gap, now - last_ack)
                last_ack = now
                self.acked.append(payload)
                self.ack_times.append(now)
                number += 1
            else:
                self.failures += 1
                time.sleep(0.05)

    def gap_around(self, start: float, end: float) -> float:
        """The longest time without a 201, from the last one before ``start``
        to the first after ``end``."""
        times = list(self.ack_times)
        before = [t for t in times if t < start][-1:]
        inside = [t for t in times if start <= t <= end]
        after = [t for t in times if t > end][:1]
        window = before + inside + after
        return max((b - a for a, b in itertools.pairwise(window)), default=0.0)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


def serve_the_pair(pair: Pair, tmp_path: Path) -> tuple[WebServer, Workers]:
    """The pair started and synchronous, the test queue made, gunicorn and
    Celery workers on its multi-host URL, their store waits bounded by the
    heartbeat timeout."""
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    workers = Workers(
        tmp_path,
        pair.redis_url,
        beat=False,
        extra_env={"DATABASE_URL": pair.app_url, "LAZARETTO_STORE_TIMEOUT_SECONDS": str(TIMEOUT)},
    )
    workers.start()
    return web, workers


def payloads_in(pair: Pair, cluster_name: str) -> list[str]:
    cluster = pair.a.cluster if cluster_name == "A" else pair.b.cluster
    rows = cluster.query(
        "SELECT convert_from(m.payload, 'UTF8') FROM broker_message m "
        "JOIN broker_queue q ON q.id = m.queue_id WHERE q.name = %s",
        [QUEUE],
    )
    return [row[0] for row in rows]


def test_failover_keeps_every_acknowledged_publish_and_the_old_primary_rejoins(
    pair: Pair, tmp_path: Path
) -> None:
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    workers = Workers(
        tmp_path, pair.redis_url, beat=False, extra_env={"DATABASE_URL": pair.app_url}
    )
    workers.start()
    publisher = Publisher(web)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 50, timeout=60, what="publishing")
        acked_before = len(publisher.acked)

        killed = time.monotonic()
        pair.a.kill()
        pair.a.cluster.kill()
        pair.wait_roles({"B": "primary"}, timeout=TIMEOUT + 20)
        took = time.monotonic() - killed
        # The target is the heartbeat timeout + 2 s; the status is polled
        # every 0.1 s.
        assert took <= TIMEOUT + 2 + 0.3, f"failover took {took:.1f}s\n{pair.logs()}"

        wait_until(
            lambda: len(publisher.acked) >= acked_before + 30,
            timeout=60,
            what=f"publishing to resume\n{web.log.read_text()[-3000:]}",
        )
        publisher.stop()
        stored = set(payloads_in(pair, "B"))
        missing = [p for p in publisher.acked if p not in stored]
        assert not missing, f"{len(missing)} acknowledged publish(es) lost: {missing[:10]}"

        # The workers, on the new primary, deliver everything.
        def all_delivered() -> bool:
            [(waiting,)] = pair.b.cluster.query(
                "SELECT count(*) FROM broker_message WHERE state <> 'DLVD'"
            )
            return waiting == 0

        wait_until(all_delivered, timeout=90, what="every message delivered")
        delivered = {r["id"] for r in workers.records()}
        stored_ids = {row[0] for row in pair.b.cluster.query("SELECT id FROM broker_message")}
        assert stored_ids <= delivered

        # A comes back: it rejoins as standby; while it synchronises, a
        # configuration change is refused with the error, afterwards it works.
        pair.a.start()
        wait_until(
            lambda: pair.role_of(pair.a) == "synchronising",
            timeout=60,
            interval=0.05,
            what=f"A synchronising\n{pair.logs()}",
        )
        answers: list[tuple[int, Any]] = []

        def config_change() -> tuple[int, Any]:
            name = f"HA.NEW.{len(answers)}"
            answers.append(
                web.request("POST", "/api/v1/queues/", {"name": name, "consumer": "noop"})
            )
            return answers[-1]

        try:
            refused = wait_until(
                lambda: (lambda r: r if r[0] == 409 else None)(config_change()),
                timeout=30,
                interval=0.05,
                what="a configuration change refused",
            )
        except AssertionError as error:
            raise AssertionError(
                f"{error}: {answers[:3]} … {answers[-3:]}\n{pair.logs()}"
            ) from None
        assert refused[1]["code"] == "ha_synchronising"
        assert "synchronisation" in refused[1]["detail"]
        pair.wait_roles({"A": "standby", "B": "primary"}, timeout=90)
        wait_until(
            lambda: (pair.b.status() or {}).get("mode") == "synchronous",
            timeout=30,
            what="synchronous again",
        )
        wait_until(
            lambda: web.request(
                "POST", "/api/v1/queues/", {"name": "HA.AFTER", "consumer": "noop"}
            )[0]
            == 201,
            timeout=10,
            what="the configuration change to go through",
        )
        [(epoch,)] = pair.b.cluster.query("SELECT epoch FROM broker_hapair")
        kinds = [row[0] for row in pair.b.cluster.query("SELECT kind FROM broker_haevent")]
        assert "failover" in kinds
        actions = {row[0] for row in pair.b.cluster.query("SELECT action FROM broker_auditevent")}
        assert "ha.failover" in actions
        assert epoch >= 2
    finally:
        publisher.stopping.set()
        workers.stop()
        web.stop()


def test_a_second_node_of_a_live_name_refuses_to_start(pair: Pair) -> None:
    start_pair(pair)
    same_address = pair.a.manage("broker_node", "--name", "A", timeout=60)
    assert same_address.returncode != 0
    assert "Is a node already running there?" in same_address.stderr

    elsewhere = subprocess.run(
        [sys.executable, "manage.py", "broker_node", "--name", "A"],
        cwd=ROOT,
        env={**pair.a.env, "HA_LISTEN": f"127.0.0.1:{pair.a.listen + 1}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert elsewhere.returncode != 0
    assert "a node named 'A' is already live" in elsewhere.stderr

    unknown = pair.a.manage("broker_node", "resolve", "--primary", "C", "--address", pair.a.address)
    assert unknown.returncode != 0
    assert "no node named 'C'" in unknown.stderr


def test_switchover_under_traffic_loses_nothing(pair: Pair, tmp_path: Path) -> None:
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    publisher = Publisher(web)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 30, timeout=60, what="publishing")
        done = pair.a.manage("broker_node", "switchover", "--address", pair.a.address)
        assert done.returncode == 0, done.stderr + pair.logs()
        pair.wait_roles({"A": "standby", "B": "primary"}, timeout=60)
        count = len(publisher.acked)
        wait_until(lambda: len(publisher.acked) >= count + 30, timeout=60, what="publishing again")
        publisher.stop()
        stored = payloads_in(pair, "B")
        assert set(publisher.acked) <= set(stored)
        # Nothing twice, beyond a publish committed while its session was
        # ended by the switch (the client saw an error, and retried it).
        assert len(stored) - len(set(stored)) <= publisher.failures
        assert len(stored) <= len(publisher.acked) + publisher.failures
        kinds = [row[0] for row in pair.b.cluster.query("SELECT kind FROM broker_haevent")]
        assert "switchover" in kinds
    finally:
        publisher.stopping.set()
        web.stop()


def test_a_stale_primary_runs_no_duty(pair: Pair, tmp_path: Path) -> None:
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    [(old_epoch,)] = pair.a.cluster.query("SELECT epoch FROM broker_hapair")

    pair.a.signal(signal.SIGSTOP)
    try:
        pair.wait_roles({"B": "primary"}, timeout=TIMEOUT + 20)
    finally:
        pair.a.signal(signal.SIGCONT)
    resumed = time.monotonic()
    [(new_epoch,)] = pair.b.cluster.query("SELECT epoch FROM broker_hapair")
    assert new_epoch > old_epoch
    pair.wait_roles({"A": "standby", "B": "primary"}, timeout=90)
    log = pair.a.log.read_text()
    assert "discovering again" in log
    after_resume = log[log.index("discovering again") :]
    assert f"sending under epoch {old_epoch}" not in after_resume
    assert time.monotonic() - resumed < 90

    # A duty of the old epoch, run against the pair, changes nothing; the
    # same duty under the current epoch does its work.
    lease = (
        "from datetime import timedelta; from django.utils import timezone; "
        "from broker.models import Message, Queue; "
        f"q = Queue.objects.get(name={QUEUE!r}); "
        "m = Message.objects.create(queue=q, payload=b'leased', state='DLNG', attempts=1, "
        "lease_owner='gone', lease_deadline=timezone.now() - timedelta(seconds=60)); print(m.id)"
    )
    message_id = int(shell(env, lease))
    state = f"from broker.models import Message; print(Message.objects.get(id={message_id}).state)"
    shell(env, f"from workers.tasks import sweep; sweep(epoch={old_epoch})")
    assert shell(env, state) == "DLNG"
    shell(env, f"from workers.tasks import sweep; sweep(epoch={new_epoch})")
    assert shell(env, state) == "TBDL"


def test_split_brain_goes_to_maintenance_and_resolve_exports_the_losers_messages(
    pair: Pair, tmp_path: Path
) -> None:
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    # The web's token is made while both stores share everything.
    web = WebServer(env, tmp_path / "web.log")
    try:
        web.start()
        split_brain_and_resolve(pair, web)
    finally:
        web.stop()


def split_brain_and_resolve(pair: Pair, web: WebServer) -> None:
    pair.a.kill()
    pair.a.cluster.kill()
    pair.wait_roles({"B": "primary"}, timeout=TIMEOUT + 20)

    # A's server alone takes three publishes B never sees.
    a = pair.a.cluster
    a.start_alone()
    shell(
        {**pair.a.env, "DATABASE_URL": a.url},
        "from broker.services.publish import NewMessage, messages_publish; "
        f"messages_publish(queue_name={QUEUE!r}, "
        "messages=[NewMessage(payload=f'only-on-A-{i}'.encode()) for i in range(3)])",
    )
    a.stop()

    # A restarted standalone acts as primary while B is: both go to maintenance.
    pair.a.start(HA_STARTUP_MODE="standalone")
    pair.wait_roles({"A": "maintenance", "B": "maintenance"}, timeout=60)
    status, body = web.publish(QUEUE, "during split brain")
    assert status == 503, body
    assert body["code"] == "ha_maintenance"

    resolved = pair.b.manage(
        "broker_node", "resolve", "--primary", "B", "--address", pair.b.address
    )
    assert resolved.returncode == 0, resolved.stderr + pair.logs()
    pair.wait_roles({"A": "standby", "B": "primary"}, timeout=90)

    exports = pair.b.cluster.query("SELECT node, path, messages FROM broker_divergedexport")
    assert [(row[0], row[2]) for row in exports] == [("A", 3)]
    lines = [json.loads(line) for line in Path(exports[0][1]).read_text().splitlines()]
    assert sorted(base64.b64decode(doc["payload_base64"]).decode() for doc in lines) == [
        "only-on-A-0",
        "only-on-A-1",
        "only-on-A-2",
    ]
    assert "only-on-A-0" not in payloads_in(pair, "B")
    answers: list[tuple[int, Any]] = []

    def resumed() -> bool:
        answers.append(web.publish(QUEUE, "after resolve"))
        return answers[-1][0] == 201

    try:
        wait_until(resumed, timeout=30, what="service to resume")
    except AssertionError as error:
        raise AssertionError(f"{error}: last answer {answers[-1]}\n{pair.logs()}") from None
    kinds = {row[0] for row in pair.b.cluster.query("SELECT kind FROM broker_haevent")}
    assert {"split_brain", "resolved"} <= kinds


class Unavailability(threading.Thread):
    """Answers of the API to one client, polled every 50 ms: the 503s it
    saw, and the longest time with no success (a read that needs the store)."""

    def __init__(self, web: WebServer) -> None:
        super().__init__(daemon=True)
        self.web = web
        self.refusals: list[tuple[int, Any, float]] = []
        self.longest_gap = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        last_ok = time.monotonic()
        while not self.stopping.is_set():
            started = time.monotonic()
            status, body, headers = self.web.request_with_headers("GET", f"/api/v1/queues/{QUEUE}/")
            now = time.monotonic()
            if status == 200:
                self.longest_gap = max(self.longest_gap, now - last_ok)
                last_ok = now
            else:
                self.refusals.append((status, body, now - started))
                if status == 503:
                    assert headers.get("retry-after"), headers
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


def test_a_frozen_primary_fails_over_answers_503_meanwhile_and_rejoins_by_itself(
    pair: Pair, tmp_path: Path
) -> None:
    """The primary's machine freezes (its node and every process of its
    server stopped) for 3 times the heartbeat timeout: the API answers 503
    store_unavailable, never hangs, and writes again on the standby within
    the timeout + 2 s; after the thaw the old primary rewinds onto the new
    timeline and the pair is synchronous again within 60 s."""
    web, workers = serve_the_pair(pair, tmp_path)
    publisher = Publisher(web)
    reader = Unavailability(web)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 50, timeout=60, what="publishing")
        reader.start()
        time.sleep(1)

        pair.a.signal(signal.SIGSTOP)
        frozen = pair.a.cluster.freeze()
        try:
            time.sleep(3 * TIMEOUT)
        finally:
            pair.a.cluster.thaw(frozen)
            pair.a.signal(signal.SIGCONT)
        thawed = time.monotonic()
        assert pair.role_of(pair.b) == "primary", pair.logs()

        pair.wait_roles({"A": "standby", "B": "primary"}, timeout=60)
        wait_until(
            lambda: (pair.b.status() or {}).get("mode") == "synchronous",
            timeout=max(1.0, 60 - (time.monotonic() - thawed)),
            what=f"synchronous again\n{pair.logs()}",
        )
        acked = len(publisher.acked)
        wait_until(lambda: len(publisher.acked) >= acked + 20, timeout=30, what="publishing")
        publisher.stop()
        reader.stop()

        assert publisher.longest_gap <= TIMEOUT + 2 + 1, (
            f"publishing stopped for {publisher.longest_gap:.1f} s\n{web.log.read_text()[-3000:]}"
        )
        assert reader.longest_gap <= TIMEOUT + 2 + 1, (
            f"reads stopped for {reader.longest_gap:.1f} s"
        )
        assert reader.refusals, "the API never answered 503 during the freeze"
        assert {status for status, _, _ in reader.refusals} == {503}, reader.refusals[:5]
        assert {body["code"] for _, body, _ in reader.refusals} == {"store_unavailable"}
        assert max(took for _, _, took in reader.refusals) <= TIMEOUT + 2

        stored = payloads_in(pair, "B")
        missing = [p for p in publisher.acked if p not in set(stored)]
        assert not missing, f"{len(missing)} acknowledged publish(es) lost: {missing[:10]}"
        assert payloads_in(pair, "A") == stored or set(payloads_in(pair, "A")) >= set(
            publisher.acked
        )

        def all_delivered() -> bool:
            [(waiting,)] = pair.b.cluster.query(
                "SELECT count(*) FROM broker_message WHERE state <> 'DLVD'"
            )
            return waiting == 0

        wait_until(all_delivered, timeout=90, what="every message delivered")
        kinds = [row[0] for row in pair.b.cluster.query("SELECT kind FROM broker_haevent")]
        assert "failover" in kinds
        # A rejoined by pg_rewind onto B's new timeline, not by a fresh copy:
        # B checkpointed after its promotion, and A kept the WAL the rewind reads.
        log = pair.a.log.read_text()
        assert "pg_rewind" in log
        assert "cloning" not in log, log[-4000:]
    finally:
        publisher.stopping.set()
        reader.stopping.set()
        workers.stop()
        web.stop()


def test_a_killed_primary_server_restarts_in_place_and_the_standby_never_races_it(
    pair: Pair, tmp_path: Path
) -> None:
    """SIGKILL of the primary's postmaster: its node, alive, restarts the
    server and stays primary; the standby, hearing a live
    node that rediscovers its role, does not take over, so at no moment do
    both servers take writes. Each restart opens a new epoch of A's."""
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    publisher = Publisher(web)
    probe = WritableProbe(pair.a.cluster, pair.b.cluster)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 30, timeout=60, what="publishing")
        probe.start()
        [(epoch,)] = pair.a.cluster.query("SELECT epoch FROM broker_hapair")
        for _ in range(2):
            pair.a.cluster.kill()
            acked = len(publisher.acked)
            wait_until(
                lambda: len(publisher.acked) >= acked + 10,  # noqa: B023
                timeout=TIMEOUT + 2,
                what=f"publishing again on A\n{pair.logs()}",
            )
            time.sleep(2 * TIMEOUT)  # past the standby's heartbeat timeout
            assert pair.role_of(pair.b) == "standby", pair.logs()
        pair.wait_roles({"A": "primary", "B": "standby"}, timeout=30)
        publisher.stop()
        probe.stop()
        assert probe.probes > 50
        assert not probe.both_writable, pair.logs()
        # Each restart is a new term of A's, and nobody else's.
        assert pair.a.cluster.query("SELECT epoch, primary_name FROM broker_hapair") == [
            (epoch + 2, "A")
        ]
        stored = set(payloads_in(pair, "A"))
        assert set(publisher.acked) <= stored
    finally:
        publisher.stopping.set()
        probe.stopping.set()
        web.stop()


def test_a_frozen_primary_server_is_stopped_by_its_node_which_hands_over(
    pair: Pair, tmp_path: Path
) -> None:
    """Only the primary's server freezes (its node runs on): the node, its
    store silent for the heartbeat timeout, kills the server and asks the
    synchronous standby to take over under the epoch; the frozen server never
    takes a write again before it has rejoined as a standby."""
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    publisher = Publisher(web)
    probe = WritableProbe(pair.a.cluster, pair.b.cluster)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 30, timeout=60, what="publishing")
        probe.start()
        frozen = pair.a.cluster.freeze()
        try:
            pair.wait_roles({"B": "primary"}, timeout=TIMEOUT + 10)
        finally:
            pair.a.cluster.thaw(frozen)
        pair.wait_roles({"A": "standby", "B": "primary"}, timeout=60)
        wait_until(
            lambda: (pair.b.status() or {}).get("mode") == "synchronous",
            timeout=60,
            what="synchronous again",
        )
        acked = len(publisher.acked)
        wait_until(lambda: len(publisher.acked) >= acked + 10, timeout=30, what="publishing")
        publisher.stop()
        probe.stop()
        assert not probe.both_writable, pair.logs()
        assert publisher.longest_gap <= TIMEOUT + 2 + 1, publisher.longest_gap
        stored = set(payloads_in(pair, "B"))
        assert set(publisher.acked) <= stored
        details = [r[0] for r in pair.b.cluster.query("SELECT detail FROM broker_haevent")]
        assert any("handed over" in detail for detail in details), details
    finally:
        publisher.stopping.set()
        probe.stopping.set()
        web.stop()


def test_a_node_restarted_with_another_secret_causes_no_failover(pair: Pair) -> None:
    """The primary's node comes back with another HA_SECRET: each node
    refuses the other's heartbeats and says why, and the standby, whose peer
    answers (if only to refuse it), does not take over."""
    start_pair(pair)
    pair.a.kill()
    pair.a.start(HA_SECRET="another-secret-entirely")
    time.sleep(3 * TIMEOUT)
    assert pair.role_of(pair.b) in ("standby", "synchronising"), pair.logs()
    other = wire.call(pair.a.address, "status", secret=b"another-secret-entirely", timeout=2)
    assert other["role"] == "primary"
    assert "HA_SECRET differs between the nodes" in pair.b.log.read_text()
    assert "is HA_SECRET the same on both nodes?" in pair.a.log.read_text()
    kinds = {row[0] for row in pair.a.cluster.query("SELECT kind FROM broker_haevent")}
    assert "failover" not in kinds


def test_a_node_refuses_to_run_on_a_store_it_could_not_rewind_or_a_peer_that_is_itself(
    pair: Pair,
) -> None:
    a = pair.a
    itself = subprocess.run(
        [sys.executable, "manage.py", "broker_node", "--name", "A"],
        cwd=ROOT,
        env={**a.env, "HA_PEER_DATABASE_URL": a.cluster.url},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert itself.returncode != 0
    assert "HA_PEER_DATABASE_URL reaches this node's own server" in itself.stderr

    a.cluster.query("ALTER SYSTEM SET wal_log_hints = off")
    a.cluster.stop()
    a.cluster.start()
    no_hints = a.manage("broker_node", "--name", "A", timeout=60)
    assert no_hints.returncode != 0
    assert "wal_log_hints is off" in no_hints.stderr
    [(role_rows,)] = a.cluster.query("SELECT count(*) FROM broker_node")
    assert role_rows == 0


# -- a sequence of faults ---------------------------------------------------------------

# (target, fault): what each step may do to the pair. "primary" and "standby"
# are the roles at the step's start.
FAULTS = [
    ("primary", "server-crash"),  # SIGKILL of its postmaster and backends
    ("primary", "node-crash"),  # SIGKILL of its node; started again after the failover
    ("primary", "crash"),  # both; the node started again
    ("primary", "freeze"),  # SIGSTOP of its node and server for 3 x the timeout
    ("primary", "server-freeze"),  # SIGSTOP of its server for 3 x the timeout
    ("standby", "crash"),
    ("standby", "freeze"),
]
SEQUENCE_LENGTH = 6


def inject(pair: Pair, target: str, fault: str) -> float:
    """Hit the node in role ``target`` with ``fault`` until the fault ends;
    the time it ended (monotonic)."""
    primary = next(node for node in pair.nodes if pair.role_of(node) == "primary")
    node = primary if target == "primary" else next(n for n in pair.nodes if n is not primary)
    if fault == "server-crash":
        node.cluster.kill()
    elif fault == "node-crash":
        node.kill()
        other = next(n for n in pair.nodes if n is not node)
        pair.wait_roles({other.name: "primary"}, timeout=TIMEOUT + 10)
        node.start()
    elif fault == "crash":
        node.kill()
        node.cluster.kill()
        time.sleep(TIMEOUT + 2)
        node.start()
    else:
        if fault == "freeze":
            node.signal(signal.SIGSTOP)
        frozen = node.cluster.freeze()
        time.sleep(3 * TIMEOUT)
        node.cluster.thaw(frozen)
        if fault == "freeze":
            node.signal(signal.SIGCONT)
    return time.monotonic()


def where(pair: Pair, payloads: list[str]) -> str:
    """Where else the servers have these payloads (any queue, any state)."""
    found = []
    for node in pair.nodes:
        with contextlib.suppress(Exception):
            found.append(
                (
                    node.name,
                    node.cluster.query(
                        "SELECT q.name, m.state, m.id FROM broker_message m "
                        "JOIN broker_queue q ON q.id = m.queue_id "
                        "WHERE convert_from(m.payload, 'UTF8') = ANY(%s)",
                        [payloads],
                    ),
                )
            )
    return f"found {found}"


def healed(pair: Pair) -> bool:
    """One primary, synchronous, and the other node its standby."""
    roles = {node.name: pair.role_of(node) for node in pair.nodes}
    primaries = [node for node in pair.nodes if roles[node.name] == "primary"]
    return (
        len(primaries) == 1
        and sorted(str(role) for role in roles.values()) == ["primary", "standby"]
        and (primaries[0].status() or {}).get("mode") == "synchronous"
    )


def test_a_random_sequence_of_faults_each_heals_and_loses_nothing(
    pair: Pair, tmp_path: Path
) -> None:
    """Faults drawn at random (seed 1 unless LAZARETTO_FAULT_SEED names another), one
    after another, each once the pair healed from the last, under a client
    publishing over the API and workers delivering. After each: the pair is
    primary plus synchronous standby again within 60 s of the fault's end;
    no acknowledged publish is missing; publishing stopped for at most the
    heartbeat timeout + 2 s (+ 1 s for this client's polling and the
    machine); and at no moment did both servers take read-write sessions,
    but for the instant between a frozen primary's thaw and its node's first
    step (which fences it; no write there is acknowledged, its synchronous
    standby being gone)."""
    seed = int(os.environ.get("LAZARETTO_FAULT_SEED") or 1)
    rng = random.Random(seed)
    sequence = [rng.choice(FAULTS) for _ in range(SEQUENCE_LENGTH)]
    web, workers = serve_the_pair(pair, tmp_path)
    publisher = Publisher(web)
    probe = WritableProbe(pair.a.cluster, pair.b.cluster)
    what = f"seed {seed}, sequence {sequence}"
    try:
        publisher.start()
        probe.start()
        wait_until(lambda: len(publisher.acked) >= 20, timeout=60, what="publishing")
        for step, (target, fault) in enumerate(sequence, 1):
            started = time.monotonic()
            ended = inject(pair, target, fault)
            try:
                wait_until(lambda: healed(pair), timeout=60, interval=0.2, what="the pair healed")
            except AssertionError as error:
                raise AssertionError(
                    f"step {step} ({target} {fault}), {what}: {error}\n{pair.logs()}"
                ) from None
            healed_at = time.monotonic()
            resumed = len(publisher.acked) + 5
            wait_until(lambda: len(publisher.acked) >= resumed, timeout=30, what="publishing")  # noqa: B023
            primary = next(node for node in pair.nodes if pair.role_of(node) == "primary")
            acked_so_far = list(publisher.acked)  # before the read: it goes on growing
            stored = set(payloads_in(pair, primary.name))
            missing = [p for p in acked_so_far if p not in stored]
            assert not missing, (
                f"step {step} ({target} {fault}), {what}: lost {missing[:10]}; "
                f"{where(pair, missing)}\n{pair.logs()}"
            )
            gap = publisher.gap_around(started, healed_at)
            assert gap <= TIMEOUT + 2 + 1, (
                f"step {step} ({target} {fault}), {what}: gap {gap:.1f} s\n{pair.logs()}"
            )
            thaw = (ended, ended + 1.0) if (target, fault) == ("primary", "freeze") else None
            both = [
                t
                for t in probe.both_writable
                if started <= t <= healed_at and not (thaw and thaw[0] <= t <= thaw[1])
            ]
            assert not both, f"step {step} ({target} {fault}), {what}: both writable {both}"
        publisher.stop()
        probe.stop()
        primary = next(node for node in pair.nodes if pair.role_of(node) == "primary")
        stored_list = payloads_in(pair, primary.name)
        # Twice only a publish the client did not learn the outcome of.
        assert len(stored_list) - len(set(stored_list)) <= publisher.failures

        def all_delivered() -> bool:
            [(waiting,)] = primary.cluster.query(
                "SELECT count(*) FROM broker_message WHERE state <> 'DLVD'"
            )
            return waiting == 0

        wait_until(all_delivered, timeout=90, what=f"every message delivered ({what})")
    finally:
        publisher.stopping.set()
        probe.stopping.set()
        workers.stop()
        web.stop()
