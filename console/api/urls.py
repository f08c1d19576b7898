from django.urls import path, register_converter

from console.api import (
    archive,
    audit,
    dead_letters,
    ha,
    messages,
    queues,
    replay,
    rule_tables,
    tokens,
    topics,
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

urlpatterns = [
    path("queues/", queues.QueueListView.as_view(), name="api-queues"),
    # Actions on a queue come before the queue itself: "A/pause/" is queue A's
    # pause, not a queue named "A/pause".
    path(
        "queues/<name:name>/pause/",
        queues.QueuePauseView.as_view(paused=True),
        name="api-queue-pause",
    ),
    path(
        "queues/<name:name>/resume/",
        queues.QueuePauseView.as_view(paused=False),
        name="api-queue-resume",
    ),
    path("queues/<name:name>/purge/", queues.QueuePurgeView.as_view(), name="api-queue-purge"),
    # Queue names may contain '/', so the name is a path segment run; the
    # messages route comes first so "A/B/messages/" means queue "A/B".
    path(
        "queues/<name:name>/messages/",
        messages.QueueMessagesView.as_view(),
        name="api-queue-messages",
    ),
    path("queues/<name:name>/", queues.QueueDetailView.as_view(), name="api-queue"),
    path("messages/", triage.MessageListView.as_view(), name="api-messages"),
    path("messages/bulk/", triage.BulkJobCreateView.as_view(), name="api-messages-bulk"),
    path("messages/<int:message_id>/", messages.MessageDetailView.as_view(), name="api-message"),
    *(
        path(
            f"messages/<int:message_id>/{action}/",
            triage.MessageActionView.as_view(operation=action),
            name=f"api-message-{action}",
        )
        for action in ("release", "fail", "purge", "retry", "discard")
    ),
    path(
        "messages/<int:message_id>/forward/",
        triage.MessageForwardView.as_view(),
        name="api-message-forward",
    ),
    path(
        "messages/<int:message_id>/resubmit/",
        triage.MessageResubmitView.as_view(),
        name="api-message-resubmit",
    ),
    path("jobs/<int:job_id>/", triage.JobDetailView.as_view(), name="api-job"),
    path(
        "dead-letter-queues/<name:name>/apply/",
        dead_letters.DeadLetterApplyView.as_view(),
        name="api-dead-letter-queue-apply",
    ),
    path(
        "dead-letter-queues/<name:name>/",
        dead_letters.DeadLetterQueueView.as_view(),
        name="api-dead-letter-queue",
    ),
    path("audit/", audit.AuditListView.as_view(), name="api-audit"),
    path("archive/", archive.ArchiveSearchView.as_view(), name="api-archive"),
    path("tokens/", tokens.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>/", tokens.TokenDetailView.as_view(), name="api-token"),
    path("topics/", topics.TopicListView.as_view(), name="api-topics"),
    path(
        "topics/<name:name>/messages/", topics.TopicPublishView.as_view(), name="api-topic-publish"
    ),
    path("topics/<name:name>/", topics.TopicDetailView.as_view(), name="api-topic"),
    path("subscriptions/", topics.SubscriptionListView.as_view(), name="api-subscriptions"),
    path("rule-tables/", rule_tables.RuleTableListView.as_view(), name="api-rule-tables"),
    path(
        "rule-tables/rollback/",
        rule_tables.RuleTableRollbackView.as_view(),
        name="api-rule-table-rollback",
    ),
    path(
        "rule-tables/<int:table_id>/",
        rule_tables.RuleTableDetailView.as_view(),
        name="api-rule-table",
    ),
    *(
        path(
            f"rule-tables/<int:table_id>/{action}/",
            rule_tables.RuleTableActionView.as_view(operation=action),
            name=f"api-rule-table-{action}",
        )
        for action in ("validate", "dry-run", "activate")
    ),
    path("replay-jobs/", replay.ReplayJobListView.as_view(), name="api-replay-jobs"),
    path("replay-jobs/preview/", replay.ReplayPreviewView.as_view(), name="api-replay-job-preview"),
    path("replay-jobs/<int:job_id>/", replay.ReplayJobDetailView.as_view(), name="api-replay-job"),
    *(
        path(
            f"replay-jobs/<int:job_id>/{action}/",
            replay.ReplayJobActionView.as_view(operation=action),
            name=f"api-replay-job-{action}",
        )
        for action in ("cancel", "run")
    ),
    path(
        "subscriptions/<name:name>/",
        topics.SubscriptionDetailView.as_view(),
        name="api-subscription",
    ),
    path("ha/", ha.HaView.as_view(), name="api-ha"),
    path("ha/switchover/", ha.HaSwitchoverView.as_view(), name="api-ha-switchover"),
    path("ha/resolve/", ha.HaResolveView.as_view(), name="api-ha-resolve"),
    path(
        "ha/exports/<int:export_id>/republish/",
        ha.HaExportRepublishView.as_view(),
        name="api-ha-export-republish",
    ),
]
