from django.urls import path

from console.api import views

urlpatterns = [
    path("queues/", views.QueueListView.as_view(), name="api-queues"),
    # Queue names may contain '/', so the name is a path segment run; the
    # messages route comes first so "A/B/messages/" means queue "A/B".
    path(
        "queues/<path:name>/messages/", views.QueueMessagesView.as_view(), name="api-queue-messages"
    ),
    path("queues/<path:name>/", views.QueueDetailView.as_view(), name="api-queue"),
    path("messages/<int:message_id>/", views.MessageDetailView.as_view(), name="api-message"),
    path("topics/", views.TopicListView.as_view(), name="api-topics"),
    path(
        "topics/<path:name>/messages/", views.TopicPublishView.as_view(), name="api-topic-publish"
    ),
    path("topics/<path:name>/", views.TopicDetailView.as_view(), name="api-topic"),
    path("subscriptions/", views.SubscriptionListView.as_view(), name="api-subscriptions"),
    path("rule-tables/", views.RuleTableListView.as_view(), name="api-rule-tables"),
    path(
        "rule-tables/rollback/",
        views.RuleTableRollbackView.as_view(),
        name="api-rule-table-rollback",
    ),
    path("rule-tables/<int:table_id>/", views.RuleTableDetailView.as_view(), name="api-rule-table"),
    *(
        path(
            f"rule-tables/<int:table_id>/{action}/",
            views.RuleTableActionView.as_view(operation=action),
            name=f"api-rule-table-{action}",
        )
        for action in ("validate", "dry-run", "activate")
    ),
    path("replay-jobs/", views.ReplayJobListView.as_view(), name="api-replay-jobs"),
    path("replay-jobs/preview/", views.ReplayPreviewView.as_view(), name="api-replay-job-preview"),
    path("replay-jobs/<int:job_id>/", views.ReplayJobDetailView.as_view(), name="api-replay-job"),
    *(
        path(
            f"replay-jobs/<int:job_id>/{action}/",
            views.ReplayJobActionView.as_view(operation=action),
            name=f"api-replay-job-{action}",
        )
        for action in ("cancel", "run")
    ),
    path(
        "subscriptions/<path:name>/",
        views.SubscriptionDetailView.as_view(),
        name="api-subscription",
    ),
]
