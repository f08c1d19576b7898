"""Messages exported from the console and imported into another queue in a
real browser: the download, the upload, and a bad file's lines beside the
field."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import Message
from broker.services.queues import queue_create
from tests.support.browser import login
from tests.support.transfer import contents, published_samples, sample_contents

pytestmark = pytest.mark.slow


def test_an_operator_exports_a_queue_and_imports_it_into_another(
    page: Page, live_server: LiveServer, operator: User, tmp_path: Path
) -> None:
    orders = queue_create(name="ORDERS.IN")
    target = queue_create(name="ORDERS.COPY")
    published_samples(orders)
    login(page, live_server, operator)

    page.goto("/messages/?queue=ORDERS.IN")
    page.get_by_label("Export as").select_option("jsonl")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    file = tmp_path / "orders.jsonl"
    download.value.save_as(file)
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    assert base64.b64decode(lines[2]["payload"]) == bytes(range(256))

    page.goto("/queues/ORDERS.COPY/")
    page.get_by_label("JSON Lines file").set_input_files(file)
    page.get_by_role("button", name="Import").click()
    expect(page.locator(".flash")).to_contain_text("Imported 3 message(s) into ORDERS.COPY.")
    assert contents(target) == sample_contents()


def test_a_bad_file_shows_its_lines_beside_the_field_and_writes_nothing(
    page: Page, live_server: LiveServer, operator: User, tmp_path: Path
) -> None:
    orders = queue_create(name="ORDERS.IN")
    file = tmp_path / "bad.jsonl"
    file.write_text('{"payload": "ok"}\n{"payload": "x", "payload_encoding": "hex"}\n')
    login(page, live_server, operator)

    page.goto("/queues/ORDERS.IN/")
    page.get_by_label("JSON Lines file").set_input_files(file)
    page.get_by_role("button", name="Import").click()
    expect(page.locator("#id_file-error")).to_contain_text(
        "Line 2: payload_encoding must be string or base64"
    )
    assert not Message.objects.filter(queue=orders).exists()
