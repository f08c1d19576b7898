from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from drf_spectacular.views import (
    SpectacularRedocView,
    SpectacularSwaggerView,
)

from console.api.errors import unknown_path
from console.api.schema import SchemaView
from console.views import (
    archive,
    audit,
    blacklist,
    dashboard,
    dead_letters,
    ha,
    login,
    messages,
    ops,
    queues,
    replay,
    schedules,
    time_zones,
    tokens,
    topics,
    transfer,
    users,
)

MESSAGE = "messages/<int:message_id>/"
SCHEDULE = "replay/schedules/<int:schedule_id>/"
DLQ = "dead-letters/<path:name>/"

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("topics/", topics.topics, name="topics"),
    path("topics/new/", topics.topic_new, name="topic-new"),
    path("subscriptions/new/", topics.subscription_new, name="subscription-new"),
    path(
        "subscriptions/<path:name>/delete/", topics.subscription_remove, name="subscription-delete"
    ),
    path("subscriptions/<path:name>/", topics.subscription_edit, name="subscription-edit"),
    path("queues/", dashboard.queue_new, name="queue-new"),
    path("queues/<path:name>/publish/", queues.queue_publish_view, name="queue-publish"),
    path("queues/<path:name>/limits/", queues.queue_limits, name="queue-limits"),
    path("queues/<path:name>/activity/", queues.queue_activity_view, name="queue-activity"),
    path("queues/<path:name>/settings/", queues.queue_settings, name="queue-settings"),
    path("queues/<path:name>/pause/", queues.queue_pause_view, name="queue-pause"),
    path("queues/<path:name>/purge/", queues.queue_purge_view, name="queue-purge"),
    path("queues/<path:name>/import/", transfer.queue_import_view, name="queue-import"),
    path("queues/<path:name>/", queues.queue_detail, name="queue"),
    path("messages/", messages.message_list, name="messages"),
    path("messages/export/", transfer.messages_export_view, name="messages-export"),
    path(MESSAGE, messages.message_detail, name="message"),
    path(f"{MESSAGE}payload/", messages.message_payload, name="message-payload"),
    path(f"{MESSAGE}dump/", messages.message_dump, name="message-dump"),
    path(f"{MESSAGE}release/", messages.message_release_view, name="message-release"),
    path(f"{MESSAGE}fail/", messages.message_fail_view, name="message-fail"),
    path(f"{MESSAGE}purge/", messages.message_purge_view, name="message-purge"),
    path(f"{MESSAGE}resubmit/", messages.message_resubmit_view, name="message-resubmit"),
    path("blacklist/", blacklist.blacklist, name="blacklist"),
    path("blacklist/bulk/", blacklist.blacklist_bulk, name="blacklist-bulk"),
    path("jobs/<int:job_id>/", blacklist.bulk_job_page, name="bulk-job"),
    path("audit/", audit.audit_log, name="audit"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("time-zone/", time_zones.time_zone, name="time-zone"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke_view, name="token-revoke"),
    path("users/", users.users, name="users"),
    path("users/<str:name>/role/", users.user_role_view, name="user-role"),
    path("users/<str:name>/deactivate/", users.user_deactivate_view, name="user-deactivate"),
    path("grants/", users.grant_new, name="grant-new"),
    path("grants/<int:grant_id>/remove/", users.grant_remove_view, name="grant-remove"),
    path("groups/", users.groups, name="groups"),
    path("groups/<str:name>/delete/", users.group_delete_view, name="group-delete"),
    path(
        "groups/<str:name>/members/add/",
        users.group_member_view,
        {"verb": "add"},
        name="group-member-add",
    ),
    path(
        "groups/<str:name>/members/remove/",
        users.group_member_view,
        {"verb": "remove"},
        name="group-member-remove",
    ),
    path("replay/", replay.replay_jobs, name="replay-jobs"),
    path("replay/new/", replay.replay_new, name="replay-new"),
    path("replay/preview/", replay.replay_preview_view, name="replay-preview"),
    path("replay/<int:job_id>/", replay.replay_job_page, name="replay-job"),
    path("replay/<int:job_id>/cancel/", replay.replay_job_cancel_view, name="replay-cancel"),
    path("replay/<int:job_id>/run/", replay.replay_job_run_view, name="replay-run"),
    path("replay/schedules/", schedules.schedules, name="schedules"),
    path("replay/schedules/new/", schedules.schedule_new, name="schedule-new"),
    path("replay/schedules/firings/", schedules.schedule_firings, name="schedule-firings"),
    path(SCHEDULE, schedules.schedule_page, name="schedule"),
    path(f"{SCHEDULE}edit/", schedules.schedule_edit, name="schedule-edit"),
    path(f"{SCHEDULE}pause/", schedules.schedule_pause_view, name="schedule-pause"),
    path(f"{SCHEDULE}resume/", schedules.schedule_resume_view, name="schedule-resume"),
    path(f"{SCHEDULE}run/", schedules.schedule_run_view, name="schedule-run"),
    path(f"{SCHEDULE}delete/", schedules.schedule_delete_view, name="schedule-delete"),
    path("archive/", archive.archive, name="archive"),
    path("ha/", ha.ha, name="ha"),
    path("ha/switchover/", ha.ha_switchover_view, name="ha-switchover"),
    path("ha/resolve/", ha.ha_resolve_view, name="ha-resolve"),
    path("ha/exports/<int:export_id>/republish/", ha.ha_republish_view, name="ha-republish"),
    path("dead-letters/", dead_letters.dead_letter_queues, name="dead-letter-queues"),
    path(f"{DLQ}rules/", dead_letters.rules_editor, name="rules-editor"),
    path(f"{DLQ}rules/rollback/", dead_letters.rules_rollback, name="rules-rollback"),
    path(f"{DLQ}rules/<int:version>/", dead_letters.rules_version, name="rules-version"),
    path(f"{DLQ}rules/<int:version>/activate/", dead_letters.rules_activate, name="rules-activate"),
    path(f"{DLQ}apply/", dead_letters.dead_letter_apply_rules, name="dead-letter-apply"),
    path(
        f"{DLQ}messages/<int:message_id>/<str:verb>/",
        dead_letters.dead_letter_act,
        name="dead-letter-act",
    ),
    path(DLQ, dead_letters.dead_letter_queue, name="dead-letter-queue"),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("login/", login.SignIn.as_view(), name="login"),
    path("oidc/authenticate/", login.sso_start, name="oidc_authentication_init"),
    path("oidc/callback/", login.sso_callback, name="oidc_authentication_callback"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("console.api.urls")),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        login_required(SpectacularSwaggerView.as_view(url_name="api-schema")),
        name="api-docs",
    ),
    path(
        "api/redoc/",
        login_required(
            SpectacularRedocView.as_view(
                url_name="api-schema", template_name="console/api_redoc.html"
            )
        ),
        name="api-redoc",
    ),
    # Last: whatever else is under /api/ answers the API's JSON 404.
    re_path(r"^api/", unknown_path, name="api-unknown-path"),
]

handler400 = "console.views.common.bad_request"
handler403 = "console.views.common.permission_denied"
handler404 = "console.views.common.not_found"
handler500 = "console.views.common.server_error"
