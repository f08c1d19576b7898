import pytest

from broker.models import AuditEvent, Queue
from broker.services.queues import queue_create

pytestmark = pytest.mark.django_db

QUEUES = "/api/v1/queues/"


def test_an_admin_creates_a_queue_that_dead_letters_to_the_system_queue(admin_api):
    response = admin_api.post(QUEUES, {"name": "PAYROLL.IN", "batch_size": 50}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "PAYROLL.IN"
    assert body["batch_size"] == 50
    assert body["crash_threshold"] == 2
    assert body["poison_limit"] == 5
    assert body["max_payload_bytes"] == 1024 * 1024
    assert body["dead_letter_queue"] == "SYSTEM.DEAD.LETTER.QUEUE"
    assert body["depth"] == {"TBDL": 0, "DLNG": 0, "DLVD": 0, "NDLV": 0, "FAIL": 0}
    assert AuditEvent.objects.filter(action="queue_create", queue_name="PAYROLL.IN").exists()


@pytest.mark.parametrize(
    "name",
    ["", "   ", "ORDERS IN", "Q" * 49, "BESTÄLLNING", "ORDERS*IN", "ORDERS\nIN"],
)
def test_it_rejects_an_invalid_queue_name(admin_api, name):
    response = admin_api.post(QUEUES, {"name": name}, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert "name" in response.json()["field_errors"]
    assert not Queue.objects.exclude(name="SYSTEM.DEAD.LETTER.QUEUE").exists()


def test_it_accepts_every_mq_name_character_and_48_characters(admin_api):
    name = "A.b_1/%" + "Z" * 41

    response = admin_api.post(QUEUES, {"name": name}, format="json")

    assert response.status_code == 201
    assert admin_api.get(f"{QUEUES}{name}/").json()["name"] == name


def test_a_taken_name_is_a_409_conflict_naming_the_field(admin_api, orders):
    response = admin_api.post(QUEUES, {"name": "ORDERS.IN"}, format="json")

    assert (response.status_code, response.json()["code"]) == (409, "already_exists")
    assert "name" in response.json()["field_errors"]


@pytest.mark.parametrize("name", ["NO.SUCH.DLQ", "ORDERS.IN"])
def test_a_dead_letter_queue_that_is_not_there_is_a_404(admin_api, orders, name):
    """As a path naming nothing would be: the body is well formed, what it
    names is missing (ORDERS.IN is no dead-letter queue)."""
    response = admin_api.post(QUEUES, {"name": "NEW.Q", "dead_letter_queue": name}, format="json")

    assert (response.status_code, response.json()["code"]) == (404, "queue_not_found")
    assert response.json()["detail"] == f"There is no dead-letter queue named {name!r}."
    assert not Queue.objects.filter(name="NEW.Q").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("batch_size", "ten"),
        ("crash_threshold", 0),
        ("max_messages", 0),
        ("max_messages", -3),
        ("overflow", "drop_everything"),
        ("kind", "topic"),
        ("max_payload_bytes", 0),
        ("dead_letter_queue", ""),
        ("consumer", "http://["),
        ("alarm_webhook_url", "http://hooks.example:99999/"),
        ("consumer", "ftp://files.example.com/in"),
        ("consumer", "file:///etc/passwd"),
        ("consumer", "javascript:alert(1)"),
        ("consumer", "http://"),
        ("consumer", "no-such-handler"),
        ("suspect_delay_seconds", 5.5),
        ("suspect_delay_seconds", -1),
        ("poison_action", "explode"),
        ("poison_action", ""),
        ("alarm_webhook_url", "ftp://alarms.example.com/"),
        ("alarm_webhook_url", "http://"),
        ("alarm_webhook_url", "javascript:alert(1)"),
        # A host label over 63 characters: no name DNS could be asked for.
        ("alarm_webhook_url", "https://81.29.005.955" + "*" * 100),
        ("consumer", "https://hooks." + "a" * 64 + ".example/"),
        ("alert_waiting_above", -1),
        ("alert_waiting_above", 1_000_000_001),
        ("alert_waiting_above", "many"),
        ("alert_oldest_waiting_seconds", 0),
        ("alert_oldest_waiting_seconds", 31_536_001),
        ("alert_dead_letter_per_minute", -10),
        ("alert_dead_letter_per_minute", 2.5),
        ("alert_blacklisted_above", 10**12),
        ("alert_stalled_seconds", 0),
        ("alert_stalled_seconds", -30),
        ("alert_stalled_seconds", 400 * 24 * 3600),
    ],
)
def test_it_rejects_bad_settings_beside_their_field(admin_api, orders, field, value):
    response = admin_api.post(QUEUES, {"name": "NEW.Q", field: value}, format="json")

    assert response.status_code == 400
    assert field in response.json()["field_errors"]
    assert not Queue.objects.filter(name="NEW.Q").exists()


def test_it_lists_queues_with_depths(viewer_api, orders, publish):
    publish(orders, 3)

    response = viewer_api.get(QUEUES)

    assert response.status_code == 200
    by_name = {queue["name"]: queue for queue in response.json()}
    assert by_name["ORDERS.IN"]["depth"]["TBDL"] == 3
    assert by_name["SYSTEM.DEAD.LETTER.QUEUE"]["kind"] == "dead_letter"


def test_it_lists_queues_by_name_whatever_their_kind(viewer_api, orders):
    queue_create(name="A.DLQ", kind="dead_letter")
    queue_create(name="ZULU.IN")

    names = [queue["name"] for queue in viewer_api.get(QUEUES).json()]

    assert names == ["A.DLQ", "ORDERS.IN", "SYSTEM.DEAD.LETTER.QUEUE", "ZULU.IN"]


def test_a_queue_may_purge_its_poison_and_name_its_own_alarm_webhook(admin_api):
    response = admin_api.post(
        QUEUES,
        {
            "name": "PURGING.Q",
            "poison_action": "purge",
            "alarm_webhook_url": "https://alarms.example.com/lazaretto",
        },
        format="json",
    )

    assert response.status_code == 201, response.json()
    queue = Queue.objects.get(name="PURGING.Q")
    assert (queue.poison_action, queue.alarm_webhook_url) == (
        "purge",
        "https://alarms.example.com/lazaretto",
    )
    default = admin_api.post(QUEUES, {"name": "DEFAULT.Q"}, format="json").json()
    assert (default["poison_action"], default["alarm_webhook_url"]) == ("quarantine", "")


def test_an_admin_updates_settings(admin_api, orders):
    response = admin_api.patch(
        f"{QUEUES}ORDERS.IN/", {"paused": True, "batch_size": 5}, format="json"
    )

    assert response.status_code == 200
    orders.refresh_from_db()
    assert orders.paused is True
    assert orders.batch_size == 5
    event = AuditEvent.objects.get(action="queue_update")
    assert event.details == {"changed": ["batch_size", "paused"], "via_token": "tests"}


def test_a_queue_cannot_be_renamed(admin_api, orders):
    response = admin_api.patch(f"{QUEUES}ORDERS.IN/", {"name": "OTHER"}, format="json")

    assert response.status_code == 400
    assert "name" in response.json()["field_errors"]
    assert Queue.objects.filter(name="ORDERS.IN").exists()


def test_a_bad_update_changes_nothing(admin_api, orders):
    response = admin_api.patch(
        f"{QUEUES}ORDERS.IN/", {"paused": True, "batch_size": -1}, format="json"
    )

    assert response.status_code == 400
    orders.refresh_from_db()
    assert orders.paused is False


def test_a_queue_name_with_a_slash_is_addressable(admin_api):
    admin_api.post(QUEUES, {"name": "EU/ORDERS"}, format="json")

    assert admin_api.get(f"{QUEUES}EU/ORDERS/").json()["name"] == "EU/ORDERS"
    assert admin_api.get(f"{QUEUES}EU/ORDERS/messages/").status_code == 200


def test_unknown_queue_is_404_json(viewer_api, db):
    response = viewer_api.get(f"{QUEUES}NOPE/")

    assert response.status_code == 404
    assert response.json()["code"] == "queue_not_found"


def test_deleting_a_queue_with_waiting_messages_is_refused(admin_api, orders, publish):
    publish(orders, 2)

    response = admin_api.delete(f"{QUEUES}ORDERS.IN/")

    assert response.status_code == 409
    assert response.json()["code"] == "queue_not_empty"
    assert Queue.objects.filter(name="ORDERS.IN").exists()


def test_deleting_a_dead_letter_queue_in_use_is_refused(admin_api, orders):
    response = admin_api.delete(f"{QUEUES}SYSTEM.DEAD.LETTER.QUEUE/")

    assert response.status_code == 409
    assert response.json()["code"] == "queue_in_use"


def test_an_admin_deletes_an_empty_queue(admin_api, orders):
    response = admin_api.delete(f"{QUEUES}ORDERS.IN/")

    assert response.status_code == 204
    assert not Queue.objects.filter(name="ORDERS.IN").exists()
    assert AuditEvent.objects.filter(action="queue_delete", queue_name="ORDERS.IN").exists()


@pytest.mark.parametrize("method", ["post", "patch", "delete"])
def test_only_admins_change_queues(operator_api, viewer_api, orders, method):
    for client in (operator_api, viewer_api):
        path = QUEUES if method == "post" else f"{QUEUES}ORDERS.IN/"
        response = getattr(client, method)(path, {"name": "X", "paused": True}, format="json")
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"
    orders.refresh_from_db()
    assert orders.paused is False
    assert not Queue.objects.filter(name="X").exists()


def test_a_user_without_a_role_reads_nothing(outsider_api, orders):
    assert outsider_api.get(QUEUES).status_code == 403


def test_anonymous_gets_401(anonymous_api, db):
    response = anonymous_api.get(QUEUES)

    assert response.status_code == 401
    assert response.json() == {
        "code": "not_authenticated",
        "detail": "Authentication credentials were not provided.",
    }


@pytest.mark.parametrize("consumer", ["demo", "json", "https://hooks.example.com/lazaretto", ""])
def test_a_queue_names_a_registered_handler_or_a_webhook(admin_api, consumer):
    response = admin_api.post(QUEUES, {"name": "NEW.Q", "consumer": consumer}, format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["consumer"] == consumer


def test_the_unknown_handler_error_lists_the_known_ones(admin_api):
    response = admin_api.post(QUEUES, {"name": "NEW.Q", "consumer": "nope"}, format="json")

    assert "known handlers: demo, json, log, noop" in response.json()["field_errors"]["consumer"][0]


@pytest.mark.parametrize(("value", "status"), [(30, 200), (None, 200), (0, 400), (-1, 400)])
def test_a_queue_keeps_its_own_archive_retention(admin_api, orders, value, status):
    answer = admin_api.patch(
        f"/api/v1/queues/{orders.name}/", {"archive_retention_days": value}, format="json"
    )
    assert answer.status_code == status, answer.json()
    orders.refresh_from_db()
    if status == 200:
        assert answer.json()["archive_retention_days"] == value
        assert orders.archive_retention_days == value
    else:
        assert "archive_retention_days" in answer.json()["field_errors"]
        assert orders.archive_retention_days is None


def test_alert_thresholds_are_set_read_back_and_cleared(admin_api, orders):
    url = f"{QUEUES}ORDERS.IN/"
    thresholds = {
        "alert_waiting_above": 0,
        "alert_oldest_waiting_seconds": 600,
        "alert_dead_letter_per_minute": 100,
        "alert_blacklisted_above": 0,
        "alert_stalled_seconds": 31_536_000,
    }

    response = admin_api.patch(url, thresholds, format="json")

    assert response.status_code == 200, response.json()
    assert {key: response.json()[key] for key in thresholds} == thresholds
    cleared = admin_api.patch(url, {"alert_stalled_seconds": None}, format="json").json()
    assert cleared["alert_stalled_seconds"] is None
    assert cleared["alert_oldest_waiting_seconds"] == 600


def test_an_out_of_range_threshold_names_its_bound(admin_api, orders):
    response = admin_api.patch(
        f"{QUEUES}ORDERS.IN/", {"alert_stalled_seconds": 31_536_001}, format="json"
    )

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert "31536000" in " ".join(body["field_errors"]["alert_stalled_seconds"])
    orders.refresh_from_db()
    assert orders.alert_stalled_seconds is None
