"""The console's export downloads and queue import upload, through Django's
test client: what each page offers, the download, the errors beside the
fields, and roles."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import StreamingHttpResponse

from broker.models import AuditEvent, Message, Queue
from broker.services.queues import queue_create
from tests.support.console import error_beside, logged_in
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE, blacklisted
from tests.support.transfer import contents, documents, published_samples, sample_contents

pytestmark = pytest.mark.django_db


def test_the_lists_offer_an_export_of_what_their_filter_shows(operator, orders: Queue) -> None:
    client = logged_in(operator)
    html = client.get("/messages/", {"queue": "ORDERS.IN"}).content.decode()
    assert 'id="export-form"' in html
    assert 'name="queue" value="ORDERS.IN" form="export-form"' in html
    assert 'name="state" value="NDLV"' in client.get("/blacklist/").content.decode()
    html = client.get(f"/dead-letters/{SYSTEM_DEAD_LETTER_QUEUE}/").content.decode()
    assert f'name="queue" value="{SYSTEM_DEAD_LETTER_QUEUE}"' in html


def test_a_viewer_sees_no_export_and_may_not_download(viewer, orders: Queue) -> None:
    client = logged_in(viewer)
    assert 'id="export-form"' not in client.get("/messages/").content.decode()
    assert client.get("/messages/export/").status_code == 403
    assert 'id="import-form"' not in client.get("/queues/ORDERS.IN/").content.decode()
    upload = SimpleUploadedFile("m.jsonl", b'{"payload": "x"}\n')
    assert client.post("/queues/ORDERS.IN/import/", {"file": upload}).status_code == 403


def test_the_blacklist_export_downloads_its_messages(operator, orders: Queue) -> None:
    published_samples(orders)
    poison = blacklisted(orders, 2)
    response = logged_in(operator).get("/messages/export/", {"state": "NDLV", "queue": "ORDERS.IN"})
    assert isinstance(response, StreamingHttpResponse)
    lines = documents(b"".join(response.streaming_content).decode())
    assert [line["id"] for line in lines] == poison
    assert AuditEvent.objects.get(action="messages_export").details["via"] == "console"


def test_an_export_of_an_unknown_queue_says_so_beside_the_field(operator, db) -> None:
    response = logged_in(operator).get("/messages/export/", {"queue": "NO.SUCH.Q"})
    assert response.status_code == 400
    assert "no queue named 'NO.SUCH.Q'" in error_beside(response.content.decode(), "queue")


def test_an_upload_round_trips_and_returns_to_the_queue(operator, orders: Queue) -> None:
    published_samples(orders)
    client = logged_in(operator)
    download = client.get("/messages/export/", {"queue": "ORDERS.IN"})
    assert isinstance(download, StreamingHttpResponse)
    exported = b"".join(download.streaming_content)
    target = queue_create(name="ORDERS.COPY")
    assert 'id="import-form"' in client.get("/queues/ORDERS.COPY/").content.decode()
    upload = SimpleUploadedFile("orders.jsonl", exported)
    response = client.post("/queues/ORDERS.COPY/import/", {"file": upload}, follow=True)
    assert response.redirect_chain[-1][0] == "/queues/ORDERS.COPY/"
    assert "Imported 3 message(s) into ORDERS.COPY." in response.content.decode()
    assert contents(target) == sample_contents()


def test_bad_lines_are_listed_beside_the_file_field_and_nothing_written(operator, orders) -> None:
    body = b'{"payload": "ok"}\nnot json\n{"payload": "x", "priority": 12}\n'
    client = logged_in(operator)
    response = client.post(
        "/queues/ORDERS.IN/import/", {"file": SimpleUploadedFile("m.jsonl", body)}
    )
    assert response.status_code == 400
    beside = error_beside(response.content.decode(), "file")
    assert "Line 2: not JSON" in beside
    assert "Line 3: The priority must be from 0 to 9" in beside
    assert not Message.objects.filter(queue=orders).exists()
    response = client.post(
        "/queues/ORDERS.IN/import/",
        {"file": SimpleUploadedFile("m.jsonl", body), "partial": "on"},
    )
    assert response.status_code == 200
    assert "Line 2: not JSON" in response.content.decode()
    assert [payload for payload, *_ in contents(orders)] == [b"ok"]


def test_an_upload_over_the_limit_is_refused(operator, orders, settings) -> None:
    settings.LAZARETTO_MAX_IMPORT_BYTES = 10
    upload = SimpleUploadedFile("m.jsonl", b'{"payload": "ok"}\n')
    response = logged_in(operator).post("/queues/ORDERS.IN/import/", {"file": upload})
    assert "an import holds at most 10" in error_beside(response.content.decode(), "file")
    assert not Message.objects.filter(queue=orders).exists()
