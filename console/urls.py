from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("topics/", views.topics, name="topics"),
    path("topics/new/", views.topic_new, name="topic-new"),
    path("subscriptions/new/", views.subscription_new, name="subscription-new"),
    path(
        "subscriptions/<path:name>/delete/", views.subscription_remove, name="subscription-delete"
    ),
    path("subscriptions/<path:name>/", views.subscription_edit, name="subscription-edit"),
    path("queues/<path:name>/limits/", views.queue_limits, name="queue-limits"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("console.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        login_required(SpectacularSwaggerView.as_view(url_name="api-schema")),
        name="api-docs",
    ),
]

handler404 = "console.views.not_found"
