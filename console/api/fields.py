"""Fields and helpers the API's resources share: names of related objects, payloads, times, unknown keys."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from broker.consumers import MAX_WEBHOOK_TIMEOUT_SECONDS, MIN_WEBHOOK_TIMEOUT_SECONDS
from broker.services.publish import MAX_EXPIRY_SECONDS


class NameRelatedField(serializers.SlugRelatedField):
    """A related object by its name; a name no object can have (one with a
    NUL, which PostgreSQL text refuses) does not exist rather than fail."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "type": "number",
        "format": "double",
        "minimum": MIN_WEBHOOK_TIMEOUT_SECONDS,
        "maximum": MAX_WEBHOOK_TIMEOUT_SECONDS,
    }
)
class FiniteFloatField(serializers.FloatField):
    """A JSON number that is finite: not true or false (which Python counts
    as numbers), not NaN, not an infinity."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("invalid")
        return float(value)


class WebhookTimeoutField(FiniteFloatField):
    """Seconds, a finite number within the bounds. Booleans, NaN and
    infinity, which ``float()`` would take, are refused here so the error
    names the field."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            min_value=MIN_WEBHOOK_TIMEOUT_SECONDS, max_value=MAX_WEBHOOK_TIMEOUT_SECONDS, **kwargs
        )


def fields_through(
    model_serializer: type[serializers.ModelSerializer[Any]],
    attribute: str,
    *,
    own: dict[str, serializers.Field[Any, Any, Any, Any]],
    before: str,
) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
    """How a summary serializer shows its model: ``model_serializer``'s
    fields, each reading the summary's ``attribute`` (``queue.name`` for
    ``name``), with the summary's ``own`` fields placed before ``before``."""
    fields: dict[str, serializers.Field[Any, Any, Any, Any]] = {}
    for name, field in model_serializer().get_fields().items():
        if name == before:
            fields.update(own)
        field.source = f"{attribute}.{field.source or name}"
        fields[name] = field
    return fields


class PayloadField(serializers.CharField):
    """A payload string. DRF's surrogate check walks every character in
    Python, which dominated publishing; encoding to UTF-8 once in
    ``MessageInSerializer.validate`` catches the same lone surrogates."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [
            validator
            for validator in self.validators
            if not isinstance(validator, ProhibitSurrogateCharactersValidator)
        ]


@extend_schema_field(
    {
        "type": "number",
        "format": "double",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_EXPIRY_SECONDS,
    }
)
class ExpiryField(FiniteFloatField):
    """Seconds until a message expires: a number (or numeric string, as
    DRF's FloatField takes) above 0 and at most 365 days. Booleans, NaN and
    infinity, which ``float()`` would take, are refused here so the error
    names the field."""

    default_error_messages = {"not_positive": "Ensure this value is greater than 0."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_value=MAX_EXPIRY_SECONDS, **kwargs)

    def to_internal_value(self, data: Any) -> float:
        value = super().to_internal_value(data)
        if value <= 0:
            self.fail("not_positive")
        return value


def payload_text(payload: bytes) -> tuple[str, str]:
    """The payload as (text, "string") when it is UTF-8, else (base64, "base64")."""
    try:
        return payload.decode(), "string"
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode(), "base64"


def unknown_keys(data: Any, known: Iterable[str]) -> dict[str, list[str]]:
    if not isinstance(data, Mapping):
        return {}
    known = set(known)
    return {str(key): ["Unknown field."] for key in data if key not in known}


def as_mapping(detail: Any) -> dict[str, Any]:
    """A serializer's error detail as ``{field: errors}``."""
    if isinstance(detail, dict):
        return dict(detail)
    return {api_settings.NON_FIELD_ERRORS_KEY: detail}


class AcceptedSerializer(serializers.Serializer[dict[str, bool]]):
    accepted = serializers.BooleanField(help_text="The node took the command; it runs now.")


NO_CONTENT = OpenApiResponse(description="Done; nothing to return.")


def parsed(serializer_class: type[serializers.Serializer[Any]], data: Any) -> Any:
    """``serializer_class`` validated over ``data`` (400 with field errors)."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer
