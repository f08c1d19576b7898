"""schemathesis against the live OpenAPI schema, in process: every
operation with generated (and deliberately wrong) input, then the stateful
phase, which follows the schema's links from what one call creates to the
calls that use it. No 5xx, no response that breaks the schema, no status
code the schema does not document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from console.tokens import token_create

# 503 with the error body is an answer, not a failure, when it says that no
# broker node answered an HA command (none runs here) or that the HA pair is
# in maintenance.
HA_UNAVAILABLE = {"ha_node_unreachable", "ha_maintenance"}


@schemathesis.check
def not_a_server_failure(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code == 503:
        try:
            code = json.loads(response.content).get("code")
        except ValueError:
            code = None
        if code in HA_UNAVAILABLE:
            return None
    return not_a_server_error(ctx, response, case)


CHECKS = [
    not_a_server_failure,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = settings(
    max_examples=5,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def auth(admin, settings) -> dict[str, str]:
    """An admin's token (admins may call everything), some data for the
    calls to find, and no request-rate limit in the way."""
    settings.LAZARETTO_API_RATE = "1000000/s"
    queue_create(name="FUZZ.Q", consumer="noop")
    messages_publish(queue_name="FUZZ.Q", messages=[NewMessage(payload=b"x")] * 3)
    _, key = token_create(user=admin, name="schemathesis")
    return {"Authorization": f"Token {key}"}


@pytest.fixture
def api_schema(db) -> Iterator[Any]:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = get_wsgi_application()
    # The coverage phase's probing of every path with every unlisted method
    # is left out: test_api_tokens checks the 405 body once, and it would
    # double this test's time.
    schema.config.phases.coverage.unexpected_methods = set()
    # As Django's test client does: requests run inside the test's
    # transaction, so the handler must not close its connection.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield schema
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@EXAMPLES
def test_every_operation_answers_as_the_schema_says(case, auth):
    case.call_and_validate(headers=auth, checks=CHECKS)


def test_the_stateful_phase_follows_links_without_a_failure(api_schema, auth):
    """Sequences of calls, each using what an earlier one answered (a queue
    made, then published to, paused, purged; a token made, then revoked...),
    with the links schemathesis infers from the schema."""
    workflow = api_schema.as_state_machine()

    class Calls(workflow):  # type: ignore[misc, valid-type]
        # Each scenario starts from the same data: what one wrote is rolled
        # back before the next.
        def setup(self) -> None:
            self.scenario = transaction.atomic()
            self.scenario.__enter__()

        def teardown(self) -> None:
            transaction.set_rollback(True)
            self.scenario.__exit__(None, None, None)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": auth}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    Calls.run(
        settings=settings(
            max_examples=40,
            stateful_step_count=6,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
