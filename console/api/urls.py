from django.urls import URLPattern, path, register_converter
from django.views import View

from console.api import (
    alerts,
    archive,
    audit,
    dead_letters,
    grants,
    ha,
    messages,
    queues,
    replay,
    rule_tables,
    schedules,
    tokens,
    topics,
    transfer,
    triage,
)


class NameConverter:
    """A queue, topic or subscription name in a path: any characters but
    NUL, '/' included (queue names may hold one). A NUL, which no name can
    hold, resolves nowhere: 404."""

    regex = "[^\x00]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(NameConverter, "name")


def actions(
    prefix: str, view: type[View], name: str, operations: tuple[str, ...]
) -> list[URLPattern]:
    """One route per operation of an action view: ``<prefix><operation>/``."""
    return [
        path(f"{prefix}{operation}/", view.as_view(operation=operation), name=f"{name}-{operation}")
        for operation in operations
    ]


QUEUE = "queues/<name:name>/"
MESSAGE = "messages/<int:message_id>/"
DLQ = "dead-letter-queues/<name:name>/"
RULE_TABLE = "rule-tables/<int:table_id>/"
REPLAY_JOB = "replay-jobs/<int:job_id>/"
SCHEDULE = "replay-schedules/<int:schedule_id>/"
TOPIC = "topics/<name:name>/"
SUBSCRIPTION = "subscriptions/<name:name>/"
EXPORT = "ha/exports/<int:export_id>/"

urlpatterns = [
    path("queues/", queues.QueueListView.as_view(), name="api-queues"),
    # Actions on a queue come before the queue itself: "A/pause/" is queue A's
    # pause, not a queue named "A/pause".
    path(f"{QUEUE}pause/", queues.QueuePauseView.as_view(paused=True), name="api-queue-pause"),
    path(f"{QUEUE}resume/", queues.QueuePauseView.as_view(paused=False), name="api-queue-resume"),
    path(f"{QUEUE}purge/", queues.QueuePurgeView.as_view(), name="api-queue-purge"),
    # Queue names may contain '/', so the name is a path segment run; the
    # messages route comes first so "A/B/messages/" means queue "A/B".
    path(f"{QUEUE}messages/import/", transfer.QueueImportView.as_view(), name="api-queue-import"),
    path(f"{QUEUE}messages/", messages.QueueMessagesView.as_view(), name="api-queue-messages"),
    path(QUEUE, queues.QueueDetailView.as_view(), name="api-queue"),
    path("messages/", triage.MessageListView.as_view(), name="api-messages"),
    path("messages/bulk/", triage.BulkJobCreateView.as_view(), name="api-messages-bulk"),
    path("messages/export/", transfer.MessageExportView.as_view(), name="api-messages-export"),
    path(MESSAGE, messages.MessageDetailView.as_view(), name="api-message"),
    *actions(
        MESSAGE,
        triage.MessageActionView,
        "api-message",
        ("release", "fail", "purge", "retry", "discard"),
    ),
    path(f"{MESSAGE}forward/", triage.MessageForwardView.as_view(), name="api-message-forward"),
    path(f"{MESSAGE}resubmit/", triage.MessageResubmitView.as_view(), name="api-message-resubmit"),
    path("jobs/<int:job_id>/", triage.JobDetailView.as_view(), name="api-job"),
    path(
        f"{DLQ}apply/",
        dead_letters.DeadLetterApplyView.as_view(),
        name="api-dead-letter-queue-apply",
    ),
    path(
        f"{DLQ}messages/",
        dead_letters.DeadLetterMessagesView.as_view(),
        name="api-dead-letter-queue-messages",
    ),
    path(DLQ, dead_letters.DeadLetterQueueView.as_view(), name="api-dead-letter-queue"),
    path("audit/", audit.AuditListView.as_view(), name="api-audit"),
    path("alerts/", alerts.AlertListView.as_view(), name="api-alerts"),
    path("archive/", archive.ArchiveSearchView.as_view(), name="api-archive"),
    path("grants/", grants.GrantListView.as_view(), name="api-grants"),
    path("grants/<int:grant_id>/", grants.GrantDetailView.as_view(), name="api-grant"),
    path("groups/", grants.GroupListView.as_view(), name="api-groups"),
    path("groups/<str:name>/members/", grants.GroupMembersView.as_view(), name="api-group-members"),
    path(
        "groups/<str:name>/members/<str:user>/",
        grants.GroupMemberView.as_view(),
        name="api-group-member",
    ),
    path("groups/<str:name>/", grants.GroupDetailView.as_view(), name="api-group"),
    path("tokens/", tokens.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>/", tokens.TokenDetailView.as_view(), name="api-token"),
    path("topics/", topics.TopicListView.as_view(), name="api-topics"),
    path(f"{TOPIC}messages/", topics.TopicPublishView.as_view(), name="api-topic-publish"),
    path(TOPIC, topics.TopicDetailView.as_view(), name="api-topic"),
    path("subscriptions/", topics.SubscriptionListView.as_view(), name="api-subscriptions"),
    path(SUBSCRIPTION, topics.SubscriptionDetailView.as_view(), name="api-subscription"),
    path("rule-tables/", rule_tables.RuleTableListView.as_view(), name="api-rule-tables"),
    path(
        "rule-tables/rollback/",
        rule_tables.RuleTableRollbackView.as_view(),
        name="api-rule-table-rollback",
    ),
    path(RULE_TABLE, rule_tables.RuleTableDetailView.as_view(), name="api-rule-table"),
    path(
        f"{RULE_TABLE}validate/",
        rule_tables.RuleTableValidateView.as_view(),
        name="api-rule-table-validate",
    ),
    path(
        f"{RULE_TABLE}dry-run/",
        rule_tables.RuleTableDryRunView.as_view(),
        name="api-rule-table-dry-run",
    ),
    path(
        f"{RULE_TABLE}activate/",
        rule_tables.RuleTableActivateView.as_view(),
        name="api-rule-table-activate",
    ),
    path("replay-jobs/", replay.ReplayJobListView.as_view(), name="api-replay-jobs"),
    path("replay-jobs/preview/", replay.ReplayPreviewView.as_view(), name="api-replay-job-preview"),
    path(REPLAY_JOB, replay.ReplayJobDetailView.as_view(), name="api-replay-job"),
    *actions(REPLAY_JOB, replay.ReplayJobActionView, "api-replay-job", ("cancel", "run")),
    path(
        "replay-schedules/", schedules.ReplayScheduleListView.as_view(), name="api-replay-schedules"
    ),
    path(SCHEDULE, schedules.ReplayScheduleDetailView.as_view(), name="api-replay-schedule"),
    *actions(
        SCHEDULE, schedules.ReplayScheduleSwitchView, "api-replay-schedule", ("pause", "resume")
    ),
    path(
        f"{SCHEDULE}run/", schedules.ReplayScheduleRunView.as_view(), name="api-replay-schedule-run"
    ),
    path(
        f"{SCHEDULE}jobs/",
        schedules.ReplayScheduleJobsView.as_view(),
        name="api-replay-schedule-jobs",
    ),
    path("ha/", ha.HaView.as_view(), name="api-ha"),
    path("ha/switchover/", ha.HaSwitchoverView.as_view(), name="api-ha-switchover"),
    path("ha/resolve/", ha.HaResolveView.as_view(), name="api-ha-resolve"),
    path(f"{EXPORT}republish/", ha.HaExportRepublishView.as_view(), name="api-ha-export-republish"),
]
