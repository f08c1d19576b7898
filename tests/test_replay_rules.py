"""A rules table in a replay routes every message as the dead-letter handler
would: for generated tables and messages, the Spark path (the replay job's
executor function over the rows the job reads, in a real Spark session)
is compared with what the handler's scan does to the same messages."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker.models import Message, Queue
from broker.pipeline.selection import ReplaySpec
from broker.pipeline.source import source_query
from broker.rules import parse
from broker.rules.routing import FAIL, SKIP, WRITE
from broker.services.dead_letters import dead_letter_scan
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create_and_activate
from tests.support.messages import dead_lettered
from workers.spark.replay import ROUTE_COLUMNS, route_frame

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
QUEUES = ("ORDERS.IN", "ORDERS.OUT", "BILLING.IN")
# Forward targets: two exist, one does not.
TARGETS = ("REPAIR", "HOLD", "NO.SUCH.QUEUE")
REASONS = ("handler_error", "format_error", "expired", "max_messages_reached")

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.django_db]

# What the replay job's executors get of each row: the id, and text.
COLUMNS = StructType(
    [StructField(name, LongType() if name == "id" else StringType()) for name in ROUTE_COLUMNS]
)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from workers.spark.session import spark_session

    session = spark_session("lazaretto-test-routing")
    yield session
    session.stop()
    # py4j says goodbye at INFO from a destructor after pytest has closed its
    # output; keep the end of the run pytest's own summary.
    logging.getLogger("py4j").setLevel(logging.WARNING)


patterns = st.fixed_dictionaries(
    {},
    optional={
        "REASON": st.sampled_from(
            ["LZRC_HANDLER_ERROR", "MQRC_FORMAT_ERROR", "MQFB_EXPIRATION", "MQRC_Q_FULL"]
        ),
        "DESTQ": st.sampled_from(["ORDERS.IN", "ORDERS.*", "BILLING.IN", "*"]),
        "FORMAT": st.sampled_from(["MQSTR", "MQ*"]),
        "PERSIST": st.sampled_from(["1", "0"]),
    },
)
actions = st.one_of(
    st.builds(lambda n: f"ACTION(RETRY) RETRY({n})", st.integers(1, 3)),
    st.builds(
        lambda q, h: f"ACTION(FWD) FWDQ({q}) HEADER({h})",
        st.sampled_from([*TARGETS, "&DESTQ"]),
        st.sampled_from(["YES", "NO"]),
    ),
    st.just("ACTION(DISCARD)"),
    st.just("ACTION(IGNORE)"),
)
rules = st.lists(
    st.builds(
        lambda keys, action: " ".join([*(f"{k}({v})" for k, v in keys.items()), action]),
        patterns,
        actions,
    ),
    min_size=1,
    max_size=5,
)
messages = st.lists(
    st.tuples(
        st.sampled_from(QUEUES),
        st.sampled_from(REASONS),
        st.sampled_from(["application/json", "application/octet-stream"]),
    ),
    min_size=1,
    max_size=12,
)


def _spark_routes(spark: SparkSession, table: str) -> dict[int, tuple[str, str, bool, int]]:
    """Route the dead-letter queue's rows as the replay job reads them for
    a rules table."""
    query = source_query(
        ReplaySpec(source="dead_letter", source_queue=DLQ, rules_text=table), with_payload=False
    )
    with connection.cursor() as cursor:
        cursor.execute(query)
        names = [column.name for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    frame = spark.createDataFrame(
        [tuple(row[name] for name in COLUMNS.fieldNames()) for row in rows], COLUMNS
    )
    routed = route_frame(
        frame, rules_text=table, target="", queue_manager=settings.LAZARETTO_INSTANCE_NAME
    )
    known = set(Queue.objects.values_list("name", flat=True))
    routes = {}
    for message_id, verdict, target, rule, keep in routed.collect():
        if verdict == WRITE and target not in known:
            verdict = FAIL  # as the job marks writes to a queue that is not there
        routes[message_id] = (verdict, target, keep, rule)
    return routes


def _handler_outcomes(ids: list[int]) -> dict[int, tuple[str, bool] | None]:
    """Where each message is after one scan: (queue, header kept), or None
    when it was discarded."""
    dead_letter_scan(queue=Queue.objects.get(name=DLQ))
    where = {
        message.id: (message.queue.name, message.dead_letter is not None)
        for message in Message.objects.filter(id__in=ids).select_related("queue")
    }
    return {message_id: where.get(message_id) for message_id in ids}


@hypothesis_settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(table_rules=rules, published=messages)
def test_replay_routes_every_message_as_the_dead_letter_handler_does(
    spark: SparkSession, table_rules: list[str], published: list[tuple[str, str, str]]
) -> None:
    table = "\n".join(table_rules) + "\n"
    parsed = parse(table).table
    assert parsed is not None, table
    with transaction.atomic():
        for name in (*QUEUES, *TARGETS[:2]):
            queue_create(name=name, consumer="")
        ids: list[int] = []
        for queue_name, reason, content_type in published:
            queue = Queue.objects.get(name=queue_name)
            [message_id] = dead_lettered(queue, 1, reason=reason)
            Message.objects.filter(id=message_id).update(content_type=content_type)
            ids.append(message_id)
        rule_table_create_and_activate(queue=Queue.objects.get(name=DLQ), text=table)

        routes = _spark_routes(spark, table)
        outcomes = _handler_outcomes(ids)
        for message_id in ids:
            verdict, target, keep, rule = routes[message_id]
            outcome = outcomes[message_id]
            context: Any = (table, message_id, routes[message_id], outcome)
            if verdict == WRITE:
                assert outcome == (target, keep), context
            elif verdict == SKIP and rule and parsed.rules[rule - 1].action == "DISCARD":
                assert outcome is None, context
            else:  # ignored, no rule left, or a target that is not there
                assert outcome == (DLQ, True), context
        transaction.set_rollback(True)
