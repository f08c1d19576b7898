"""Console pages of replay schedules: the list, the form with its preview of
the next firings, a schedule's page, pause, resume, run now and delete, and
what a dead-letter queue's page says of the schedules reading it. No Spark
and no workers: a firing's job stays queued unless a test moves it on."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html import unescape
from typing import Any

import pytest
import time_machine
from django.test import Client
from django_celery_beat.models import PeriodicTask

from broker.models import Message, ReplayJob, ReplaySchedule, ScheduleFiring
from broker.pipeline.schedules import (
    ScheduleSpec,
    Timing,
    schedule_create,
    schedule_delete,
    schedule_pause,
    schedule_run_now,
)
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.services.queues import queue_create
from console.time_zones import time_zone_set
from tests.support.console import error_beside, logged_in
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE as DLQ
from tests.support.messages import dead_lettered
from tests.support.replay import reported

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
TABLE = {**HX, "HX-Target": "schedule-table"}
SCRIPT = "<script>alert(1)</script>"
# Clocks go forward in Paris at 01:00 UTC on 29 March 2026; in New York
# they went forward on 8 March (EDT, UTC-4).
FRIDAY_NOON = datetime(2026, 3, 27, 12, tzinfo=UTC)


def schedule_form(**values: Any) -> dict[str, Any]:
    """A valid schedule as the form posts it, changed by ``values``."""
    return {
        "name": "nightly",
        "source": "dead_letter",
        "source_queue": DLQ,
        "cron": "0 3 * * *",
        "time_zone": "Europe/Paris",
        "every_seconds": "",
        "cool_off_minutes": "30",
        "give_up_after": "3",
        "enabled": "on",
        **values,
    }


def a_schedule(name: str = "nightly", **values: Any) -> ReplaySchedule:
    replay = values.pop("replay", ReplaySpec(source="dead_letter", source_queue=DLQ))
    timing = values.pop("timing", Timing(cron="0 3 * * *", time_zone="Europe/Paris"))
    spec = ScheduleSpec(name=name, replay=replay, timing=timing, **values)
    return schedule_create(spec=spec, actor=None)


def run_now(schedule: ReplaySchedule, user: Any) -> ReplayJob:
    """Run now, as ``user``: the job it queued."""
    job = schedule_run_now(schedule_id=schedule.id, actor=user).job
    assert job is not None
    return job


def task_of(schedule: ReplaySchedule) -> PeriodicTask:
    """The periodic task beat reads for ``schedule``, as stored now."""
    return PeriodicTask.objects.get(replay_schedule=schedule)


def firings_shown(html: str) -> list[str]:
    """The times the preview lists, as the page shows them."""
    match = re.search(r"<ol data-firings>(.*?)</ol>", html, re.S)
    assert match, "no firings listed"
    return [unescape(text) for text in re.findall(r"<time [^>]*>([^<]+)</time>", match.group(1))]


def row_of(html: str, schedule: ReplaySchedule) -> str:
    match = re.search(rf'<tr data-schedule="{schedule.id}">(.*?)</tr>', html, re.S)
    assert match, f"no row for {schedule.name}"
    return match.group(1)


def cell(html: str, name: str) -> str:
    """The text of the cell or value marked ``data-<name>``."""
    match = re.search(rf"data-{name}[^>]*>(.*?)</(?:td|dd)>", html, re.S)
    assert match, f"no data-{name}"
    return " ".join(unescape(re.sub(r"<[^>]+>", "", match.group(1))).split())


# --- roles ----------------------------------------------------------------------


def test_a_viewer_reads_the_schedules_but_may_not_change_them(viewer):
    schedule = a_schedule()
    client = logged_in(viewer)

    listing = client.get("/replay/schedules/")
    page = client.get(f"/replay/schedules/{schedule.id}/")
    firings = client.get("/replay/schedules/firings/", {"cron": "0 3 * * *"})

    assert listing.status_code == page.status_code == firings.status_code == 200
    for html in (listing.content.decode(), page.content.decode()):
        assert "New schedule" not in html
        assert "Pause" not in html
        assert "Run now" not in html
        assert "Delete" not in html
    assert client.get("/replay/schedules/new/").status_code == 403
    assert client.post("/replay/schedules/new/", schedule_form(name="other")).status_code == 403
    assert client.get(f"/replay/schedules/{schedule.id}/edit/").status_code == 403
    for action in ("edit", "pause", "resume", "run", "delete"):
        path = f"/replay/schedules/{schedule.id}/{action}/"
        assert client.post(path, schedule_form()).status_code == 403, action
    schedule.refresh_from_db()
    assert (ReplaySchedule.objects.count(), schedule.enabled, schedule.deleted_at) == (
        1,
        True,
        None,
    )
    assert not ReplayJob.objects.exists()


def test_an_operator_sees_the_new_link_and_the_row_actions(operator):
    schedule = a_schedule()

    html = logged_in(operator).get("/replay/schedules/").content.decode()

    assert 'href="/replay/schedules/new/"' in html
    row = row_of(html, schedule)
    for action in ("pause", "run", "delete"):
        assert f'action="/replay/schedules/{schedule.id}/{action}/"' in row
    assert f'href="/replay/schedules/{schedule.id}/edit/"' in row
    assert 'hx-confirm="Delete replay schedule nightly? Its jobs stay."' in row


def test_anonymous_users_are_sent_to_the_login_page(db):
    schedule = a_schedule()
    client = Client()

    paths = ["/replay/schedules/", "/replay/schedules/new/", "/replay/schedules/firings/"]
    paths += [f"/replay/schedules/{schedule.id}/", f"/replay/schedules/{schedule.id}/edit/"]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 302, path
        assert response["Location"].startswith("/login/?next="), path
    for action in ("pause", "run", "delete"):
        assert client.post(f"/replay/schedules/{schedule.id}/{action}/").status_code == 302
    assert client.post("/replay/schedules/new/", schedule_form(name="x")).status_code == 302
    assert ReplaySchedule.objects.filter(deleted_at__isnull=True).count() == 1


def test_every_schedule_post_needs_its_csrf_token(operator):
    schedule = a_schedule()
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)

    assert client.post("/replay/schedules/new/", schedule_form(name="x")).status_code == 403
    for action in ("edit", "pause", "run", "delete"):
        path = f"/replay/schedules/{schedule.id}/{action}/"
        assert client.post(path, schedule_form()).status_code == 403, action
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.deleted_at, ReplayJob.objects.count()) == (True, None, 0)


def test_the_nav_links_to_the_schedules_next_to_replay(viewer):
    html = logged_in(viewer).get("/replay/schedules/").content.decode()

    assert re.search(
        r'<a href="/replay/" >Replay</a>\s*<a href="/replay/schedules/" aria-current="page">'
        r"Schedules</a>",
        html,
    )


def test_an_unknown_schedule_is_not_found(operator):
    client = logged_in(operator)

    assert client.get("/replay/schedules/999999/").status_code == 404
    assert client.get("/replay/schedules/999999/edit/").status_code == 404
    for action in ("pause", "resume", "run", "delete"):
        assert client.post(f"/replay/schedules/999999/{action}/").status_code == 404, action


# --- the list ---------------------------------------------------------------------


@time_machine.travel(FRIDAY_NOON, tick=False)
def test_the_list_shows_each_schedules_timing_state_next_firing_and_last_job(operator):
    time_zone_set(user=operator, name="America/New_York")
    nightly = a_schedule()
    every = a_schedule("every minute", timing=Timing(every_seconds=60), enabled=False)
    fresh = a_schedule("fresh", timing=Timing(every_seconds=3600))
    job = run_now(nightly, operator)
    reported(job.id, "done", (10, 10, 8, 7, 0, 1))

    html = logged_in(operator).get("/replay/schedules/").content.decode()

    nightly_row, every_row = row_of(html, nightly), row_of(html, every)
    assert "0 3 * * * (Europe/Paris)" in nightly_row
    assert cell(nightly_row, "state") == "enabled"
    # 03:00 in Paris on Saturday is 22:00 on Friday in New York.
    assert cell(nightly_row, "next") == "2026-03-27 22:00:00 EDT"
    assert f'<a href="/replay/{job.id}/">job {job.id}</a>' in nightly_row
    assert cell(nightly_row, "last-job") == f"job {job.id} Done: 7 written, 1 failed"
    assert f'action="/replay/schedules/{nightly.id}/pause/"' in nightly_row
    assert "every 60 s" in every_row
    assert cell(every_row, "state") == "paused"
    assert cell(every_row, "next") == "—"
    assert f'action="/replay/schedules/{every.id}/resume/"' in every_row
    assert cell(row_of(html, fresh), "last-job") == "none yet"
    assert cell(row_of(html, fresh), "next") == "2026-03-27 09:00:00 EDT"
    assert "hx-trigger" not in html  # no job that can still change: no polling


def test_the_list_polls_while_a_last_job_runs(operator):
    schedule = a_schedule()
    run_now(schedule, operator)
    client = logged_in(operator)

    html = client.get("/replay/schedules/").content.decode()
    partial = client.get("/replay/schedules/", headers=HX).content.decode()

    assert 'hx-trigger="every 2s [document.visibilityState' in html
    assert "(0%)" in cell(row_of(html, schedule), "last-job")
    assert partial.lstrip().startswith('<div id="schedule-table"')


def test_a_deleted_schedule_leaves_the_list(operator):
    schedule = a_schedule()
    schedule_delete(schedule_id=schedule.id, actor=None)

    html = logged_in(operator).get("/replay/schedules/").content.decode()

    assert "No replay schedules yet." in html


# --- the form ---------------------------------------------------------------------


def test_the_form_starts_in_the_users_time_zone_and_gives_up_after_3(operator):
    time_zone_set(user=operator, name="Asia/Tokyo")

    html = logged_in(operator).get("/replay/schedules/new/").content.decode()

    assert 'name="time_zone" value="Asia/Tokyo"' in html
    assert re.search(r'<input type="number" name="give_up_after" value="3"', html)
    assert re.search(r'<input type="number" name="cool_off_minutes" value="0"', html)
    assert re.search(r'<input type="checkbox" name="enabled"[^>]* checked', html)
    assert '<option value="Europe/Paris">' in html  # the zones to pick from
    assert 'name="dry_run"' not in html  # a schedule writes
    assert '<option value="delivered"' not in html  # nor reads what is not dead
    assert "Give a cron line (five fields) or an interval." in html  # no timing yet


def test_a_dead_letter_queues_new_schedule_link_fills_in_its_queue(operator):
    html = logged_in(operator).get(f"/dead-letters/{DLQ}/").content.decode()
    link = re.search(r'href="(/replay/schedules/new/\?[^"]+)">New schedule', html)
    assert link

    form = logged_in(operator).get(unescape(link.group(1))).content.decode()

    assert f'<option value="{DLQ}" selected>' in form


def test_an_operator_creates_a_cron_schedule_and_sees_its_page(operator, orders):
    client = logged_in(operator)

    response = client.post(
        "/replay/schedules/new/",
        schedule_form(queues="ORDERS.IN", reason="handler_error", velocity="50"),
    )

    schedule = ReplaySchedule.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/replay/schedules/{schedule.id}/"
    assert (schedule.name, schedule.source, schedule.source_queue) == (
        "nightly",
        "dead_letter",
        DLQ,
    )
    assert schedule.filters == {"queues": ["ORDERS.IN"], "reason": "handler_error"}
    assert (schedule.velocity, schedule.cool_off_minutes, schedule.give_up_after) == (50, 30, 3)
    crontab = task_of(schedule).crontab
    assert (crontab.minute, crontab.hour, str(crontab.timezone)) == ("0", "3", "Europe/Paris")
    assert schedule.enabled
    assert schedule.created_by == operator
    html = client.get(response["Location"]).content.decode()
    assert "Replay schedule nightly saved." in html


def test_an_interval_schedule_left_unticked_is_saved_paused(operator):
    form = schedule_form(name="often", cron="", time_zone="", every_seconds="90")
    del form["enabled"]

    logged_in(operator).post("/replay/schedules/new/", form)

    schedule = ReplaySchedule.objects.get()
    task = task_of(schedule)
    assert (task.interval.every, task.crontab) == (90, None)
    assert not schedule.enabled


YEAR = str(365 * 24 * 3600 + 1)


@pytest.mark.parametrize(
    ("values", "field", "said"),
    [
        ({"cron": "61 * * * *"}, "cron", "Not a valid cron line"),
        ({"cron": "0 24 * * *"}, "cron", "Not a valid cron line"),
        ({"cron": "0 3 * * * *"}, "cron", "A cron line has five fields"),
        ({"cron": ""}, "cron", "Give a cron line (five fields) or an interval."),
        ({"every_seconds": "60"}, "cron", "Give a cron line or an interval, not both."),
        ({"time_zone": "Europe/Pariss"}, "time_zone", "'Europe/Pariss' is not a time zone"),
        ({"cron": "", "every_seconds": "0"}, "every_seconds", "Give from 1 to 31,536,000 seconds"),
        ({"cron": "", "every_seconds": YEAR}, "every_seconds", "Give from 1 to 31,536,000"),
        ({"cron": "", "every_seconds": "1.5"}, "every_seconds", "Enter a whole number."),
        ({"give_up_after": "0"}, "give_up_after", "Give from 1 to 100 replays."),
        ({"cool_off_minutes": "-1"}, "cool_off_minutes", "Give from 0 to 525,600 minutes."),
        ({"name": ""}, "name", "This field is required."),
        ({"source_queue": "ORDERS.IN"}, "source_queue", "ORDERS.IN is not a dead-letter queue"),
        ({"target_queue": "NO.SUCH"}, "target_queue", "There is no queue named 'NO.SUCH'."),
        ({"target_queue": DLQ}, "target_queue", f"{DLQ} is a dead-letter queue"),
        ({"source": "delivered"}, "source", "Select a valid choice."),
        ({"velocity": "0"}, "velocity", "Give from 1 to 1,000,000 messages per second"),
    ],
)
def test_a_bad_schedule_shows_the_error_beside_its_field_and_saves_nothing(
    operator, orders, values, field, said
):
    response = logged_in(operator).post("/replay/schedules/new/", schedule_form(**values))

    html = response.content.decode()
    assert response.status_code == 200
    assert said in error_beside(html, field)
    assert "Nothing was saved" in html
    assert not ReplaySchedule.objects.exists()


def test_a_name_another_schedule_has_is_refused_beside_the_name(operator):
    a_schedule()

    html = logged_in(operator).post("/replay/schedules/new/", schedule_form()).content.decode()

    assert "Another schedule has this name." in error_beside(html, "name")
    assert ReplaySchedule.objects.count() == 1


def test_a_replay_error_and_a_timing_error_show_together(operator):
    form = schedule_form(target_queue="NO.SUCH", cron="0 3 * *")

    html = logged_in(operator).post("/replay/schedules/new/", form).content.decode()

    assert "There is no queue named 'NO.SUCH'." in error_beside(html, "target_queue")
    assert "A cron line has five fields" in error_beside(html, "cron")
    assert not ReplaySchedule.objects.exists()


# --- the preview of the next firings ---------------------------------------------


@time_machine.travel(FRIDAY_NOON, tick=False)
def test_the_preview_lists_the_next_five_firings_in_the_users_time_zone(viewer):
    """03:00 in Paris is 02:00 UTC before Paris moves its clocks, 01:00 UTC
    after; New York (already on EDT) sees 22:00, then 21:00, the day before."""
    time_zone_set(user=viewer, name="America/New_York")

    response = logged_in(viewer).get(
        "/replay/schedules/firings/", {"cron": "0 3 * * *", "time_zone": "Europe/Paris"}, headers=HX
    )

    html = response.content.decode()
    assert html.lstrip().startswith('<div id="schedule-firings"')  # only the list, swapped in
    assert "in your time zone (America/New_York)" in html
    assert firings_shown(html) == [
        "2026-03-27 22:00:00 EDT",
        "2026-03-28 21:00:00 EDT",
        "2026-03-29 21:00:00 EDT",
        "2026-03-30 21:00:00 EDT",
        "2026-03-31 21:00:00 EDT",
    ]
    assert '<time datetime="2026-03-28T02:00:00+00:00"' in html
    assert '<time datetime="2026-03-29T01:00:00+00:00"' in html


@time_machine.travel(FRIDAY_NOON, tick=False)
def test_the_preview_of_an_interval_counts_from_now(viewer):
    html = (
        logged_in(viewer)
        .get("/replay/schedules/firings/", {"every_seconds": "90"}, headers=HX)
        .content.decode()
    )

    assert firings_shown(html) == [
        "2026-03-27 12:01:30 UTC",
        "2026-03-27 12:03:00 UTC",
        "2026-03-27 12:04:30 UTC",
        "2026-03-27 12:06:00 UTC",
        "2026-03-27 12:07:30 UTC",
    ]


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"cron": "0 3 * * * *"}, "A cron line has five fields"),
        ({"cron": "0 3 * * *", "time_zone": "Mars/Olympus"}, "is not a time zone"),
        ({"every_seconds": "0"}, "Give from 1 to 31,536,000 seconds"),
        ({"every_seconds": "soon"}, "Enter a whole number."),
        ({"cron": f"{SCRIPT} * * * *"}, "Not a valid cron line"),
    ],
)
def test_the_preview_says_what_is_wrong_with_the_timing(viewer, query, said):
    html = logged_in(viewer).get("/replay/schedules/firings/", query, headers=HX).content.decode()

    assert "data-firings" not in html
    assert said in unescape(html)
    assert SCRIPT not in html


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "1,,2 * * * *"])
def test_a_cron_line_that_cannot_fire_is_refused_and_previewed_as_such(operator, cron):
    client = logged_in(operator)

    preview = client.get("/replay/schedules/firings/", {"cron": cron}, headers=HX)
    refused = client.post("/replay/schedules/new/", schedule_form(cron=cron))

    assert preview.status_code == refused.status_code == 200
    assert "data-firings" not in preview.content.decode()
    assert error_beside(refused.content.decode(), "cron")
    assert not ReplaySchedule.objects.exists()


def test_without_javascript_the_preview_is_a_whole_page(viewer):
    html = logged_in(viewer).get("/replay/schedules/firings/", {"cron": "*/5 * * * *"})

    assert "<h1>Next firings</h1>" in html.content.decode()
    assert len(firings_shown(html.content.decode())) == 5


@time_machine.travel(FRIDAY_NOON, tick=False)
def test_the_form_shows_the_next_firings_of_what_it_holds(operator):
    time_zone_set(user=operator, name="Europe/Paris")
    schedule = a_schedule(timing=Timing(cron="30 6 * * 1", time_zone="UTC"))
    client = logged_in(operator)

    edit = client.get(f"/replay/schedules/{schedule.id}/edit/").content.decode()
    refused = client.post(
        "/replay/schedules/new/", schedule_form(name="", cron="0 12 * * *", time_zone="UTC")
    ).content.decode()

    assert firings_shown(edit)[:2] == ["2026-03-30 08:30:00 CEST", "2026-04-06 08:30:00 CEST"]
    assert firings_shown(refused)[0] == "2026-03-28 13:00:00 CET"
    # Typing in the timing asks for the list again, for the fields typed.
    assert 'hx-get="/replay/schedules/firings/"' in edit
    assert 'hx-include="this"' in edit


# --- edit -------------------------------------------------------------------------------


def test_the_edit_form_shows_the_schedule(operator, orders):
    since = datetime(2026, 3, 1, 8, tzinfo=UTC)
    replay = ReplaySpec(
        source="dead_letter",
        source_queue=DLQ,
        filter=MessageSelection(queues=("ORDERS.IN",), since=since, header="region=eu"),
        target_queue="ORDERS.IN",
        velocity=20,
    )
    schedule = a_schedule(
        replay=replay, timing=Timing(every_seconds=600), cool_off_minutes=15, give_up_after=5
    )

    html = logged_in(operator).get(f"/replay/schedules/{schedule.id}/edit/").content.decode()

    assert "<h1>Edit replay schedule nightly</h1>" in html
    assert f'action="/replay/schedules/{schedule.id}/edit/"' in html
    for name, value in [
        ("name", "nightly"),
        ("queues", "ORDERS.IN"),
        ("since", "2026-03-01T08:00:00"),
        ("header", "region=eu"),
        ("target_queue", "ORDERS.IN"),
        ("velocity", "20"),
        ("every_seconds", "600"),
        ("cool_off_minutes", "15"),
        ("give_up_after", "5"),
    ]:
        assert re.search(rf'name="{name}" value="{re.escape(value)}"', html), name
    assert f'<option value="{DLQ}" selected>' in html
    assert re.search(r'name="cron"(?! value)[^>]*>', html)


def test_editing_replaces_what_the_schedule_does_and_when(operator, orders):
    schedule = a_schedule()
    client = logged_in(operator)

    response = client.post(
        f"/replay/schedules/{schedule.id}/edit/",
        schedule_form(name="hourly", cron="", every_seconds="3600", give_up_after="2"),
    )

    schedule.refresh_from_db()
    assert response.status_code == 302
    assert response["Location"] == f"/replay/schedules/{schedule.id}/"
    assert (schedule.name, schedule.give_up_after) == ("hourly", 2)
    task = task_of(schedule)
    assert (task.interval.every, task.crontab) == (3600, None)
    assert ReplaySchedule.objects.count() == 1


def test_editing_to_another_schedules_name_is_refused_beside_the_name(operator):
    a_schedule()
    other = a_schedule("other")

    html = (
        logged_in(operator)
        .post(f"/replay/schedules/{other.id}/edit/", schedule_form(give_up_after="7"))
        .content.decode()
    )

    other.refresh_from_db()
    assert "Another schedule has this name." in error_beside(html, "name")
    assert (other.name, other.give_up_after) == ("other", 3)


def test_a_deleted_schedule_cannot_be_edited(operator):
    schedule = a_schedule()
    schedule_delete(schedule_id=schedule.id, actor=None)
    client = logged_in(operator)

    assert client.get(f"/replay/schedules/{schedule.id}/edit/").status_code == 404
    assert client.post(f"/replay/schedules/{schedule.id}/edit/", schedule_form()).status_code == 404


# --- pause, resume, run now, delete --------------------------------------------------------


def test_pausing_and_resuming_from_the_list_swap_the_table_in_place(operator):
    schedule = a_schedule()
    client = logged_in(operator)

    paused = client.post(f"/replay/schedules/{schedule.id}/pause/", headers=TABLE).content.decode()
    schedule.refresh_from_db()
    assert not schedule.enabled
    resumed = client.post(
        f"/replay/schedules/{schedule.id}/resume/", headers=TABLE
    ).content.decode()
    schedule.refresh_from_db()

    assert schedule.enabled
    assert paused.lstrip().startswith('<div id="schedule-table"')
    assert "nightly is paused: it fires no more until resumed." in paused
    assert cell(row_of(paused, schedule), "state") == "paused"
    assert f'action="/replay/schedules/{schedule.id}/resume/"' in paused
    assert "nightly is resumed." in resumed
    assert cell(row_of(resumed, schedule), "state") == "enabled"


def test_without_javascript_an_action_goes_back_where_it_came_from(operator):
    schedule = a_schedule()
    client = logged_in(operator)
    page = f"/replay/schedules/{schedule.id}/"

    from_list = client.post(f"{page}pause/", {"next": "/replay/schedules/"})
    from_page = client.post(f"{page}resume/", {"next": page}, follow=True)
    elsewhere = client.post(f"{page}pause/", {"next": "https://evil.example/"})

    assert from_list["Location"] == "/replay/schedules/"
    assert from_page.redirect_chain == [(page, 302)]
    assert "nightly is resumed." in from_page.content.decode()
    assert elsewhere["Location"] == page


def test_run_now_queues_a_job_and_records_a_manual_firing(operator):
    schedule = a_schedule(cool_off_minutes=30)
    client = logged_in(operator)

    html = client.post(f"/replay/schedules/{schedule.id}/run/", headers=TABLE).content.decode()

    job = ReplayJob.objects.get()
    firing = ScheduleFiring.objects.get()
    assert (job.schedule_id, job.status, job.created_by) == (schedule.id, "queued", operator)
    assert (firing.job_id, firing.manual) == (job.id, True)
    assert f"nightly: replay job {job.id} queued." in html
    assert f'<a href="/replay/{job.id}/">job {job.id}</a>' in row_of(html, schedule)


def test_run_now_of_a_paused_schedule_says_why_not(operator):
    schedule = a_schedule()
    schedule_pause(schedule_id=schedule.id, actor=None)
    client = logged_in(operator)

    swapped = client.post(f"/replay/schedules/{schedule.id}/run/", headers=TABLE)
    plain = client.post(f"/replay/schedules/{schedule.id}/run/", follow=True)

    assert swapped.status_code == plain.status_code == 200
    assert "is paused; resume it to run it." in unescape(swapped.content.decode())
    assert "is paused; resume it to run it." in unescape(plain.content.decode())
    assert not ReplayJob.objects.exists()


def test_run_now_while_the_last_job_runs_says_why_not(operator):
    schedule = a_schedule()
    job = run_now(schedule, operator)
    client = logged_in(operator)

    html = client.post(f"/replay/schedules/{schedule.id}/run/", follow=True).content.decode()

    assert f"has job {job.id} queued; two jobs of one schedule never run at once." in html
    assert ReplayJob.objects.count() == 1


def test_deleting_from_the_list_removes_the_row_and_keeps_the_jobs(operator):
    schedule = a_schedule()
    run_now(schedule, operator)
    client = logged_in(operator)

    html = client.post(f"/replay/schedules/{schedule.id}/delete/", headers=TABLE).content.decode()

    schedule.refresh_from_db()
    assert schedule.deleted_at is not None
    assert "nightly is deleted; its jobs stay." in html
    assert "No replay schedules yet." in html
    assert ReplayJob.objects.filter(schedule=schedule).count() == 1
    again = client.post(f"/replay/schedules/{schedule.id}/delete/", follow=True).content.decode()
    assert "was deleted" in unescape(again)


def test_deleting_from_the_schedules_page_goes_to_the_list(operator):
    schedule = a_schedule()
    client = logged_in(operator)

    page = client.get(f"/replay/schedules/{schedule.id}/").content.decode()
    plain = client.post(f"/replay/schedules/{schedule.id}/delete/", {"next": "/replay/schedules/"})
    swapped = client.post(
        f"/replay/schedules/{schedule.id}/delete/", {"next": "/replay/schedules/"}, headers=HX
    )

    assert 'hx-confirm="Delete replay schedule nightly? Its jobs stay."' in page
    assert plain["Location"] == "/replay/schedules/"
    assert swapped["HX-Redirect"] == "/replay/schedules/"


# --- a schedule's page ------------------------------------------------------------------


@time_machine.travel(FRIDAY_NOON, tick=False)
def test_the_schedule_page_shows_its_spec_timing_firings_and_jobs(operator, orders):
    time_zone_set(user=operator, name="Europe/Paris")
    replay = ReplaySpec(
        source="dead_letter",
        source_queue=DLQ,
        filter=MessageSelection(queues=("ORDERS.IN",)),
        target_queue="ORDERS.IN",
        rules_text="ACTION(RETRY)\n",
    )
    schedule = a_schedule(replay=replay, cool_off_minutes=45, give_up_after=4)
    job = run_now(schedule, operator)
    reported(job.id, "done", (5, 5, 5, 5))
    firing = ScheduleFiring.objects.get(job=job)
    skipped = ScheduleFiring.objects.create(
        schedule=schedule, skipped=f"replay job {job.id} was still {SCRIPT}"
    )

    html = logged_in(operator).get(f"/replay/schedules/{schedule.id}/").content.decode()

    assert "<h1>Replay schedule nightly" in html
    assert cell(html, "timing") == "0 3 * * * (Europe/Paris)"
    assert cell(html, "next") == "2026-03-28 03:00:00 CET"
    assert cell(html, "cool-off") == "45 min"
    assert cell(html, "give-up") == "4 replays"
    assert cell(html, "filter") == "ORDERS.IN"
    assert '<pre class="payload" data-rules>ACTION(RETRY)\n</pre>' in html
    beat = re.search(rf'data-firing="{skipped.id}">(.*?)</tr>', html, re.S)
    manual = re.search(rf'data-firing="{firing.id}">(.*?)</tr>', html, re.S)
    assert beat
    assert manual
    assert "<td>beat</td>" in beat.group(1)
    assert "skipped: replay job" in beat.group(1)
    assert "&lt;script&gt;" in beat.group(1)
    assert "<td>run now</td>" in manual.group(1)
    assert f'<a href="/replay/{job.id}/">job {job.id}</a>' in manual.group(1)
    assert f'<tr data-job="{job.id}">' in html
    assert SCRIPT not in html


def test_a_job_page_links_its_schedule(operator):
    schedule = a_schedule()
    job = run_now(schedule, operator)

    html = logged_in(operator).get(f"/replay/{job.id}/").content.decode()

    assert f'a firing of schedule <a href="/replay/schedules/{schedule.id}/"' in html


def test_a_deleted_schedules_page_stays_without_actions(operator):
    schedule = a_schedule()
    schedule_delete(schedule_id=schedule.id, actor=None)

    html = logged_in(operator).get(f"/replay/schedules/{schedule.id}/").content.decode()

    assert "deleted" in html
    assert "Run now" not in html
    assert cell(html, "next") == cell(html, "timing") == "—"


# --- a dead-letter queue's page ---------------------------------------------------------


def test_a_dead_letter_queue_lists_its_schedules_and_marks_messages_given_up(viewer, orders):
    strict = a_schedule("strict", give_up_after=1)
    patient = a_schedule("patient", give_up_after=3)
    a_schedule("blacklist", replay=ReplaySpec(source="blacklist"))
    fresh, once, thrice = dead_lettered(orders, 3)
    Message.objects.filter(id=once).update(generation=1)
    Message.objects.filter(id=thrice).update(generation=3)

    html = logged_in(viewer).get(f"/dead-letters/{DLQ}/").content.decode()

    listed = re.search(r"<ul data-schedules>(.*?)</ul>", html, re.S)
    assert listed
    assert re.findall(r'<a href="/replay/schedules/(\d+)/">([^<]+)</a>', listed.group(1)) == [
        (str(patient.id), "patient"),
        (str(strict.id), "strict"),
    ]

    def given_up(message_id: int) -> list[str]:
        row = re.search(rf'data-message="{message_id}">(.*?)</tr>', html, re.S)
        assert row
        return re.findall(r"given up by <a [^>]+>([^<]+)</a>", row.group(1))

    assert given_up(fresh) == []
    assert given_up(once) == ["strict"]
    assert given_up(thrice) == ["patient", "strict"]


def test_a_dead_letter_queue_no_schedule_reads_says_so(viewer):
    other = queue_create(name="OTHER.DLQ", kind="dead_letter")
    a_schedule()

    html = logged_in(viewer).get(f"/dead-letters/{other.name}/").content.decode()

    listed = re.search(r"<ul data-schedules>(.*?)</ul>", html, re.S)
    assert listed
    assert "None." in listed.group(1)
    assert "/replay/schedules/" not in listed.group(1)


# --- untrusted names and filters -----------------------------------------------------------


def test_names_and_filters_show_as_text_everywhere(operator, orders):
    replay = ReplaySpec(
        source="dead_letter",
        source_queue=DLQ,
        filter=MessageSelection(payload_text=SCRIPT, reason=SCRIPT),
        rules_text=f"* {SCRIPT}\nACTION(RETRY)\n",
    )
    schedule = a_schedule(SCRIPT, replay=replay, give_up_after=1)
    [message] = dead_lettered(orders, 1)
    Message.objects.filter(id=message).update(generation=1)
    client = logged_in(operator)

    pages = [
        client.get("/replay/schedules/"),
        client.get(f"/replay/schedules/{schedule.id}/"),
        client.get(f"/replay/schedules/{schedule.id}/edit/"),
        client.get(f"/dead-letters/{DLQ}/"),
        client.post(f"/replay/schedules/{schedule.id}/pause/", headers=TABLE),
        client.post(
            "/replay/schedules/new/", schedule_form(name=SCRIPT, target_queue=SCRIPT), follow=True
        ),
    ]

    for response in pages:
        html = response.content.decode()
        assert response.status_code == 200
        assert SCRIPT not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
