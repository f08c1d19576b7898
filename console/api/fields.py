"""Fields and helpers the API's resources share: request bodies held to
their schema, names of related objects, payloads, times."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from django.db.models import Model
from drf_spectacular.utils import OpenApiResponse, extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from broker.consumers import MAX_WEBHOOK_TIMEOUT_SECONDS, MIN_WEBHOOK_TIMEOUT_SECONDS
from broker.errors import NotFound
from broker.services.publish import MAX_EXPIRY_SECONDS, MAX_HEADER_NAME_LENGTH, MAX_HEADERS

# What DRF's text fields take, as patterns the schema states: no NUL
# (PostgreSQL's text cannot hold one) and, where blank is refused, some
# character that is not whitespace. Anchored and spelled out, so that a tool
# folding minLength and maxLength into a pattern reads them right.
NO_NUL = r"^[^\u0000]*$"
NOT_BLANK = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"

T = TypeVar("T")
M = TypeVar("M", bound=Model)

# The JSON types each kind of field takes in a request body, as the schema
# states them. DRF's fields are kinder (0 is "0", "yes" is true, "5" is 5),
# so a client that sends what the schema forbids would be served anyway,
# and one generated from the schema could not tell which values work.
JSON_TYPES: tuple[
    tuple[type[serializers.Field[Any, Any, Any, Any]], tuple[type, ...], str], ...
] = (
    (serializers.BooleanField, (bool,), "Must be true or false."),
    (serializers.CharField, (str,), "Must be a string."),
    (serializers.DateTimeField, (str,), "Must be a string: a date and time in ISO 8601."),
    (serializers.IntegerField, (int,), "Must be a whole number."),
    (serializers.FloatField, (int, float), "Must be a number."),
    (serializers.ChoiceField, (str,), "Must be a string: one of the listed values."),
    (serializers.ListField, (list,), "Must be a list."),
    (serializers.DictField, (dict,), "Must be an object."),
)


def _type_errors(field: serializers.Field[Any, Any, Any, Any], value: Any) -> Any:
    """Why ``value`` is not of the JSON type ``field`` takes, or None; for a
    list, its wrong items by index. None (null) is the field's allow_null's
    to judge."""
    if value is None:
        return None
    for kind, types, message in JSON_TYPES:
        if isinstance(field, kind):
            if kind is serializers.IntegerField and isinstance(value, float) and value.is_integer():
                break  # 2.0 is the integer 2 (JSON Schema 2020-12, OpenAPI 3.1's)
            # Booleans are ints in Python; a number field refuses them.
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                return [message]
            break
    if isinstance(field, serializers.ListField):
        items = {i: _type_errors(field.child, item) for i, item in enumerate(value)}
    elif isinstance(field, serializers.DictField):
        items = {key: _type_errors(field.child, item) for key, item in value.items()}
    else:
        return None
    return {key: errors for key, errors in items.items() if errors} or None


def body_errors(serializer: serializers.Serializer[Any], data: Any) -> dict[str, Any]:
    """What in a request body its schema refuses before any field runs:
    keys the serializer does not take (the schema says
    ``additionalProperties: false``) and values of the wrong JSON type."""
    if not isinstance(data, Mapping):
        return {}
    writable = {name: field for name, field in serializer.fields.items() if not field.read_only}
    errors: dict[str, Any] = {str(key): ["Unknown field."] for key in data if key not in writable}
    for name, field in writable.items():
        if name in data and (problem := _type_errors(field, data[name])) is not None:
            errors[name] = problem
    return errors


def held_to_schema(serializer: serializers.Serializer[Any], data: Any, run: Any) -> Any:
    """``run(data)`` (DRF's validation), with what ``body_errors`` finds
    reported beside its errors, in their place."""
    errors = body_errors(serializer, data)
    try:
        values = run(data)
    except serializers.ValidationError as error:
        raise serializers.ValidationError({**as_mapping(error.detail), **errors}) from None
    if errors:
        raise serializers.ValidationError(errors)
    return values


# A query string's parameters, taken as written (not trimmed), as the schema
# states them: what a client sends is what is matched.
# Nested in a request body, it is held to its schema as the body is.
class QuerySerializer(serializers.Serializer[T]):
    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        for field in fields.values():
            if isinstance(field, serializers.CharField):
                field.trim_whitespace = False
        return fields

    def to_internal_value(self, data: Any) -> Any:
        if self.parent is None:
            return super().to_internal_value(data)
        return held_to_schema(self, data, super().to_internal_value)


# A request body held to its schema (body_errors), then DRF's checks. (A
# comment, not a docstring: the schema would show it on every body.)
class BodySerializer(serializers.Serializer[T]):
    def to_internal_value(self, data: Any) -> Any:
        return held_to_schema(self, data, super().to_internal_value)


class NamedChoiceField(serializers.ChoiceField):
    """A choice whose refusal lists the choices: '"x" is not one of full,
    headers, none.'"""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        named = ", ".join(str(choice) for choice in self.choices)
        self.error_messages["invalid_choice"] = f'"{{input}}" is not one of {named}.'


# A model's request body held to its schema, as BodySerializer's; a model
# field with choices refuses a value by naming them.
class BodyModelSerializer(serializers.ModelSerializer[M]):
    serializer_choice_field = NamedChoiceField

    def to_internal_value(self, data: Any) -> Any:
        return held_to_schema(self, data, super().to_internal_value)


class NameRelatedField(serializers.SlugRelatedField):
    """A related object by its name (``slug_field="name"``). A name that
    names nothing answers as it would in a path, 404 with ``missing``'s
    code: the request is well formed, what it names is not there (a name
    no object can have, one with a NUL, included). A blank name is refused;
    null, where the field allows it, stands for none."""

    default_error_messages = {"blank": "May not be blank; send null for none."}

    def __init__(self, *, missing: type[NotFound], what: str, **kwargs: Any) -> None:
        super().__init__(slug_field="name", **kwargs)
        self.missing = missing
        self.what = what

    def run_validation(self, data: Any = empty) -> Any:
        if data == "":  # DRF's related fields would take it as null
            self.fail("blank")
        return super().run_validation(data)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")
        found = None if "\x00" in data else self.get_queryset().filter(name=data).first()
        if found is None:
            raise self.missing(f"There is no {self.what} named {data!r}.")
        return found


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
    """Seconds until a message expires: a number above 0 and at most 365
    days. NaN and infinity, which ``float()`` would take, are refused here
    so the error names the field."""

    default_error_messages = {"not_positive": "Ensure this value is greater than 0."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_value=MAX_EXPIRY_SECONDS, **kwargs)

    def to_internal_value(self, data: Any) -> float:
        value = super().to_internal_value(data)
        if value <= 0:
            self.fail("not_positive")
        return value


@extend_schema_field(
    {
        "type": "object",
        "maxProperties": MAX_HEADERS,
        "propertyNames": {"minLength": 1, "maxLength": MAX_HEADER_NAME_LENGTH, "pattern": NO_NUL},
        "additionalProperties": {"type": "string", "pattern": NO_NUL},
    }
)
class HeadersField(serializers.DictField):
    """A message's headers: a flat object of string values. The schema states
    what the publish service holds them to (broker.services.publish): how
    many, a name's length, no NUL in a name or a value (PostgreSQL cannot
    store one). Only their total size as JSON is the service's alone to say."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            child=serializers.CharField(allow_blank=True, trim_whitespace=False), **kwargs
        )


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
