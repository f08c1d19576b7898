"""Logging in to the console through its form, and the dashboard a user lands on."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from broker.models import ReplaySchedule, RuleTable
from broker.selectors import queue_summaries
from broker.services.queues import queue_create
from tests.support.console import chart_data

pytestmark = pytest.mark.django_db


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "the form carries no CSRF token"
    return match.group(1)


@pytest.fixture
def demo(capsys) -> dict[str, str]:
    call_command("demo")
    output = capsys.readouterr().out
    return dict(re.findall(r"(\w+)\s+password: (\S+)", output))


def test_it_logs_in_through_the_form_and_shows_the_demo_queues_with_depths(demo):
    browser = Client(enforce_csrf_checks=True)
    login_page = browser.get("/login/")
    assert login_page.status_code == 200

    response = browser.post(
        "/login/",
        {
            "username": "admin",
            "password": demo["admin"],
            "csrfmiddlewaretoken": csrf_token(login_page.content.decode()),
        },
        follow=True,
    )

    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/"
    page = response.content.decode()
    for summary in queue_summaries():
        row = re.search(rf'<tr data-queue="{re.escape(summary.queue.name)}">(.*?)</tr>', page, re.S)
        assert row, f"{summary.queue.name} missing from the dashboard"
        shown = dict(re.findall(r'data-state="(\w+)">(\d+)<', row.group(1)))
        assert {state: int(n) for state, n in shown.items()} == summary.depth
    assert {"ORDERS.IN", "PAYMENTS.IN", "NOTIFY.OUT", "SYSTEM.DEAD.LETTER.QUEUE"} <= set(
        re.findall(r'data-queue="([^"]+)"', page)
    )


def test_a_login_post_without_the_csrf_token_is_refused(demo):
    browser = Client(enforce_csrf_checks=True)

    response = browser.post("/login/", {"username": "admin", "password": demo["admin"]})

    assert response.status_code == 403


def test_a_wrong_password_shows_an_error_on_the_form(demo):
    response = Client().post("/login/", {"username": "admin", "password": "wrong"})

    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()


def test_anonymous_users_are_sent_to_the_login_page(db):
    response = Client().get("/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/")


def test_htmx_polling_gets_only_the_queue_table(client, viewer, orders, publish):
    publish(orders, 4)
    client.force_login(viewer)

    response = client.get("/", headers={"HX-Request": "true"})

    html = response.content.decode()
    assert html.lstrip().startswith('<div id="queue-table"')
    assert "<html" not in html
    assert 'data-state="TBDL">4<' in html


def test_the_dashboard_groups_queues_by_kind_then_name(client, viewer, orders):
    queue_create(name="A.DLQ", kind="dead_letter")
    queue_create(name="ZULU.IN")
    client.force_login(viewer)

    names = re.findall(r'<tr data-queue="([^"]+)"', client.get("/").content.decode())

    assert names == ["A.DLQ", "SYSTEM.DEAD.LETTER.QUEUE", "ORDERS.IN", "ZULU.IN"]


def test_the_page_loads_htmx_from_our_own_static_files(client, viewer):
    client.force_login(viewer)

    html = client.get("/").content.decode()

    scripts = re.findall(r'<script[^>]*src="([^"]+)"', html)
    assert any("django_htmx/htmx" in src for src in scripts)
    assert all(src.startswith("/static/") for src in scripts)


def test_the_api_docs_need_login_and_use_no_cdn(client, viewer):
    assert client.get("/api/docs/")["Location"].startswith("/login/")
    assert client.get("/api/schema/").status_code == 401
    client.force_login(viewer)

    docs = client.get("/api/docs/").content.decode()
    schema = client.get("/api/schema/")

    assert schema.status_code == 200
    assert b"/api/v1/queues/{name}/messages/" in schema.content
    for src in re.findall(r'(?:src|href)="([^"]+)"', docs):
        assert not src.startswith(("http://", "https://", "//")), src


def test_an_unknown_page_is_html_and_an_unknown_api_path_is_json(client, viewer):
    client.force_login(viewer)

    assert b"Not found" in client.get("/nowhere/").content
    api = client.get("/api/v1/nowhere/")
    assert api.status_code == 404
    assert api.json()["code"] == "not_found"


def test_the_demos_thresholds_show_its_blacklisted_orders_as_an_open_alert(demo, client):
    from broker.services.alerts import alerts_check

    alerts_check()
    client.force_login(User.objects.get(username="admin"))

    page = client.get("/").content.decode()
    [row] = re.findall(r'<tr data-alert="\d+"[^>]*>(.*?)</tr>', page, re.S)
    assert 'data-open="true"' in page
    assert "ORDERS.IN" in row
    assert "Messages blacklisted" in row


def test_the_demo_can_run_twice(demo, capsys):
    call_command("demo")

    assert "already exist" in capsys.readouterr().out
    assert len(queue_summaries()) == 5
    assert RuleTable.objects.count() == 1
    [schedule] = ReplaySchedule.objects.all()
    assert (schedule.name, schedule.enabled) == ("retry-failed-orders", False)


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_charts_the_last_hour_and_counts_the_blacklist(viewer, client):
    from broker.services.delivery import queue_deliver
    from broker.services.publish import NewMessage, messages_publish
    from broker.services.queues import queue_create
    from broker.services.transitions.blacklist import messages_quarantine

    queue = queue_create(name="Q", consumer="demo", retry_limit=0, batch_size=10)
    messages_publish(queue_name="Q", messages=[NewMessage(payload=b"ok")] * 4)
    messages_publish(queue_name="Q", messages=[NewMessage(payload=b"FAIL")] * 2)
    queue_deliver(queue_id=queue.id)
    [poison] = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"x")])
    messages_quarantine(reasons={poison: "crashed twice"})
    client.force_login(viewer)

    html = client.get("/").content.decode()

    assert "4 delivered" in html
    assert "2 failed" in html
    assert 'data-tile="blacklisted">1<' in html
    assert 'data-tile="dead-lettered">2<' in html
    chart = chart_data(html, "deliveries")
    totals = {line["name"]: sum(line["values"]) for line in chart["series"]}
    assert totals == {"delivered": 4, "failed": 2}


def test_the_dashboard_says_whether_workers_answer(viewer, client):
    from broker.services.heartbeats import heartbeat

    heartbeat(name="control")
    client.force_login(viewer)

    html = client.get("/").content.decode()

    assert re.search(r'data-worker="control">\s*<strong>control</strong> answering', html)
    assert re.search(r'data-worker="deliveries">\s*<strong>deliveries</strong> never seen', html)


def test_a_worker_silent_past_its_limit_is_shown_as_not_answering(viewer, client):
    from broker.services.heartbeats import heartbeat

    heartbeat(name="control")  # stamped with the database's clock
    client.force_login(viewer)

    with time_machine.travel(timezone.now() + timedelta(seconds=45)):
        html = client.get("/").content.decode()

    assert re.search(
        r'data-worker="control">\s*<strong>control</strong> not answering for 4\d s', html
    )
