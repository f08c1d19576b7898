"""Replay in a real browser: an operator previews a dead-letter replay job
and submits it, and watches a real Spark job's progress to its end."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connections
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import ReplayJob
from broker.services.queues import queue_create
from tests.support.browser import ARTIFACTS_DIR, login
from tests.support.messages import dead_lettered
from workers.pipeline import replay_job_launch

pytestmark = pytest.mark.slow
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def test_an_operator_previews_a_dead_letter_replay_and_submits_it(
    page: Page, live_server: LiveServer, operator: User, request: pytest.FixtureRequest
) -> None:
    orders = queue_create(name="ORDERS.IN")
    other = queue_create(name="OTHER.IN")
    dead_lettered(orders, 3)
    dead_lettered(other, 2)
    login(page, live_server, operator)

    page.get_by_role("link", name="Replay", exact=True).click()
    page.get_by_role("link", name="New replay job").click()
    expect(page.get_by_role("heading", name="New replay job")).to_be_visible()
    page.get_by_label("Source", exact=True).select_option("dead_letter")
    page.get_by_label("Source queue").select_option(DLQ)
    page.get_by_label("Queues").fill("ORDERS.IN")
    page.get_by_role("button", name="Preview").click()

    expect(page.locator("[data-preview-count]")).to_have_text("3 messages match the filter now.")
    expect(page.get_by_label("Queues")).to_have_value("ORDERS.IN")  # the form kept its input
    assert not ReplayJob.objects.exists()

    page.get_by_label("Velocity").fill("0")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#id_velocity-error")).to_contain_text("Give from 1 to")
    assert not ReplayJob.objects.exists()

    page.get_by_label("Velocity").fill("100")
    page.get_by_role("button", name="Submit").click()

    job = ReplayJob.objects.get()
    expect(page).to_have_url(f"{live_server.url}/replay/{job.id}/")
    expect(page.get_by_role("status")).to_contain_text(f"Replay job {job.id} queued.")
    expect(page.locator("[data-status]")).to_have_text("Queued: 0 of 0 source messages (0%).")
    expect(page.get_by_role("button", name="Cancel")).to_be_visible()
    directory = request.config.rootpath / ARTIFACTS_DIR
    directory.mkdir(exist_ok=True)
    page.screenshot(path=directory / "replay_job_queued.png", full_page=True)
    assert (job.source_queue, job.filters, job.velocity) == (DLQ, {"queues": ["ORDERS.IN"]}, 100)


@pytest.mark.usefixtures("spark_env")
def test_the_progress_bar_moves_while_the_spark_job_writes_and_the_job_ends_done(
    page: Page, live_server: LiveServer, operator: User, request: pytest.FixtureRequest
) -> None:
    orders = queue_create(name="ORDERS.IN")
    dead_lettered(orders, 2000)
    login(page, live_server, operator)
    page.goto(f"{live_server.url}/replay/new/")
    page.get_by_label("Source", exact=True).select_option("dead_letter")
    page.get_by_label("Source queue").select_option(DLQ)
    # 400 a second: about five seconds of writing, a step each second.
    page.get_by_label("Velocity").fill("400")
    page.get_by_role("button", name="Submit").click()
    job = ReplayJob.objects.get()
    expect(page).to_have_url(f"{live_server.url}/replay/{job.id}/")

    launcher = threading.Thread(target=_launch, args=(job.id,))
    launcher.start()
    bar = page.get_by_label("progress")
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        value = bar.get_attribute("value") or "0"
        seen.add(value)
        if page.locator("[data-status]").get_attribute("data-status") == "done":
            break
        page.wait_for_timeout(200)
    launcher.join(timeout=60)

    expect(page.locator("[data-status]")).to_have_text("Done: 2000 of 2000 source messages (100%).")
    expect(page.locator("[data-count='written']")).to_have_text("2000")
    expect(page.locator("[data-target='ORDERS.IN']")).to_contain_text("2000")
    expect(page.locator("[data-spark-app]")).to_contain_text("local-")
    # The bar showed the job part-way, more than once, before it was done.
    partway = {value for value in seen if value not in {"0", "100"}}
    assert len(partway) >= 2, seen
    page.screenshot(
        path=request.config.rootpath / ARTIFACTS_DIR / "replay_job_done.png", full_page=True
    )


def _launch(job_id: int) -> None:
    try:
        replay_job_launch(job_id)
    finally:
        connections.close_all()
