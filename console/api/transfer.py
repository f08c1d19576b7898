"""REST API for messages as files: the streamed export of what the message
filters select (JSON Lines or CSV), and the import of a JSON Lines body into
a queue (broker.services.transfer)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.selectors import MessageFilter
from broker.services.transfer import FORMATS, messages_export, messages_import
from console.access import messages_within, request_access
from console.api.fields import QuerySerializer, parsed
from console.api.schema import ERROR
from console.api.triage import MessageQuerySerializer
from console.roles import Role

JSON_LINES = FORMATS["jsonl"]


def export_download(chunks: Iterator[str], export_format: str) -> StreamingHttpResponse:
    """An export as a download, written as its chunks come."""
    response = StreamingHttpResponse(chunks, content_type=FORMATS[export_format])
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="messages-{stamp}.{export_format}"'
    return response


class JsonAnswers(BaseContentNegotiation):
    """Errors are JSON whatever the client accepts; an export sets its own
    media type (the ``format`` parameter chooses it, not Accept)."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        media_type = (request.content_type or "").split(";")[0].strip().lower()
        return next((parser for parser in parsers if parser.media_type == media_type), None)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        return JSONRenderer(), JSONRenderer.media_type


class JsonLinesParser(BaseParser):
    """A JSON Lines body as its raw lines, up to LAZARETTO_MAX_IMPORT_BYTES
    (413 past it); each line is checked by the import."""

    media_type = JSON_LINES

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> dict[str, list[bytes]]:
        limit = settings.LAZARETTO_MAX_IMPORT_BYTES
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise RequestDataTooBig(f"An import holds at most {limit:,} bytes.")
        return {"lines": body.splitlines()}


class PlainTextLinesParser(JsonLinesParser):
    """The same lines sent as ``text/plain`` (as ``curl --data-binary`` with
    a plain-text type does)."""

    media_type = "text/plain"


# An import body holds a line that is not blank: one of blank lines only,
# or none, holds no message (400 import_invalid). Whatever else a line may
# be, only the import's own reading of it can say.
IMPORT_BODY = {"type": "string", "minLength": 1, "pattern": r"\S"}


class ImportSchema(AutoSchema):
    """The import's schema: its body is required. (drf-spectacular makes a
    body given as a raw schema optional, and a client would send none.)"""

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        if operation is not None and "requestBody" in operation:
            operation["requestBody"]["required"] = True
        return operation


class ExportQuerySerializer(MessageQuerySerializer):
    format = serializers.ChoiceField(
        choices=sorted(FORMATS),
        default="jsonl",
        help_text="`jsonl`: one JSON message document a line; `csv`: the same columns, "
        "the payload as base64 in `payload_base64`.",
    )


class ImportQuerySerializer(QuerySerializer[dict[str, bool]]):
    # A field (the serializer's metaclass takes it), not Serializer.partial.
    partial = serializers.BooleanField(  # type: ignore[assignment]
        default=False,
        help_text="Write the good lines and list the bad ones, rather than refuse the file.",
    )


class LineErrorSerializer(serializers.Serializer[dict[str, Any]]):
    line = serializers.IntegerField(help_text="The line's number, from 1.")
    detail = serializers.CharField(help_text="Why it is not a message.")


class ImportResultSerializer(serializers.Serializer[dict[str, Any]]):
    count = serializers.IntegerField(help_text="Messages published.")
    ids = serializers.ListField(child=serializers.IntegerField(), help_text="Their ids, in order.")
    skipped = LineErrorSerializer(
        many=True, help_text="With `partial`: the bad lines, not written, and why."
    )


DOCUMENT_EXAMPLE = (
    '{"id": 7, "queue": "ORDERS.IN", "payload": "{\\"order\\": 1}", "payload_encoding": '
    '"string", "content_type": "application/json", "headers": {"source": "web"}, "priority": 4, '
    '"dead_letter": null, "state": "TBDL", "crash_count": 0, "timeout_count": 0, '
    '"created_at": "2026-11-26T13:29:48.123456Z", "updated_at": "2026-11-26T13:29:48.123456Z"}\n'
)


class MessageExportView(APIView):
    """Stream what the filters select, oldest first, as JSON Lines or CSV."""

    read_role = Role.OPERATOR  # an export hands out payloads
    content_negotiation_class = JsonAnswers

    @extend_schema(
        parameters=[ExportQuerySerializer],
        responses={
            (200, JSON_LINES): OpenApiResponse(
                OpenApiTypes.STR,
                description="One message document a line.",
                examples=[OpenApiExample("a message", value=DOCUMENT_EXAMPLE)],
            ),
            (200, FORMATS["csv"]): OpenApiResponse(
                OpenApiTypes.STR, description="A header row, then one message a row."
            ),
            (400, "application/json"): ERROR,
            (403, "application/json"): ERROR,
            (404, "application/json"): ERROR,
        },
        description="Every message the filters select (the message browser's), oldest first, "
        "streamed as it is read: `format=jsonl` (default) or `format=csv`. An unknown `queue` "
        "is 404 `queue_not_found`. Operator role: an export hands out payloads. Audited as "
        "`messages_export`.",
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        query = dict(parsed(ExportQuerySerializer, request.query_params).validated_data)
        export_format = query.pop("format")
        access = request_access(request)
        if query.get("queue"):
            access.check(Role.OPERATOR, query["queue"])
        chunks = messages_export(
            filters=MessageFilter(**query),
            export_format=export_format,
            actor=request.user,
            via="api",
            within=messages_within(access.queues(Role.OPERATOR)),
        )
        return export_download(chunks, export_format)


class QueueImportView(APIView):
    """Publish the messages of a JSON Lines body to the queue."""

    parser_classes = [JsonLinesParser, PlainTextLinesParser]
    content_negotiation_class = JsonAnswers
    schema = ImportSchema()

    @extend_schema(
        parameters=[ImportQuerySerializer],
        request={JSON_LINES: IMPORT_BODY, "text/plain": IMPORT_BODY},
        responses={201: ImportResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR, 413: ERROR},
        examples=[OpenApiExample("one message", value=DOCUMENT_EXAMPLE, request_only=True)],
        description="A JSON Lines file (`Content-Type: application/x-ndjson`, or `text/plain`), one message "
        "document a line as the export writes them: `payload` (required), `payload_encoding` "
        "(`string` or `base64`), `content_type`, `headers`, `priority`; the export's other keys "
        "are ignored; blank lines are skipped, and a body of none but blank lines (or none at "
        "all) holds no message: 400 `import_invalid`. Every line is checked first: a bad one "
        "refuses the file (400 "
        "`import_invalid`, with `field_errors` naming each bad line as `lines[N]`) and nothing "
        "is written, unless `partial=true`: then the good lines are published and the bad ones "
        "listed in `skipped`. A `reject_new` queue the import would take past its max messages "
        "refuses it whole (409 `max_messages_reached`). At most `LAZARETTO_MAX_IMPORT_BYTES` "
        "(413 `request_too_large`). Audited as `messages_import`.",
    )
    def post(self, request: Request, name: str) -> Response:
        request_access(request).check(Role.OPERATOR, name)
        partial = parsed(ImportQuerySerializer, request.query_params).validated_data["partial"]
        lines: list[bytes] = request.data.get("lines", [])
        result = messages_import(
            queue_name=name, lines=lines, actor=request.user, via="api", partial=partial
        )
        body = {
            "count": len(result.ids),
            "ids": result.ids,
            "skipped": [{"line": bad.line, "detail": bad.problem} for bad in result.errors],
        }
        return Response(body, status=status.HTTP_201_CREATED)
