"""/metrics: after a known workload on real Celery worker processes, every
number Prometheus reads matches the database; and only a client with the
token or from an allowed network may read it."""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta
from ipaddress import ip_network

import pytest
from django.db import connection
from django.db.models import Count
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from broker.models import AuditEvent, Message, MessageState, Queue
from broker.selectors import QUEUE_OLDEST_WAITING_SQL
from broker.services.dead_letters import dead_letter_scan
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create, queue_pause
from broker.services.rule_tables import rule_table_activate, rule_table_create
from rig.processes import wait_until
from tests.support.messages import claimed, dead_lettered
from tests.support.processes import refused_at_start_up
from tests.support.publishing import published

S = MessageState
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name{labels}``; a missing one fails the test."""
    return samples[(name, frozenset(labels.items()))]


def depths_in_the_database() -> dict[tuple[str, str], int]:
    counted = {
        (row["queue__name"], row["state"]): row["n"]
        for row in Message.objects.values("queue__name", "state").annotate(n=Count("id"))
    }
    return {
        (name, state): counted.get((name, state), 0)
        for name in Queue.objects.values_list("name", flat=True)
        for state in S.values
    }


def on_queue(name: str, state: str) -> int:
    return Message.objects.filter(queue__name=name, state=state).count()


@pytest.mark.slow
def test_after_1000_published_1_crash_and_3_dead_lettered_the_metrics_match_the_database(
    start_workers, tmp_path, monkeypatch
):
    shared = tmp_path / "prometheus"
    # The workers write their observations there; /metrics, answered by this
    # process, adds up every process's files as a gunicorn worker would.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    bulk = queue_create(name="METRICS.BULK", consumer="noop", batch_size=100)
    crashing = queue_create(name="METRICS.CRASH", consumer="demo", batch_size=1, crash_threshold=1)
    unreadable = queue_create(name="METRICS.JSON", consumer="json")
    dead_letter_queue = unreadable.dead_letter_queue
    assert dead_letter_queue is not None
    start_workers(concurrency=2, PROMETHEUS_MULTIPROC_DIR=str(shared))

    samples = the_workload_done_and_scraped(bulk, crashing, unreadable, dead_letter_queue)

    for (name, state), count in depths_in_the_database().items():
        assert value(samples, "lazaretto_queue_depth", queue=name, state=state) == count, (
            name,
            state,
        )
    published_counts = {bulk.name: 1000, crashing.name: 1, unreadable.name: 3}
    for name, count in published_counts.items():
        assert value(samples, "lazaretto_messages_published_total", queue=name) == count
    assert Message.objects.filter(queue=bulk).count() == 1000
    assert value(samples, "lazaretto_messages_published_total", queue=dead_letter_queue.name) == 0
    assert value(samples, "lazaretto_messages_delivered_total", queue=bulk.name) == on_queue(
        bulk.name, S.DELIVERED
    )
    crashed = Message.objects.get(queue=crashing)
    assert (crashed.state, crashed.crash_count) == (S.NOT_DELIVERABLE, 1)
    assert value(samples, "lazaretto_delivery_crashes_total", queue=crashing.name) == 1
    assert value(samples, "lazaretto_delivery_timeouts_total", queue=crashing.name) == 0
    assert value(samples, "lazaretto_messages_blacklisted_total", queue=crashing.name) == (
        AuditEvent.objects.filter(action="message_quarantine", queue_name=crashing.name).count()
    )
    assert value(samples, "lazaretto_messages_poisoned_total", queue=crashing.name) == 1
    dead = Message.objects.filter(queue=dead_letter_queue)
    assert {(message.dead_letter or {}).get("original_queue") for message in dead} == {
        unreadable.name
    }
    assert value(samples, "lazaretto_messages_dead_lettered_total", queue=unreadable.name) == 3
    assert value(samples, "lazaretto_handler_errors_total", queue=unreadable.name) == 3
    assert value(samples, "lazaretto_handler_errors_total", queue=bulk.name) == 0
    for queue in (bulk, crashing, unreadable, dead_letter_queue):
        assert value(samples, "lazaretto_messages_discarded_total", queue=queue.name) == 0

    latencies_and_lags_are_observed(samples, bulk)


def the_workload_done_and_scraped(
    bulk: Queue, crashing: Queue, unreadable: Queue, dead_letter_queue: Queue
) -> Samples:
    """1000 messages published to ``bulk`` and delivered, one that crashes
    on ``crashing`` blacklisted, three unreadable ones on ``unreadable``
    dead-lettered; then /metrics, once it counts the last batch."""
    published(bulk, 1000, NewMessage(payload=b"order"))
    messages_publish(queue_name=crashing.name, messages=[NewMessage(payload=b"CRASH")])
    messages_publish(queue_name=unreadable.name, messages=[NewMessage(payload=b"not json")] * 3)

    wait_until(lambda: on_queue(bulk.name, S.DELIVERED) == 1000, timeout=90, what="1000 acked")
    wait_until(lambda: on_queue(crashing.name, S.NOT_DELIVERABLE) == 1, timeout=60, what="NDLV")
    wait_until(
        lambda: on_queue(dead_letter_queue.name, S.TO_BE_DELIVERED) == 3,
        timeout=60,
        what="3 dead-lettered",
    )
    client = Client()
    # Counters are added just after the commit that moved the messages.
    latencies = ("lazaretto_delivery_latency_seconds_count", frozenset({("queue", bulk.name)}))
    wait_until(
        lambda: scrape(client).get(latencies) == 1000, timeout=10, what="the last batch's counts"
    )
    return scrape(client)


def latencies_and_lags_are_observed(samples: Samples, bulk: Queue) -> None:
    # Observed by the delivery processes: one latency per ack, none negative.
    acked = on_queue(bulk.name, S.DELIVERED)
    assert value(samples, "lazaretto_delivery_latency_seconds_count", queue=bulk.name) == acked
    assert (
        value(samples, "lazaretto_delivery_latency_seconds_bucket", queue=bulk.name, le="+Inf")
        == acked
    )
    assert (
        0 < value(samples, "lazaretto_delivery_latency_seconds_sum", queue=bulk.name) < 90 * acked
    )
    # Observed by the control worker's processes, each run of the schedule.
    for lag in ("lazaretto_sweeper_lag_seconds", "lazaretto_dispatcher_lag_seconds"):
        assert 0 <= value(samples, lag) < 5, lag
    assert 0 <= value(samples, "lazaretto_worker_heartbeat_age_seconds", queue="control") < 10


@pytest.fixture
def dead_letter_queue(transactional_db: None) -> Queue:
    queue_create(name="REALLY.DEAD", kind="dead_letter")
    dead_letter_queue = queue_create(name="METRICS.DLQ", kind="dead_letter")
    queue_create(name="ORDERS.IN", consumer="noop", dead_letter_queue=dead_letter_queue)
    queue_create(name="PARKED.Q", dead_letter_queue=dead_letter_queue)
    return dead_letter_queue


def test_the_dead_letter_handlers_actions_are_counted_by_rule_as_its_audit_events(
    dead_letter_queue,
):
    dead_lettered(Queue.objects.get(name="ORDERS.IN"), 2)
    dead_lettered(Queue.objects.get(name="PARKED.Q"), 1)
    table = rule_table_create(
        queue=dead_letter_queue,
        text=(
            "RETRYINT(0) WAIT(NO)\n"
            "DESTQ(ORDERS.IN) ACTION(DISCARD)\n"
            "DESTQ(PARKED.Q) ACTION(FWD) FWDQ(REALLY.DEAD) HEADER(YES)\n"
        ),
    )
    rule_table_activate(table=table)

    dead_letter_scan(queue=dead_letter_queue)

    samples = scrape(Client())
    events = Counter(
        (event.details["rule"], event.action)
        for event in AuditEvent.objects.filter(action__startswith="dlq_")
    )
    assert events == {(1, "dlq_discard"): 2, (2, "dlq_fwd"): 1}
    labels = {"queue": "METRICS.DLQ", "rule_table_version": "1"}
    assert (
        value(samples, "lazaretto_dead_letter_actions_total", **labels, rule="1", action="discard")
        == 2
    )
    assert (
        value(samples, "lazaretto_dead_letter_actions_total", **labels, rule="2", action="fwd") == 1
    )
    assert value(samples, "lazaretto_messages_discarded_total", queue="METRICS.DLQ") == 2
    assert value(samples, "lazaretto_messages_dead_lettered_total", queue="ORDERS.IN") == 2
    assert value(samples, "lazaretto_messages_dead_lettered_total", queue="PARKED.Q") == 1
    assert value(samples, "lazaretto_queue_depth", queue="REALLY.DEAD", state="TBDL") == 1
    assert value(samples, "lazaretto_queue_depth", queue="METRICS.DLQ", state="TBDL") == 0


def test_discard_old_counts_each_discarded_message(transactional_db):
    queue = queue_create(name="FULL.Q", max_messages=5, overflow="discard_old")

    messages_publish(queue_name=queue.name, messages=[NewMessage(payload=b"x")] * 8)

    samples = scrape(Client())
    discarded = AuditEvent.objects.filter(action="message_discard", queue_name=queue.name).count()
    assert discarded == 3
    assert value(samples, "lazaretto_messages_discarded_total", queue=queue.name) == discarded
    assert value(samples, "lazaretto_messages_published_total", queue=queue.name) == 8
    assert value(samples, "lazaretto_queue_depth", queue=queue.name, state="TBDL") == 5


def test_a_rolled_back_publish_counts_nothing(transactional_db):
    queue = queue_create(name="LIMITED.Q", max_messages=2)
    messages_publish(queue_name=queue.name, messages=[NewMessage(payload=b"x")] * 2)

    with pytest.raises(Exception, match="limit"):
        messages_publish(queue_name=queue.name, messages=[NewMessage(payload=b"x")])

    assert value(scrape(Client()), "lazaretto_messages_published_total", queue=queue.name) == 2


def test_the_oldest_waiting_age_is_that_of_the_earliest_arrival_still_waiting(
    transactional_db,
):
    busy = queue_create(name="AGE.BUSY")
    idle = queue_create(name="AGE.IDLE")
    in_flight, older, newer = published(busy, 3)
    arrivals = {in_flight: timedelta(hours=1), older: timedelta(minutes=10), newer: timedelta(0)}
    for message_id, ago in arrivals.items():
        Message.objects.filter(id=message_id).update(enqueued_at=timezone.now() - ago)
    # The earliest arrival is being delivered: it waits no more.
    assert claimed(busy, 1) == [in_flight]

    samples = scrape(Client())

    assert 600 <= value(samples, "lazaretto_queue_oldest_waiting_seconds", queue=busy.name) < 660
    assert value(samples, "lazaretto_queue_oldest_waiting_seconds", queue=idle.name) == 0


def test_the_oldest_waiting_age_reads_one_entry_of_the_waiting_index_per_queue(db):
    queue = queue_create(name="AGE.PLAN")
    published(queue, 5)
    with connection.cursor() as cursor:
        # Sequential and bitmap scans off, so that the few rows of a test
        # table cannot hide a query that no longer matches the index.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(f"EXPLAIN {QUEUE_OLDEST_WAITING_SQL}")
        plan = "\n".join(line for (line,) in cursor.fetchall())

    # The first entry of the live partition's message_waiting_idx, no sort.
    first_entry = r"Limit .*\n\s*->  Index (Only )?Scan using broker_message_live_queue_id_enqueued_at_id_idx "
    assert re.search(first_entry, plan), plan


def test_only_a_standard_queue_with_a_consumer_not_paused_is_deliverable(transactional_db):
    queue_create(name="SERVED.Q", consumer="noop")
    queue_pause(queue=queue_create(name="PAUSED.Q", consumer="noop"), paused=True)
    queue_create(name="UNSERVED.Q")
    queue_create(name="SERVED.DLQ", kind="dead_letter")

    samples = scrape(Client())

    deliverable = {
        name: value(samples, "lazaretto_queue_deliverable", queue=name)
        for name in ("SERVED.Q", "PAUSED.Q", "UNSERVED.Q", "SERVED.DLQ")
    }
    assert deliverable == {"SERVED.Q": 1, "PAUSED.Q": 0, "UNSERVED.Q": 0, "SERVED.DLQ": 0}


# --- who may read it -----------------------------------------------------------


@pytest.fixture
def guarded(settings, db):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    settings.METRICS_ALLOWED_NETWORKS = [ip_network("10.1.0.0/16")]
    return Client()


def test_an_allowed_network_reads_metrics_without_a_token(guarded):
    assert guarded.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200


def test_an_address_outside_the_allowed_networks_is_refused_403(guarded):
    response = guarded.get("/metrics", REMOTE_ADDR="127.0.0.1")

    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert "METRICS_ALLOWED_NETWORKS" in response.json()["detail"]


def test_the_token_opens_metrics_from_anywhere(guarded):
    response = guarded.get(
        "/metrics", REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token"
    )

    assert response.status_code == 200
    assert b"lazaretto_queue_depth" in response.content


def test_a_wrong_token_is_refused_401_even_from_an_allowed_network(guarded):
    response = guarded.get(
        "/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer not-the-token"
    )

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json() == {
        "code": "authentication_failed",
        "detail": "The metrics token is wrong.",
    }


def test_a_token_is_refused_when_none_is_configured(settings, db):
    settings.METRICS_TOKEN = ""

    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer anything")

    assert response.status_code == 401
    assert "no METRICS_TOKEN is set" in response.json()["detail"]


def test_an_ipv4_mapped_loopback_address_is_loopback(db):
    assert Client().get("/metrics", REMOTE_ADDR="::ffff:127.0.0.1").status_code == 200


@pytest.mark.slow
def test_a_bad_allowed_network_stops_start_up_naming_the_variable():
    error = refused_at_start_up("check", METRICS_ALLOWED_NETWORKS="10.0.0.0/8,not-a-network")

    assert "METRICS_ALLOWED_NETWORKS: " in error
    assert "not-a-network" in error
