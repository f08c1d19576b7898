"""The OpenAPI schema's shared parts: the error body, and the error answers
every operation can give (every write, too, those of the HA guard), added to
each by a drf-spectacular hook."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer[dict[str, Any]]):
    """Every error under /api/: a stable ``code`` for programs and a
    ``detail`` for people; ``field_errors`` when the input was refused."""

    code = serializers.CharField(help_text="Stable, e.g. `invalid`, `queue_not_found`.")
    detail = serializers.CharField()
    field_errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text='Messages per field, e.g. `{"messages[2].priority": ["..."]}`.',
    )


ERROR = OpenApiResponse(response=ErrorSerializer, description="An error body.")

COMMON = {
    "400": "The input is not valid (`invalid`, with `field_errors`) or malformed.",
    "401": "No credentials, or a token that is unknown, revoked or of a deactivated user.",
    "403": "The user's role does not allow this.",
    "404": "What the path names does not exist (or a bad page cursor).",
    "429": "Over the token's request rate (`throttled`); see Retry-After.",
}
WITH_BODY = {"413": "The body is larger than the server accepts."}
# What the store's HA guard refuses (broker.ha.guard), whatever the operation.
WRITES = {
    "409": "Refused in the current state; among others, every configuration change (queues, "
    "topics, subscriptions, rules tables) while an HA standby synchronises "
    "(`ha_synchronising`).",
    "503": "The HA pair is in maintenance after a split brain (`ha_maintenance`): writes are "
    "refused until an admin picks the primary.",
}
WRITE_METHODS = {"post", "put", "patch", "delete"}


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: each operation documents the common error
    answers with the error body, beside its own."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            answers = {
                **COMMON,
                **(WITH_BODY if "requestBody" in operation else {}),
                **(WRITES if method in WRITE_METHODS else {}),
            }
            responses = operation.setdefault("responses", {})
            for status, description in answers.items():
                responses.setdefault(status, {"description": description, "content": error})
    return result
