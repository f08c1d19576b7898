"""REST API for replay jobs: submit, preview, follow and control."""

from __future__ import annotations

import dataclasses
from typing import Any

import django_filters
from django.core.validators import RegexValidator
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from broker.models import (
    QUEUE_NAME_MAX_LENGTH,
    ReplayJob,
    ReplayJobStatus,
    ReplaySource,
    queue_name_validator,
)
from broker.pipeline.replay import replay_job_cancel, replay_job_run_again, replay_job_submit
from broker.pipeline.selection import (
    MAX_TEXT_FILTER,
    MAX_VELOCITY,
    MessageSelection,
    ReplaySpec,
    replay_spec_parse,
)
from broker.pipeline.selectors import replay_preview
from console.access import (
    check_replay,
    held_replay,
    replay_job_held,
    replays_within,
    request_access,
)
from console.api.fields import BodyModelSerializer, BodySerializer, as_mapping
from console.api.messages import NewestFirst
from console.api.schema import ERROR, ErrorSerializer, one_of


class ReplayFilterSerializer(BodySerializer[MessageSelection]):
    """Which source messages a replay job takes; empty parts take everything."""

    queues = serializers.ListField(
        child=serializers.CharField(
            max_length=QUEUE_NAME_MAX_LENGTH, validators=[queue_name_validator]
        ),
        default=list,
        help_text="Queue names; for a dead-letter source, the queues the messages were "
        "dead-lettered from.",
    )
    reason = serializers.CharField(
        allow_blank=True,
        default="",
        max_length=MAX_TEXT_FILTER,
        help_text="Dead-letter reason code (`handler_error`, ...).",
    )
    since = serializers.DateTimeField(
        allow_null=True, default=None, help_text="Published at or after (ISO 8601)."
    )
    until = serializers.DateTimeField(
        allow_null=True, default=None, help_text="Published before (ISO 8601)."
    )
    header = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        max_length=MAX_TEXT_FILTER,
        validators=[RegexValidator(r"\A(?:[^=\x00]+=[^\x00]*)?\Z", "Write it as name=value.")],
        help_text="`name=value`: messages whose header `name` is `value`.",
    )
    payload_text = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        max_length=MAX_TEXT_FILTER,
        help_text="Messages whose payload contains this text.",
    )


FILTER_PARTS = frozenset(field.name for field in dataclasses.fields(MessageSelection))


# A dead-letter source names its dead-letter queue; every other names none.
OTHER_SOURCES = [value for value in ReplaySource.values if value != ReplaySource.DEAD_LETTER]


@one_of(
    (
        "DeadLetterReplaySpecRequest",
        {
            "required": ["source_queue"],
            "properties": {"source": {"enum": ["dead_letter"]}, "source_queue": {"minLength": 1}},
        },
    ),
    (
        "OtherSourceReplaySpecRequest",
        {"properties": {"source": {"enum": OTHER_SOURCES}, "source_queue": {"maxLength": 0}}},
    ),
)
class ReplaySpecSerializer(BodySerializer[ReplaySpec]):
    """What a replay job does. The shape is checked here; whether the job
    can run (queues exist, rules parse, the range is sane) is the replay
    service's to say, by field."""

    # DRF's metaclass takes declared fields out of the class, so this one
    # does not shadow Field.source at run time; the stubs cannot tell.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=ReplaySource.choices, help_text="Where the messages come from."
    )
    source_queue = serializers.CharField(
        allow_blank=True,
        default="",
        help_text="The dead-letter queue to read, for source `dead_letter` (and only then).",
    )
    filter = ReplayFilterSerializer(required=False)
    target_queue = serializers.CharField(
        allow_blank=True,
        default="",
        help_text="Where every message goes; blank: each back to its original queue.",
    )
    rules_text = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="A rules table in runmqdlq syntax that routes (or skips) each message.",
    )
    velocity = serializers.IntegerField(
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_VELOCITY,
        help_text=f"At most this many messages written per second (1 to {MAX_VELOCITY}); "
        "null: no limit.",
    )
    dry_run = serializers.BooleanField(
        default=False, help_text="Count and sample what the job would write; write nothing."
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        """Errors in the filter are named by the filter's part (``until``,
        ``queues``), as the replay service names them."""
        try:
            values: dict[str, Any] = super().to_internal_value(data)
        except serializers.ValidationError as error:
            detail = as_mapping(error.detail)
            window = detail.pop("filter", None)
            if isinstance(window, dict):
                for key, messages in window.items():
                    if key == api_settings.NON_FIELD_ERRORS_KEY:
                        detail["filter"] = messages
                    else:
                        detail[key if key in FILTER_PARTS else f"filter.{key}"] = messages
            elif window is not None:
                detail["filter"] = window
            raise serializers.ValidationError(detail) from None
        return values

    def spec(self) -> ReplaySpec:
        """The job the valid data describes, checked whole by the replay
        service's parser (InvalidInput: a 400 naming each field)."""
        data = self.validated_data
        return replay_spec_parse(
            source=data["source"],
            source_queue=data["source_queue"],
            **(data.get("filter") or {}),
            target_queue=data["target_queue"],
            rules_text=data["rules_text"],
            velocity=data["velocity"],
            dry_run=data["dry_run"],
        )


class ReplayJobSerializer(BodyModelSerializer[ReplayJob]):
    """A replay job: what it does, where it stands, what it wrote."""

    filter = serializers.SerializerMethodField()
    percent = serializers.IntegerField(read_only=True, help_text="Progress, 0 to 100.")
    per_target = serializers.DictField(
        child=serializers.IntegerField(), read_only=True, help_text="Messages per target queue."
    )
    per_rule = serializers.DictField(
        child=serializers.IntegerField(),
        read_only=True,
        help_text='Messages per rule of `rules_text` (its number, or "none").',
    )
    sample = serializers.JSONField(
        read_only=True, help_text="For a dry run, a few of the messages it would write."
    )
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = ReplayJob
        fields = [
            "id",
            "status",
            "percent",
            "source",
            "source_queue",
            "filter",
            "target_queue",
            "rules_text",
            "velocity",
            "dry_run",
            "cancel_requested",
            "total",
            "read",
            "matched",
            "written",
            "skipped",
            "failed",
            "per_target",
            "per_rule",
            "sample",
            "spark_app_id",
            "runs",
            "error",
            "created_by",
            "created_at",
            "started_at",
            "heartbeat_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(ReplayFilterSerializer)
    def get_filter(self, job: ReplayJob) -> dict[str, Any]:
        return dict(ReplayFilterSerializer(MessageSelection.from_stored(job.filters)).data)


class ReplayPreviewSerializer(BodySerializer[dict[str, int]]):
    count = serializers.IntegerField(help_text="Messages the filter matches, before any rules.")


class ReplayJobFilter(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=ReplayJobStatus.choices)

    class Meta:
        model = ReplayJob
        fields = ["status"]


REPLAY_SPEC_ERRORS = (
    "Field errors name the field: `source`, `source_queue`, `target_queue`, `rules_text` "
    '("line N, column C: ..."), `velocity`, `dry_run`, and the filter\'s parts by their own '
    "names (`queues`, `reason`, `since`, `until`, `header`, `payload_text`). Unknown keys are "
    "refused."
)
# A job's queues, as the replay service refuses them (broker.pipeline.selection).
REPLAY_QUEUE_ERRORS = (
    " Where every problem is a queue it names: 404 `queue_not_found` for one that is not "
    "there, else 409 for one of the wrong kind (`queue_is_not_dead_letter`, "
    "`queue_is_dead_letter`)."
)
REPLAY_SPEC_RESPONSES = {
    400: ERROR,
    403: ERROR,
    404: OpenApiResponse(
        ErrorSerializer,
        description="A queue the job names is not there (`queue_not_found`, with "
        "`field_errors` naming each).",
    ),
    409: OpenApiResponse(
        ErrorSerializer,
        description="A queue the job names is of the wrong kind: `source_queue` is not a "
        "dead-letter queue (`queue_is_not_dead_letter`), or `target_queue` is one "
        "(`queue_is_dead_letter`); `detail` names the queue, `field_errors` the field.",
    ),
}


class ReplayJobListView(ListAPIView[ReplayJob]):
    """Replay jobs, newest first, in keyset pages; `?status=` (repeatable)."""

    queryset = ReplayJob.objects.select_related("created_by")
    serializer_class = ReplayJobSerializer
    filterset_class = ReplayJobFilter
    pagination_class = NewestFirst

    def get_queryset(self) -> QuerySet[ReplayJob]:
        jobs = super().get_queryset()
        within = replays_within(request_access(self.request), self.request.user.pk)
        return jobs if within is None else jobs.filter(within)

    @extend_schema(
        request=ReplaySpecSerializer,
        responses={201: ReplayJobSerializer, **REPLAY_SPEC_RESPONSES},
        description="Submit a replay job (operator). It is checked whole: anything wrong is "
        "refused with an error per field and nothing is stored. A worker runs it on Spark. "
        + REPLAY_SPEC_ERRORS
        + REPLAY_QUEUE_ERRORS,
    )
    def post(self, request: Request) -> Response:
        serializer = ReplaySpecSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        spec = held_replay(request_access(request), serializer.spec())
        job = replay_job_submit(spec=spec, actor=request.user)
        return Response(ReplayJobSerializer(job).data, status=status.HTTP_201_CREATED)


class ReplayPreviewView(APIView):
    @extend_schema(
        request=ReplaySpecSerializer,
        responses={200: ReplayPreviewSerializer, **REPLAY_SPEC_RESPONSES},
        description="How many messages a replay job would read (its filter, before any "
        "rules), checked as a submission is; nothing is stored. "
        + REPLAY_SPEC_ERRORS
        + REPLAY_QUEUE_ERRORS,
    )
    def post(self, request: Request) -> Response:
        serializer = ReplaySpecSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        spec = held_replay(request_access(request), serializer.spec())
        return Response({"count": replay_preview(spec)})


class ReplayJobDetailView(APIView):
    @extend_schema(responses={200: ReplayJobSerializer, 404: ERROR})
    def get(self, request: Request, job_id: int) -> Response:
        return Response(ReplayJobSerializer(replay_job_held(request, job_id)).data)


class ReplayJobActionView(APIView):
    """cancel: stop a queued or running job. run: queue a finished, failed or
    cancelled job again; it writes only what earlier runs did not."""

    operation = ""

    @extend_schema(request=None, responses={200: ReplayJobSerializer, 404: ERROR, 409: ERROR})
    def post(self, request: Request, job_id: int) -> Response:
        act = replay_job_cancel if self.operation == "cancel" else replay_job_run_again
        job = replay_job_held(request, job_id)
        check_replay(request_access(request), ReplaySpec.of(job))
        return Response(ReplayJobSerializer(act(job_id=job_id, actor=request.user)).data)
