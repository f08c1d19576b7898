"""Prometheus metrics: what /metrics shows and where each number comes from.

Two sources, chosen by where the truth lives:

* The database, read at scrape time by ``BrokerCollector``: queue depths (the
  per-queue, per-state counters the triggers of migration 0002 keep), how
  long each queue's longest-waiting message has waited (one index entry per
  queue with any waiting), whether the dispatcher delivers each queue, the
  per-queue counters ``broker.services.counting`` adds up in ``QueueTotal``
  (published, delivered, handler errors, crashes, timeouts, dead-lettered,
  blacklisted, poisoned, discarded), the dead-letter handler's actions by
  rule, and the workers' heartbeats. Exact, and the same whichever process
  answers the scrape: each number is a handful of rows, never a count of
  messages.
* The processes that observe them, through prometheus-client: the delivery
  latency (publish to ack) histogram and the sweeper's and dispatcher's lag.
  With ``PROMETHEUS_MULTIPROC_DIR`` set (``make run`` sets it), every process
  (gunicorn workers, Celery's prefork children) writes its values to files
  there, and /metrics adds them up (``prometheus_client.multiprocess``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, Histogram, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from broker.models import COUNTERS
from broker.selectors import (
    dead_letter_action_counts,
    heartbeats,
    queue_counts,
    queue_oldest_waiting,
)


def multiproc_dir() -> str:
    """Where processes write their values for one another (blank: each keeps
    its own): prometheus-client's PROMETHEUS_MULTIPROC_DIR."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")


# prometheus-client writes a process's values there from its first metric
# on (it decides when it is imported); the directory must exist by then.
if multiproc_dir():
    Path(multiproc_dir()).mkdir(parents=True, exist_ok=True)

DELIVERY_LATENCY = Histogram(
    "lazaretto_delivery_latency_seconds",
    "Seconds from a message's publish to its ack, by queue.",
    ["queue"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
# The most recent run's lag, whichever process ran it.
SWEEPER_LAG = Gauge(
    "lazaretto_sweeper_lag_seconds",
    "How late the last sweep started: seconds from beat sending it to a worker starting it.",
    multiprocess_mode="mostrecent",
)
DISPATCHER_LAG = Gauge(
    "lazaretto_dispatcher_lag_seconds",
    "How late the last dispatch started: seconds from beat sending it to a worker starting it.",
    multiprocess_mode="mostrecent",
)


def delivery_latency_observe(*, queue: str, seconds: Iterable[float]) -> None:
    """Record the publish-to-ack time of each message a delivery unit acked."""
    histogram = DELIVERY_LATENCY.labels(queue=queue)
    for value in seconds:
        histogram.observe(max(value, 0.0))


def process_dead(pid: int) -> None:
    """Forget a finished process's live gauges (multiprocess mode only)."""
    if multiproc_dir():
        multiprocess.mark_process_dead(pid, multiproc_dir())


class BrokerCollector(Collector):
    """The database's numbers, read at each scrape (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        queues = queue_counts()
        depth = GaugeMetricFamily(
            "lazaretto_queue_depth",
            "Messages on the queue by state (TBDL, DLNG, DLVD, NDLV, FAIL).",
            labels=["queue", "state"],
        )
        for queue in queues:
            for state, count in sorted(queue.depth.items()):
                depth.add_metric([queue.name, state], count)
        yield depth
        oldest = queue_oldest_waiting()
        waiting_age = GaugeMetricFamily(
            "lazaretto_queue_oldest_waiting_seconds",
            "Seconds since the queue's longest-waiting (TBDL) message arrived; 0 with none waiting.",
            labels=["queue"],
        )
        for queue in queues:
            waiting_age.add_metric([queue.name], oldest.get(queue.name, 0.0))
        yield waiting_age
        deliverable = GaugeMetricFamily(
            "lazaretto_queue_deliverable",
            "1 when the dispatcher delivers the queue's messages (a standard queue, "
            "not paused, with a consumer), else 0.",
            labels=["queue"],
        )
        for queue in queues:
            deliverable.add_metric([queue.name], 1 if queue.deliverable else 0)
        yield deliverable
        for kept in COUNTERS:
            if not kept.metric.name:
                continue
            counter = CounterMetricFamily(kept.metric.name, kept.metric.help, labels=["queue"])
            for queue in queues:
                counter.add_metric([queue.name], queue.totals[kept.column])
            yield counter
        actions = CounterMetricFamily(
            "lazaretto_dead_letter_actions",
            "The dead-letter handler's actions by queue, rules table version, rule "
            "(0: none matched) and action (retry, fwd, discard, ignore, failed).",
            labels=["queue", "rule_table_version", "rule", "action"],
        )
        for row in dead_letter_action_counts():
            actions.add_metric(
                [row.queue, str(row.rule_table_version), str(row.rule), row.action], row.count
            )
        yield actions
        beats = GaugeMetricFamily(
            "lazaretto_worker_heartbeat_age_seconds",
            "Seconds since a worker last took a task from the Celery queue.",
            labels=["queue"],
        )
        for name, seconds in sorted(heartbeats().items()):
            beats.add_metric([name], seconds)
        yield beats

    def describe(self) -> Iterator[Metric]:
        # Registering must not query the database.
        return iter(())


class _InProcess(Collector):
    """This process's own metrics, when processes do not share a directory."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def metrics_registry() -> CollectorRegistry:
    """What one scrape shows: the database's numbers and the processes'
    observations (every process's, in multiprocess mode)."""
    registry = CollectorRegistry(auto_describe=False)
    if multiproc_dir():
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir())
    else:
        registry.register(_InProcess())
    registry.register(BrokerCollector())
    return registry
