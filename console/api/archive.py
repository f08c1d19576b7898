"""REST API for the archive's search."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.models import QUEUE_NAME_MAX_LENGTH, MessageState, queue_name_validator
from broker.pipeline.selectors import ArchivedMessage
from broker.services.transfer import payload_document
from console.access import request_access
from console.api.fields import BodySerializer, QuerySerializer, parsed
from console.api.schema import ERROR
from console.roles import Role


class ArchiveQuerySerializer(QuerySerializer[dict[str, Any]]):
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, validators=[queue_name_validator]
    )
    since = serializers.DateTimeField(required=False, help_text="Published at or after.")
    until = serializers.DateTimeField(required=False, help_text="Published before.")
    before_id = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="The next page: ids below."
    )
    page_size = serializers.IntegerField(min_value=1, max_value=500, default=100)


class ArchivedMessageSerializer(BodySerializer[ArchivedMessage]):
    id = serializers.IntegerField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=MessageState.choices)
    payload = serializers.SerializerMethodField(
        help_text="The payload as text or base64 (payload_encoding); null when not retained."
    )
    payload_encoding = serializers.SerializerMethodField(
        help_text="string or base64; null when the payload was not retained."
    )
    content_type = serializers.CharField()
    headers = serializers.DictField()
    dead_letter = serializers.DictField(allow_null=True)
    put_application = serializers.CharField()
    put_user = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    replay_job_id = serializers.IntegerField(
        allow_null=True,
        help_text="The replay job that wrote this message as a copy; null for any other.",
    )
    replay_source_id = serializers.IntegerField(
        allow_null=True,
        help_text="The message this copy was replayed from; null for any other.",
    )

    def get_payload(self, message: ArchivedMessage) -> str | None:
        return payload_document(message.payload)[0]

    def get_payload_encoding(self, message: ArchivedMessage) -> str | None:
        return payload_document(message.payload)[1]


class ArchivePageSerializer(BodySerializer[dict[str, Any]]):
    results = ArchivedMessageSerializer(many=True)
    next_before_id = serializers.IntegerField(
        allow_null=True, help_text="Pass as `before_id` for the next page; null on the last."
    )


class ArchiveSearchView(APIView):
    @extend_schema(
        parameters=[ArchiveQuerySerializer],
        responses={200: ArchivePageSerializer, 400: ERROR},
        description="A queue's archived messages published in [since, until), newest first, "
        "read from the Parquet archive (no database rows).",
    )
    def get(self, request: Request) -> Response:
        # Imported here, not with the URLconf: see broker.pipeline.archive_reads.
        from broker.pipeline.archive_reads import archive_search

        query = parsed(ArchiveQuerySerializer, request.query_params).validated_data
        request_access(request).check(Role.VIEWER, query["queue"])
        size = query.pop("page_size")
        found = archive_search(**query, limit=size + 1)
        return Response(
            ArchivePageSerializer(
                {
                    "results": found[:size],
                    "next_before_id": found[size - 1].id if len(found) > size else None,
                }
            ).data
        )
