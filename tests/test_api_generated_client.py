"""A client generated from the OpenAPI schema by openapi-python-client, used
as a program would use it against a live server: publish, list and filter,
triage one message of each kind, fail a filter's messages in bulk and follow
the job, submit a replay and read its progress. Only the generated code
talks to the API; the test's own calls set the stage (messages blacklisted
or dead-lettered as workers would) and stand in for the worker that runs a
bulk job."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from broker.models import Message, MessageState
from broker.services.bulk import bulk_job_run
from broker.services.queues import queue_create
from console.tokens import token_create
from tests.support.messages import blacklisted, dead_lettered, payload_of

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "lazaretto_client"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The client package, generated from the schema the API serves."""
    where = tmp_path_factory.mktemp("client")
    schema = where / "openapi.json"
    schema.write_text(json.dumps(SchemaGenerator().get_schema(request=None, public=True)))
    subprocess.run(
        [
            str(Path(sys.executable).parent / "openapi-python-client"),
            "generate",
            "--path",
            str(schema),
            "--meta",
            "none",
            "--output-path",
            str(where / PACKAGE),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(where))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def call(generated: ModuleType, operation: str, **arguments: Any) -> Any:
    """``operation`` of the generated package (``v1_messages_list``) called
    with ``arguments``: its answer, parsed by the generated models."""
    module = importlib.import_module(f"{PACKAGE}.api.v1.{operation}")
    return module.sync_detailed(**arguments)


def model(generated: ModuleType, name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


@pytest.fixture
def client(generated, live_server, admin) -> Iterator[Any]:
    _, key = token_create(user=admin, name="generated client")
    # Closed after the test: a kept-alive connection would keep the live
    # server's thread, and its database session, busy.
    with generated.AuthenticatedClient(
        base_url=live_server.url, token=key, prefix="Token"
    ) as client:
        yield client


def test_a_generated_client_publishes_and_lists_by_filter(generated, client):
    queue_create(name="WALK.Q", consumer="noop")
    text, binary = (
        model(generated, "TextMessageInRequest"),
        model(generated, "Base64MessageInRequest"),
    )
    headers = model(generated, "TextMessageInRequestHeaders").from_dict({"region": "eu"})
    base64 = model(generated, "PayloadEncodingEnum")("base64")

    answer = call(
        generated,
        "v1_queues_messages_create",
        name="WALK.Q",
        client=client,
        body=model(generated, "PublishRequest")(
            messages=[
                text(payload="one", headers=headers),
                binary(payload="/wA=", payload_encoding=base64),
            ]
        ),
    )

    assert answer.status_code == 201
    assert answer.parsed.count == 2
    assert payload_of(Message.objects.get(id=answer.parsed.ids[1])) == b"\xff\x00"
    found = call(generated, "v1_messages_list", client=client, queue="WALK.Q", header="region=eu")
    assert [message.id for message in found.parsed.results] == answer.parsed.ids[:1]
    assert found.parsed.results[0].state.value == "TBDL"


def test_a_generated_client_triages_one_message_of_each_kind(generated, client):
    orders = queue_create(name="WALK.ORDERS", consumer="noop")
    release, fail, purge = blacklisted(orders.name, 3)
    retry, discard, forward = dead_lettered(orders, 3)
    reason = model(generated, "ReasonRequest")(reason="triaged by a generated client")
    forward_to = model(generated, "ForwardRequest")(queue="WALK.ORDERS")

    answers = {
        "release": call(
            generated, "v1_messages_release_create", message_id=release, client=client, body=reason
        ),
        "fail": call(
            generated, "v1_messages_fail_create", message_id=fail, client=client, body=reason
        ),
        "purge": call(
            generated, "v1_messages_purge_create", message_id=purge, client=client, body=reason
        ),
        "retry": call(
            generated, "v1_messages_retry_create", message_id=retry, client=client, body=reason
        ),
        "discard": call(
            generated, "v1_messages_discard_create", message_id=discard, client=client, body=reason
        ),
        "forward": call(
            generated,
            "v1_messages_forward_create",
            message_id=forward,
            client=client,
            body=forward_to,
        ),
    }

    assert {kind: answer.status_code for kind, answer in answers.items()} == {
        "release": 200,
        "fail": 200,
        "purge": 204,
        "retry": 200,
        "discard": 204,
        "forward": 200,
    }
    states = dict(
        Message.objects.filter(id__in=[release, fail, retry, forward]).values_list("id", "state")
    )
    assert states == {
        release: MessageState.TO_BE_DELIVERED,
        fail: MessageState.FAILED,
        retry: MessageState.TO_BE_DELIVERED,
        forward: MessageState.TO_BE_DELIVERED,
    }
    assert not Message.objects.filter(id__in=[purge, discard]).exists()
    assert answers["forward"].parsed.queue == "WALK.ORDERS"


def test_a_generated_client_fails_a_filter_in_bulk_and_follows_the_job(generated, client):
    queue_create(name="WALK.BULK", consumer="noop")
    poisoned = blacklisted("WALK.BULK", 12)
    bulk = model(generated, "BulkByFilterRequest")
    selection = model(generated, "MessageQueryRequest")(
        queue="WALK.BULK", state=model(generated, "StateEnum")("NDLV")
    )

    submitted = call(
        generated,
        "v1_messages_bulk_create",
        client=client,
        body=bulk(
            action=model(generated, "ActionEnum")("fail"), filter_=selection, reason="bad batch"
        ),
    )

    assert submitted.status_code == 202
    job = submitted.parsed
    assert (job.status.value, job.total, job.done) == ("queued", 12, 0)
    bulk_job_run(job_id=job.id)  # what the worker's task does
    followed = call(generated, "v1_jobs_retrieve", job_id=job.id, client=client).parsed
    assert (followed.status.value, followed.done, followed.percent) == ("done", 12, 100)
    assert Message.objects.filter(id__in=poisoned, state=MessageState.FAILED).count() == 12


def test_a_generated_client_submits_a_replay_and_reads_its_progress(generated, client):
    orders = queue_create(name="WALK.REPLAY", consumer="noop")
    dead_lettered(orders, 4)
    spec = model(generated, "DeadLetterReplaySpecRequest")(
        source=model(generated, "SourceEnum")("dead_letter"),
        source_queue="SYSTEM.DEAD.LETTER.QUEUE",
        filter_=model(generated, "ReplayFilterRequest")(queues=["WALK.REPLAY"]),
    )

    preview = call(generated, "v1_replay_jobs_preview_create", client=client, body=spec)
    submitted = call(generated, "v1_replay_jobs_create", client=client, body=spec)

    assert (preview.status_code, preview.parsed.count) == (200, 4)
    assert submitted.status_code == 201
    progress = call(generated, "v1_replay_jobs_retrieve", job_id=submitted.parsed.id, client=client)
    assert progress.parsed.status.value == "queued"
    assert (progress.parsed.percent, progress.parsed.written) == (0, 0)
    listed = call(generated, "v1_replay_jobs_list", client=client)
    assert [job.id for job in listed.parsed.results] == [submitted.parsed.id]
