import pytest

from broker.models import AuditEvent, Message, RuleTable
from tests.support.messages import dead_lettered

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
TABLES = "/api/v1/rule-tables/"


def draft(client, text: str) -> dict:
    response = client.post(TABLES, {"queue": DLQ, "text": text}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_an_admin_drafts_validates_activates_and_rolls_back(admin_api):
    first = draft(admin_api, "ACTION(FWD) FWDQ(PARKED.Q)\n")
    assert (first["version"], first["status"], first["validation"]["valid"]) == (1, "draft", True)

    activated = admin_api.post(f"{TABLES}{first['id']}/activate/").json()
    second = draft(admin_api, "ACTION(DISCARD)\n")
    admin_api.post(f"{TABLES}{second['id']}/activate/")
    rolled = admin_api.post(f"{TABLES}rollback/", {"queue": DLQ}, format="json").json()

    assert activated["status"] == "active"
    assert (rolled["version"], rolled["status"]) == (1, "active")
    assert RuleTable.objects.get(version=2).status == "retired"
    assert [v["version"] for v in admin_api.get(TABLES, {"queue": DLQ}).json()] == [2, 1]
    assert AuditEvent.objects.filter(action="rule_table_rollback").exists()


def test_a_table_with_errors_reports_each_at_its_line_and_cannot_be_activated(admin_api):
    table = draft(admin_api, "ACTION(FWD)\n* fine\nACTION(DISCARD) HEADER(NO)\n")

    errors = table["validation"]["errors"]
    response = admin_api.post(f"{TABLES}{table['id']}/activate/")

    assert {error["line"] for error in errors} == {1, 3}
    assert response.status_code == 409
    assert response.json()["code"] == "rules_invalid"
    assert response.json()["errors"] == errors
    assert RuleTable.objects.get(id=table["id"]).status == "draft"


def test_only_drafts_change(admin_api):
    table = draft(admin_api, "ACTION(IGNORE)\n")
    edited = admin_api.patch(
        f"{TABLES}{table['id']}/", {"text": "ACTION(DISCARD)\n"}, format="json"
    )
    admin_api.post(f"{TABLES}{table['id']}/activate/")

    frozen = admin_api.patch(f"{TABLES}{table['id']}/", {"text": "ACTION(IGNORE)\n"}, format="json")

    assert edited.json()["text"] == "ACTION(DISCARD)\n"
    assert frozen.status_code == 409
    assert frozen.json()["code"] == "not_a_draft"


def test_a_dry_run_counts_hits_per_rule_and_changes_nothing(admin_api, orders, publish):
    ids = [
        *dead_lettered(orders, 1, reason="handler_error"),
        *dead_lettered(orders, 3, reason="format_error"),
    ]
    table = draft(
        admin_api,
        "REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\nREASON(LZRC_HANDLER_ERROR) ACTION(RETRY)\nDESTQ(X) ACTION(IGNORE)\n",
    )

    run = admin_api.post(f"{TABLES}{table['id']}/dry-run/").json()

    assert (run["examined"], run["ignored"]) == (4, 0)
    assert [(rule["rule"], rule["hits"]) for rule in run["rules"]] == [(1, 3), (2, 1), (3, 0)]
    assert run["rules"][1]["samples"] == [ids[0]]
    assert Message.objects.filter(queue__name=DLQ).count() == 4


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queue": "", "text": "ACTION(IGNORE)"}, "queue"),
        ({"queue": DLQ, "text": "   "}, "text"),
        ({"queue": DLQ}, "text"),
    ],
)
def test_bad_drafts_are_field_errors(admin_api, orders, body, field):
    response = admin_api.post(TABLES, body, format="json")

    assert response.status_code == 400
    assert field in response.json()["field_errors"]
    assert not RuleTable.objects.exists()


@pytest.mark.parametrize("queue", ["ORDERS.IN", "NO.SUCH"])
def test_a_draft_for_a_queue_that_is_no_dead_letter_queue_is_404(admin_api, orders, queue):
    response = admin_api.post(TABLES, {"queue": queue, "text": "ACTION(IGNORE)"}, format="json")

    assert (response.status_code, response.json()["code"]) == (404, "queue_not_found")
    assert not RuleTable.objects.exists()


def test_viewers_read_and_dry_run_but_do_not_change_tables(admin_api, viewer_api):
    table = draft(admin_api, "ACTION(IGNORE)\n")

    assert viewer_api.get(f"{TABLES}{table['id']}/").status_code == 200
    assert viewer_api.post(f"{TABLES}{table['id']}/dry-run/").status_code == 200
    assert viewer_api.post(f"{TABLES}{table['id']}/activate/").status_code == 403
    assert (
        viewer_api.post(TABLES, {"queue": DLQ, "text": "ACTION(IGNORE)"}, format="json").status_code
        == 403
    )
    assert RuleTable.objects.get().status == "draft"


def test_rollback_without_history_is_refused(admin_api):
    response = admin_api.post(f"{TABLES}rollback/", {"queue": DLQ}, format="json")

    assert response.status_code == 409
    assert response.json()["code"] == "nothing_to_roll_back"


def test_an_inputq_naming_another_queue_is_an_error(admin_api):
    table = draft(admin_api, "INPUTQ(OTHER.DLQ)\nACTION(IGNORE)\n")

    assert not table["validation"]["valid"]
    assert "OTHER.DLQ" in table["validation"]["errors"][0]["message"]


def test_a_table_posted_with_activate_is_at_once_the_active_version(admin_api):
    response = admin_api.post(
        TABLES, {"queue": DLQ, "text": "ACTION(IGNORE)\n", "activate": True}, format="json"
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["version"], body["status"]) == (1, "active")
    assert "activate" not in body  # write-only
    assert RuleTable.objects.get().status == "active"
    assert list(
        AuditEvent.objects.filter(action__startswith="rule_table")
        .order_by("id")
        .values_list("action", flat=True)
    ) == ["rule_table_create", "rule_table_activate"]


def test_a_table_with_errors_posted_with_activate_is_409_and_nothing_is_stored(admin_api):
    response = admin_api.post(
        TABLES, {"queue": DLQ, "text": "* ok\nACTION(FWD)\n", "activate": True}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["code"] == "rules_invalid"
    assert [error["line"] for error in response.json()["errors"]] == [2]
    assert not RuleTable.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="rule_table").exists()


def test_a_blank_table_posted_with_activate_is_400_and_nothing_is_stored(admin_api):
    response = admin_api.post(
        TABLES, {"queue": DLQ, "text": "  \n\t", "activate": True}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert "text" in response.json()["field_errors"]
    assert not RuleTable.objects.exists()


def test_without_activate_a_posted_table_is_a_draft_and_the_active_one_stays(admin_api):
    active = admin_api.post(
        TABLES, {"queue": DLQ, "text": "ACTION(IGNORE)\n", "activate": True}, format="json"
    ).json()

    draft(admin_api, "ACTION(DISCARD)\n")

    assert RuleTable.objects.get(status="active").id == active["id"]
    assert RuleTable.objects.get(version=2).status == "draft"


def test_the_schema_documents_activate_as_a_write_only_flag(viewer_api):
    schema = viewer_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    activate = schema["components"]["schemas"]["RuleTableRequest"]["properties"]["activate"]
    assert (activate["type"], activate["default"], activate["writeOnly"]) == (
        "boolean",
        False,
        True,
    )


def test_applying_the_active_table_answers_every_count_of_the_scan(admin_api, orders):
    dead_lettered(orders, 2, reason="format_error")
    admin_api.post(
        TABLES, {"queue": DLQ, "text": "ACTION(DISCARD)\n", "activate": True}, format="json"
    )

    answer = admin_api.post(f"/api/v1/dead-letter-queues/{DLQ}/apply/")

    assert answer.status_code == 200
    assert answer.json() == {
        "examined": 2,
        "retried": 0,
        "forwarded": 0,
        "discarded": 2,
        "ignored": 0,
        "failed": 0,
        "without_header": 0,
    }
