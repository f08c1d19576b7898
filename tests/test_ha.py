"""The HA pair with real processes: two PostgreSQL clusters, two broker nodes,
gunicorn on the multi-host URL, Celery workers; nodes and servers killed,
stopped and restarted."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.ha import wire
from rig.ha import (
    QUEUE,
    TIMEOUT,
    Cluster,
    Pair,
    Publisher,
    WebServer,
    WritableProbe,
    ha_pair,
    make_queue,
    payloads_in,
    serve_the_pair,
    shell,
    start_pair,
)
from rig.processes import ROOT, RedisServer, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.ha]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        with ha_pair(redis.url, dump_dir=tmp_path / "dumps") as made:
            yield made
    finally:
        redis.stop()


def test_failover_keeps_every_acknowledged_publish_and_the_old_primary_rejoins(
    pair: Pair, tmp_path: Path
) -> None:
    web, workers = serve_the_pair(pair, tmp_path)
    publisher = Publisher(web)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 50, timeout=60, what="publishing")
        acked_before = len(publisher.acked)
        b_takes_over_within_the_target(pair)
        wait_until(
            lambda: len(publisher.acked) >= acked_before + 30,
            timeout=60,
            what=f"publishing to resume\n{web.log.read_text()[-3000:]}",
        )
        publisher.stop()
        no_acknowledged_publish_lost(pair, publisher, "B")
        # The workers, on the new primary, deliver everything.
        every_message_delivered(pair.b.cluster)
        delivered = {r["id"] for r in workers.records()}
        stored_ids = {row[0] for row in pair.b.cluster.query("SELECT id FROM broker_message")}
        assert stored_ids <= delivered
        # A comes back: it rejoins as standby; while it synchronises, a
        # configuration change is refused with the error, afterwards it works.
        pair.a.start()
        a_configuration_change_is_refused_while_a_synchronises(pair, web)
        a_configuration_change_goes_through_once_synchronous(pair, web)
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


def b_takes_over_within_the_target(pair: Pair) -> None:
    """A's node and server killed, B is primary within the heartbeat
    timeout + 2 s (the status is polled every 0.1 s)."""
    killed = time.monotonic()
    pair.a.kill()
    pair.a.cluster.kill()
    pair.wait_roles({"B": "primary"}, timeout=TIMEOUT + 20)
    took = time.monotonic() - killed
    assert took <= TIMEOUT + 2 + 0.3, f"failover took {took:.1f}s\n{pair.logs()}"


def no_acknowledged_publish_lost(pair: Pair, publisher: Publisher, cluster_name: str) -> list[str]:
    """The payloads stored on ``cluster_name``, every acknowledged one among them."""
    stored = payloads_in(pair, cluster_name)
    missing = [p for p in publisher.acked if p not in set(stored)]
    assert not missing, f"{len(missing)} acknowledged publish(es) lost: {missing[:10]}"
    return stored


def every_message_delivered(cluster: Cluster) -> None:
    def all_delivered() -> bool:
        [(waiting,)] = cluster.query("SELECT count(*) FROM broker_message WHERE state <> 'DLVD'")
        return waiting == 0

    wait_until(all_delivered, timeout=90, what="every message delivered")


def a_configuration_change_is_refused_while_a_synchronises(pair: Pair, web: WebServer) -> None:
    wait_until(
        lambda: pair.role_of(pair.a) == "synchronising",
        timeout=60,
        interval=0.05,
        what=f"A synchronising\n{pair.logs()}",
    )
    answers: list[tuple[int, Any]] = []

    def config_change() -> tuple[int, Any]:
        name = f"HA.NEW.{len(answers)}"
        answers.append(web.request("POST", "/api/v1/queues/", {"name": name, "consumer": "noop"}))
        return answers[-1]

    try:
        refused = wait_until(
            lambda: (lambda r: r if r[0] == 409 else None)(config_change()),
            timeout=30,
            interval=0.05,
            what="a configuration change refused",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}: {answers[:3]} … {answers[-3:]}\n{pair.logs()}") from None
    assert refused[1]["code"] == "ha_synchronising"
    assert "synchronisation" in refused[1]["detail"]


def a_configuration_change_goes_through_once_synchronous(pair: Pair, web: WebServer) -> None:
    pair.wait_roles({"A": "standby", "B": "primary"}, timeout=90)
    synchronous_again(pair, timeout=30)
    wait_until(
        lambda: web.request("POST", "/api/v1/queues/", {"name": "HA.AFTER", "consumer": "noop"})[0]
        == 201,
        timeout=10,
        what="the configuration change to go through",
    )


def synchronous_again(pair: Pair, timeout: float, what: str = "synchronous again") -> None:
    wait_until(
        lambda: (pair.b.status() or {}).get("mode") == "synchronous", timeout=timeout, what=what
    )


@contextmanager
def publishing(pair: Pair, tmp_path: Path) -> Iterator[Publisher]:
    """The pair started, the test queue made, gunicorn on the pair and a
    publisher through it with 30 publishes acknowledged; stopped at the end."""
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    publisher = Publisher(web)
    try:
        publisher.start()
        wait_until(lambda: len(publisher.acked) >= 30, timeout=60, what="publishing")
        yield publisher
    finally:
        publisher.stopping.set()
        web.stop()


@contextmanager
def probing(pair: Pair) -> Iterator[WritableProbe]:
    """A probe, from now on, of whether both servers take writes at once."""
    probe = WritableProbe(pair.a.cluster, pair.b.cluster)
    try:
        probe.start()
        yield probe
    finally:
        probe.stopping.set()


def test_a_second_node_of_a_live_name_refuses_to_start(pair: Pair) -> None:
    start_pair(pair)
    same_address = pair.a.manage("broker_node", "--name", "A", timeout=60)
    assert same_address.returncode != 0
    assert "Is a node already running there?" in same_address.stderr

    elsewhere = subprocess.run(
        [sys.executable, "manage.py", "broker_node", "--name", "A"],
        cwd=ROOT,
        env={**pair.a.env, "HA_LISTEN": f"127.0.0.1:{free_port()}"},
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
    with publishing(pair, tmp_path) as publisher:
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

    # A restarted standalone, with a witness of its own (the witness would
    # refuse it the term B holds), acts as primary while B is: both go to
    # maintenance.
    pair.a.start(
        HA_STARTUP_MODE="standalone", HA_WITNESS_URL=pair.redis_url.rsplit("/", 1)[0] + "/15"
    )
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

        thawed = a_frozen_for(pair, 3 * TIMEOUT)
        assert pair.role_of(pair.b) == "primary", pair.logs()

        pair.wait_roles({"A": "standby", "B": "primary"}, timeout=60)
        synchronous_again(
            pair,
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
        reads_were_refused_store_unavailable_and_never_hung(reader)
        stored = no_acknowledged_publish_lost(pair, publisher, "B")
        assert payloads_in(pair, "A") == stored or set(payloads_in(pair, "A")) >= set(
            publisher.acked
        )
        every_message_delivered(pair.b.cluster)
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


def a_frozen_for(pair: Pair, seconds: float) -> float:
    """A's node and every process of its server stopped for ``seconds``,
    then resumed; the time they resumed."""
    pair.a.signal(signal.SIGSTOP)
    frozen = pair.a.cluster.freeze()
    try:
        time.sleep(seconds)
    finally:
        pair.a.cluster.thaw(frozen)
        pair.a.signal(signal.SIGCONT)
    return time.monotonic()


def reads_were_refused_store_unavailable_and_never_hung(reader: Unavailability) -> None:
    assert reader.refusals, "the API never answered 503 during the freeze"
    assert {status for status, _, _ in reader.refusals} == {503}, reader.refusals[:5]
    assert {body["code"] for _, body, _ in reader.refusals} == {"store_unavailable"}
    assert max(took for _, _, took in reader.refusals) <= TIMEOUT + 2


def test_a_killed_primary_server_restarts_in_place_and_the_standby_never_races_it(
    pair: Pair, tmp_path: Path
) -> None:
    """SIGKILL of the primary's postmaster: its node, alive, restarts the
    server and stays primary; the standby, hearing a live
    node that rediscovers its role, does not take over, so at no moment do
    both servers take writes. Each restart opens a new epoch of A's."""
    with publishing(pair, tmp_path) as publisher, probing(pair) as probe:
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


def test_a_frozen_primary_server_is_stopped_by_its_node_which_hands_over(
    pair: Pair, tmp_path: Path
) -> None:
    """Only the primary's server freezes (its node runs on): the node, its
    store silent for the heartbeat timeout, kills the server and asks the
    synchronous standby to take over under the epoch; the frozen server never
    takes a write again before it has rejoined as a standby."""
    with publishing(pair, tmp_path) as publisher, probing(pair) as probe:
        frozen = pair.a.cluster.freeze()
        try:
            pair.wait_roles({"B": "primary"}, timeout=TIMEOUT + 10)
        finally:
            pair.a.cluster.thaw(frozen)
        pair.wait_roles({"A": "standby", "B": "primary"}, timeout=60)
        synchronous_again(pair, timeout=60)
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


def test_a_node_restarted_with_another_secret_causes_no_failover(pair: Pair) -> None:
    """The primary's node comes back with another HA_SECRET: each node
    refuses the other's heartbeats and says why, and the standby, whose peer
    answers (if only to refuse it), does not take over.

    The restarted node looks for its peer for longer than the standby's
    heartbeat timeout, holding no lease meanwhile: only the refusals keep the
    standby from taking over. The standby's timeout is twice the tests' so
    that a slow start of the node (4 s on a busy machine), a silence after
    which a failover would be right, stays well within it."""
    secret = "another-secret-entirely"
    standby_timeout = 2 * TIMEOUT
    pair.b.env["HA_HEARTBEAT_TIMEOUT"] = str(standby_timeout)
    start_pair(pair)
    pair.a.kill()
    pair.a.start(HA_SECRET=secret, HA_DISCOVERY_TIMEOUT=str(standby_timeout + 2))
    wait_until(
        lambda: "HA_SECRET differs between the nodes" in pair.b.log.read_text(),
        timeout=standby_timeout,
        what="the standby telling of the other secret",
    )

    def first_primary() -> str | None:
        if pair.role_of(pair.b) == "primary":
            return "B"
        a = wire.call(pair.a.address, "status", secret=secret.encode(), timeout=2)
        return "A" if a["role"] == "primary" else None

    primary = wait_until(first_primary, timeout=standby_timeout + 10, what="a primary")
    assert primary == "A", pair.logs()
    assert "is HA_SECRET the same on both nodes?" in pair.a.log.read_text()
    kinds = {row[0] for row in pair.a.cluster.query("SELECT kind FROM broker_haevent")}
    assert "failover" not in kinds


def test_a_node_refuses_to_run_on_a_store_it_could_not_rewind_or_a_peer_that_is_not_its_copy(
    pair: Pair,
) -> None:
    a = pair.a

    def run_with_peer_store(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", "broker_node", "--name", "A"],
            cwd=ROOT,
            env={**a.env, "HA_PEER_DATABASE_URL": url},
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    itself = run_with_peer_store(a.cluster.url)
    assert itself.returncode != 0
    assert "HA_PEER_DATABASE_URL reaches this node's own server" in itself.stderr
    # The suite's own server: another cluster, not a copy of A's.
    stranger = run_with_peer_store(os.environ["DATABASE_URL"])
    assert stranger.returncode != 0
    assert "a server of another cluster (system identifier" in stranger.stderr
    assert "Empty this node's HA_PGDATA to have it cloned from the peer" in stranger.stderr

    a.cluster.query("ALTER SYSTEM SET wal_log_hints = off")
    a.cluster.stop()
    a.cluster.start()
    no_hints = a.manage("broker_node", "--name", "A", timeout=60)
    assert no_hints.returncode != 0
    assert "wal_log_hints is off" in no_hints.stderr
    [(role_rows,)] = a.cluster.query("SELECT count(*) FROM broker_node")
    assert role_rows == 0
