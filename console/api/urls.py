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
]
