"""The OpenAPI schema's shared parts: the error body, the error answers
every operation can give (every write, too, those of the HA guard), and
what makes the schema state what the serializers enforce: request bodies
closed to unknown keys, text fields' patterns, non-empty query strings, and
bodies of several shapes as oneOf them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from django.core.validators import RegexValidator
from django.http import HttpResponse
from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiResponse
from drf_spectacular.views import SpectacularAPIView
from rest_framework import serializers
from rest_framework.request import Request

from console.api.fields import NO_NUL, NOT_BLANK

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema


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


# drf-spectacular's django-filter extension asks, once per process, whether
# GeoDjango is there by importing it, which looks for the GDAL library with
# ctypes (a dozen ldconfig, gcc and ld runs, a second of processor time)
# before it fails: the console does not install GeoDjango.
DjangoFilterExtension._has_gis = False  # type: ignore[attr-defined]


class SchemaView(SpectacularAPIView):
    """``/api/schema/``: generated once per process and API version, and
    rendered once per format. The schema is the code's, the same for every
    caller (``SERVE_PUBLIC``): generating it took a third of a second of a
    server's processor on every visit to the API's docs, and writing it out
    as YAML as long again."""

    generated: ClassVar[dict[str | None, dict[str, Any]]] = {}
    rendered: ClassVar[dict[tuple[str | None, str], tuple[bytes, str]]] = {}

    def _get_schema_response(self, request: Request) -> HttpResponse:
        version = self.api_version or request.version or self._get_version_parameter(request)
        key = (version, str(request.accepted_media_type))
        if key not in self.rendered:
            if version not in self.generated:
                generator = self.generator_class(
                    urlconf=self.urlconf, api_version=version, patterns=self.patterns
                )
                self.generated[version] = generator.get_schema(
                    request=request, public=self.serve_public
                )
            # What a DRF Response would do with the renderer negotiated.
            renderer = request.accepted_renderer
            body = renderer.render(
                self.generated[version], request.accepted_media_type, self.get_renderer_context()
            )
            if isinstance(body, str):
                body = body.encode(renderer.charset or "utf-8")
            charset = f"; charset={renderer.charset}" if renderer.charset else ""
            self.rendered[key] = (body, f"{renderer.media_type}{charset}")
        body, content_type = self.rendered[key]
        filename = self._get_filename(request, version)
        return HttpResponse(
            body,
            content_type=content_type,
            headers={"Content-Disposition": f'inline; filename="{filename}"'},
        )


ERROR = OpenApiResponse(response=ErrorSerializer, description="An error body.")

UNAVAILABLE = (
    "The message store (`store_unavailable`) or Redis (`redis_unavailable`) cannot be reached "
    "just now; see Retry-After."
)
COMMON = {
    "400": "The input is not valid (`invalid`, with `field_errors`) or malformed.",
    "401": "No credentials, or a token that is unknown, revoked or of a deactivated user.",
    "403": "The user's role does not allow this.",
    "404": "What the path names does not exist (or a bad page cursor).",
    "429": "Over the token's request rate (`throttled`); see Retry-After.",
    "503": UNAVAILABLE,
}
WITH_BODY = {"413": "The body is larger than the server accepts."}
# What the store's HA guard refuses (broker.ha.guard), whatever the operation.
WRITES = {
    "409": "Refused in the current state: a name already taken (`already_exists`) and, among "
    "others, every configuration change (queues, topics, subscriptions, rules tables) while "
    "an HA standby synchronises (`ha_synchronising`).",
    "503": f"{UNAVAILABLE} Or the HA pair is in maintenance after a split brain "
    "(`ha_maintenance`): writes are refused until an admin picks the primary.",
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
            own = responses["503"]
            if UNAVAILABLE not in own["description"]:
                # An operation's own 503 (an HA node that did not answer):
                # an outage answers it too.
                own["description"] = f"{own['description']} {UNAVAILABLE}"
    return result


class TextFieldExtension(OpenApiSerializerFieldExtension):
    """What a text field refuses beyond its length, stated as a pattern in
    requests: a NUL always, and "  " too where the field trims whitespace
    and may not be blank (``minLength: 1`` alone would let a client send
    it). A field with a pattern of its own (a name's) says more already."""

    target_class = serializers.CharField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: AutoSchema, direction: str) -> dict[str, Any]:
        field = self.target
        schema: dict[str, Any] = auto_schema._map_serializer_field(
            field, direction, bypass_extensions=True
        )
        if isinstance(schema.get("type"), list):
            # drf-spectacular adds the field's own null to what an extension
            # answers, as it did to the mapping bypassed here: one is enough.
            schema["type"] = [kind for kind in schema["type"] if kind != "null"]
        if direction != "request" or any(isinstance(v, RegexValidator) for v in field.validators):
            return schema
        trims = getattr(field, "trim_whitespace", False)
        schema["pattern"] = NOT_BLANK if trims and not field.allow_blank else NO_NUL
        return schema


def nulls_as_openapi_31(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: null said as OpenAPI 3.1 says it, a
    "null" in the type list, where drf-spectacular still says it otherwise:
    DRF's pagination links (``next``, ``previous``) in 3.0's ``nullable``,
    which 3.1 ignores, and a model's nullable JSONField (a message's
    ``dead_letter``) as ``oneOf: [{}, {"type": "null"}]``, which a null
    matches twice and so fails."""

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
        if not isinstance(node, dict):
            return
        if node.get("nullable") is True:
            del node["nullable"]
            kind = node.get("type")
            if isinstance(kind, str):
                node["type"] = [kind, "null"]
            elif isinstance(kind, list) and "null" not in kind:
                kind.append("null")
        if isinstance(node.get("oneOf"), list) and {} in node["oneOf"]:
            del node["oneOf"]  # anything, null among it
        for value in node.values():
            visit(value)

    visit(result.get("components", {}))
    visit(result.get("paths", {}))
    return result


def nonempty_query_strings(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: a text query parameter is at least one
    character long, as console.middleware.EmptyQueryParameterMiddleware
    holds every query parameter to be."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query" and schema.get("type") == "string":
                    schema["minLength"] = max(1, schema.get("minLength", 0))
    return result


# The shapes a request body takes that its serializer's own validation
# tells apart, beyond its fields' constraints, by serializer (one_of).
Shape = tuple[str, dict[str, Any]]
SHAPES: dict[str, tuple[Shape, ...]] = {}
S = TypeVar("S", bound=type)


def one_of(*shapes: Shape) -> Callable[[S], S]:
    """Class decorator: the serializer's request body is exactly one of
    ``shapes``, each ``(component name, {"required": [...], "properties":
    {name: constraints to add, or None to leave the field out}})``. The
    schema then offers each shape as a whole object of its own, so that a
    generated client has a model for each (bulk by ``ids`` or by
    ``filter``, a payload as text or as base64)."""

    def register(serializer_class: S) -> S:
        SHAPES[serializer_class.__name__.removesuffix("Serializer")] = shapes
        return serializer_class

    return register


def _shape(component: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    variant = copy.deepcopy(component)
    for name, constraints in shape.get("properties", {}).items():
        if constraints is None:
            variant["properties"].pop(name, None)
        else:
            variant["properties"][name] = {**variant["properties"][name], **constraints}
    required = [name for name in variant.get("required", []) if name in variant["properties"]]
    variant["required"] = sorted({*required, *shape.get("required", [])})
    for name in shape.get("required", []):
        variant["properties"][name].pop("default", None)  # a shape that needs it has none
    return variant


def split_request_shapes(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry, after close_request_bodies: a request
    component whose serializer has shapes (one_of) becomes ``oneOf`` its
    shapes, each a component of its own."""
    components = result.get("components", {}).get("schemas", {})
    for base, shapes in SHAPES.items():
        component = components.get(f"{base}Request")
        if component is None:
            continue
        for name, shape in shapes:
            components[name] = _shape(component, shape)
        components[f"{base}Request"] = {
            "oneOf": [{"$ref": f"#/components/schemas/{name}"} for name, _ in shapes],
            "description": component.get("description", ""),
        }
    return result


def close_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: a request body's object takes only the
    keys it lists (``additionalProperties: false``), as the serializers
    refuse any other (console.api.fields.body_errors)."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result
