"""Lazaretto's data, by area: queues and topics, messages, counters, the
audit log, rules tables, the data pipeline and the HA pair.

Models hold data and constraints only. Every change of a message's state or
queue goes through ``broker.services.transitions``; every other write through
a service function in ``broker.services``. Import them from here.
"""

from broker.models.audit import (
    AuditEvent,
)
from broker.models.counters import (
    COUNTER_COLUMNS,
    COUNTERS,
    Counter,
    Counts,
    DeadLetterActionTotal,
    Heartbeat,
    Metric,
    QueueCountDelta,
    QueueDepth,
    QueueDepthDelta,
    QueueDepthMinute,
    QueueMinute,
    QueueTotal,
)
from broker.models.ha import (
    DivergedExport,
    HaEvent,
    HaEventKind,
    HaPair,
    Node,
    NodeRole,
)
from broker.models.messages import (
    BulkJob,
    BulkJobStatus,
    Message,
    MessageState,
    NotificationState,
    PoisonAlarm,
)
from broker.models.pipeline import (
    ArchiveChunk,
    ArchiveChunkStatus,
    ReplayedMessage,
    ReplayJob,
    ReplayJobStatus,
    ReplaySource,
)
from broker.models.queues import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_SUSPECT_DELAY_SECONDS,
    MAX_WEBHOOK_SECRET_LENGTH,
    MIN_WEBHOOK_SECRET_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
    QUEUE_NAME_PATTERN,
    Overflow,
    PoisonAction,
    Queue,
    QueueKind,
    Subscription,
    Topic,
    queue_name_validator,
    validate_topic_filter,
    validate_topic_string,
)
from broker.models.rules import (
    DeadLetterAttempt,
    DeadLetterScan,
    RuleTable,
    RuleTableStatus,
)

__all__ = [
    "COUNTERS",
    "COUNTER_COLUMNS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_SUSPECT_DELAY_SECONDS",
    "MAX_WEBHOOK_SECRET_LENGTH",
    "MIN_WEBHOOK_SECRET_LENGTH",
    "QUEUE_NAME_MAX_LENGTH",
    "QUEUE_NAME_PATTERN",
    "ArchiveChunk",
    "ArchiveChunkStatus",
    "AuditEvent",
    "BulkJob",
    "BulkJobStatus",
    "Counter",
    "Counts",
    "DeadLetterActionTotal",
    "DeadLetterAttempt",
    "DeadLetterScan",
    "DivergedExport",
    "HaEvent",
    "HaEventKind",
    "HaPair",
    "Heartbeat",
    "Message",
    "MessageState",
    "Metric",
    "Node",
    "NodeRole",
    "NotificationState",
    "Overflow",
    "PoisonAction",
    "PoisonAlarm",
    "Queue",
    "QueueCountDelta",
    "QueueDepth",
    "QueueDepthDelta",
    "QueueDepthMinute",
    "QueueKind",
    "QueueMinute",
    "QueueTotal",
    "ReplayJob",
    "ReplayJobStatus",
    "ReplaySource",
    "ReplayedMessage",
    "RuleTable",
    "RuleTableStatus",
    "Subscription",
    "Topic",
    "queue_name_validator",
    "validate_topic_filter",
    "validate_topic_string",
]
