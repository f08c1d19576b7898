"""Times in the console say their zone: the site's (UTC) until a user
chooses theirs on /time-zone/, which then holds for them alone, across
sign-outs; the ``datetime`` attribute stays the moment in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from broker.models import AuditEvent, Message
from broker.services.queues import queue_create
from console.models import Preference
from tests.support.console import error_beside, logged_in
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE, dead_lettered

pytestmark = pytest.mark.django_db

# 15:10:23 UTC is 16:10:23 in Paris (CET, winter time).
MOMENT = datetime(2026, 11, 26, 15, 10, 23, tzinfo=UTC)
IN_UTC = '<time datetime="2026-11-26T15:10:23+00:00" title="UTC">2026-11-26 15:10:23 UTC</time>'
IN_PARIS = (
    '<time datetime="2026-11-26T15:10:23+00:00" title="Europe/Paris">2026-11-26 16:10:23 CET</time>'
)


@pytest.fixture
def event(db: None) -> AuditEvent:
    event = AuditEvent.objects.create(actor_name="system", action="message.release")
    AuditEvent.objects.filter(id=event.id).update(created_at=MOMENT)
    return event


def test_a_time_shows_with_its_zone_utc_by_default(viewer: User, event: AuditEvent) -> None:
    page = logged_in(viewer).get("/audit/").content.decode()
    assert IN_UTC in page
    assert 'href="/time-zone/"' in page


def test_a_user_who_picks_paris_sees_the_same_moment_in_paris_time(
    viewer: User, operator: User, event: AuditEvent
) -> None:
    client = logged_in(viewer)
    answer = client.post("/time-zone/", {"time_zone": "Europe/Paris"}).content.decode()
    assert "Times are now shown in Europe/Paris." in answer
    assert Preference.objects.get(user=viewer).time_zone == "Europe/Paris"
    assert IN_PARIS in client.get("/audit/").content.decode()
    assert IN_UTC in logged_in(operator).get("/audit/").content.decode()


def test_the_choice_survives_signing_out(viewer: User, event: AuditEvent) -> None:
    client = logged_in(viewer)
    client.post("/time-zone/", {"time_zone": "Europe/Paris"})
    client.post("/logout/")
    assert IN_PARIS in logged_in(viewer).get("/audit/").content.decode()


def test_the_form_lists_every_zone_utc_first_and_the_current_one_chosen(viewer: User) -> None:
    page = logged_in(viewer).get("/time-zone/").content.decode()
    options = page[page.index('<select name="time_zone"') :]
    assert options.index('value="UTC"') < options.index('value="Africa/Abidjan"')
    assert '<option value="UTC" selected>' in page
    assert 'value="Europe/Paris"' in page


def test_a_bad_zone_is_refused_beside_the_field_and_nothing_saved(viewer: User) -> None:
    response = logged_in(viewer).post("/time-zone/", {"time_zone": "Mars/Olympus_Mons"})
    assert response.status_code == 200
    assert "Mars/Olympus_Mons is not a time zone" in error_beside(
        response.content.decode(), "time_zone"
    )
    assert not Preference.objects.exists()


def test_anonymous_users_are_sent_to_login(client: Client) -> None:
    for response in (client.get("/time-zone/"), client.post("/time-zone/", {"time_zone": "UTC"})):
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")
    assert not Preference.objects.exists()


def test_the_zone_costs_a_page_one_query(viewer: User) -> None:
    client = logged_in(viewer)
    client.post("/time-zone/", {"time_zone": "Europe/Paris"})
    with CaptureQueriesContext(connection) as page:
        client.get("/audit/")
    on_preferences = [q for q in page.captured_queries if "console_preference" in q["sql"]]
    assert len(on_preferences) == 1


def test_a_dead_letters_time_shows_in_the_users_zone_on_its_queue_and_its_page(
    viewer: User,
) -> None:
    """The dead-letter header keeps its time as ISO text (with microseconds);
    the pages show it as every other time."""
    orders = queue_create(name="ORDERS.IN", consumer="log")
    [message_id] = dead_lettered(orders, 1)
    message = Message.objects.get(id=message_id)
    Message.objects.filter(id=message_id).update(
        dead_letter={**(message.dead_letter or {}), "time": "2026-11-26T15:10:23.019670+00:00"}
    )
    client = logged_in(viewer)
    client.post("/time-zone/", {"time_zone": "Europe/Paris"})
    shown = '<time datetime="2026-11-26T15:10:23.019670+00:00" title="Europe/Paris">2026-11-26 16:10:23 CET</time>'

    queue_page = client.get(f"/dead-letters/{SYSTEM_DEAD_LETTER_QUEUE}/").content.decode()
    message_page = client.get(f"/messages/{message_id}/").content.decode()

    assert shown in queue_page
    assert shown in message_page
    assert "15:10:23.019670" not in queue_page.replace('datetime="2026-11-26T15:10:23.019670', "")
