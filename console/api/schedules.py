"""REST API for replay schedules: saved replays that run by the clock
(broker.pipeline.schedules), run now, paused, resumed, and their jobs."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from django.core.validators import RegexValidator
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.fields import empty
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import ScheduleNotFound
from broker.models import ReplayJob, ReplaySchedule, ReplaySource, ScheduleFiring
from broker.pipeline.schedules import (
    DEFAULT_GIVE_UP_AFTER,
    MAX_COOL_OFF_MINUTES,
    MAX_GIVE_UP_AFTER,
    MAX_INTERVAL_SECONDS,
    NAME_MAX_LENGTH,
    SCHEDULE_SOURCES,
    ScheduleSpec,
    Timing,
    latest_job,
    next_firing,
    next_firings,
    schedule_create,
    schedule_delete,
    schedule_get,
    schedule_pause,
    schedule_resume,
    schedule_run_now,
    schedule_update,
    schedule_update_parts,
    schedules_all,
    timing_of,
)
from broker.pipeline.selection import MessageSelection, ReplaySpec
from console.access import (
    check_replay,
    held_replay,
    held_schedule_parts,
    replays_within,
    request_access,
    schedule_held,
    schedule_replay,
)
from console.api.fields import NO_CONTENT, BodyModelSerializer, parsed
from console.api.messages import NewestFirst
from console.api.replay import (
    REPLAY_SPEC_ERRORS,
    ReplayFilterSerializer,
    ReplayJobFilter,
    ReplayJobSerializer,
    ReplaySpecSerializer,
)
from console.api.schema import ERROR, one_of

# The words of a cron line, as the schema states them: each field a list of
# `*`, `5`, `1-5` or `mon-fri`, each with an optional `/step`, the fields
# apart by spaces. How many fields, their values' ranges and their lengths
# are the schedule service's to say (timing_problems).
CRON_ITEM = r"(?:\*|[0-9A-Za-z]+(?:-[0-9A-Za-z]+)?)(?:/[0-9]+)?"
CRON_FIELD = rf"{CRON_ITEM}(?:,{CRON_ITEM})*"
CRON_LINE = rf"\A *(?:{CRON_FIELD}(?: +{CRON_FIELD})*)? *\Z"
CRON_MAX_LENGTH = 255
TIME_ZONE_MAX_LENGTH = 64

OTHER_SCHEDULE_SOURCES = [
    str(source) for source in SCHEDULE_SOURCES if source != ReplaySource.DEAD_LETTER
]


def _selection(parts: dict[str, Any] | None) -> MessageSelection:
    parts = dict(parts or {})
    return MessageSelection(**{**parts, "queues": tuple(parts.get("queues", ()))})


@one_of(
    (
        "DeadLetterReplayScheduleInRequest",
        {
            "required": ["source_queue"],
            "properties": {"source": {"enum": ["dead_letter"]}, "source_queue": {"minLength": 1}},
        },
    ),
    (
        "OtherSourceReplayScheduleInRequest",
        {
            "properties": {
                "source": {"enum": OTHER_SCHEDULE_SOURCES},
                "source_queue": {"maxLength": 0},
            }
        },
    ),
)
class ReplayScheduleInSerializer(ReplaySpecSerializer):
    """A replay schedule: the replay it runs (a replay job's body, never a
    dry run, from a dead-letter queue, the blacklist or failed messages),
    when it fires (`cron` in `time_zone`, or every `every_seconds`), how long
    a message waits before it is taken (`cool_off_minutes`), and after how
    many replays of its copies a message is given up (`give_up_after`)."""

    # The replay job's serializer without its dry run: a schedule writes.
    dry_run = None  # type: ignore[assignment]
    name = serializers.CharField(max_length=NAME_MAX_LENGTH, help_text="Unique among schedules.")
    cron = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        max_length=CRON_MAX_LENGTH,
        validators=[
            RegexValidator(
                CRON_LINE,
                "Write a cron line as five fields (minute hour day-of-month month day-of-week), "
                "each like *, 5, 1-5, */15, mon-fri or 0,30.",
            )
        ],
        help_text="Five fields: minute hour day-of-month month day-of-week (`0 3 * * mon-fri`); "
        "blank with `every_seconds`.",
    )
    time_zone = serializers.CharField(
        default="UTC",
        max_length=TIME_ZONE_MAX_LENGTH,
        help_text="The time zone of the cron line's wall-clock times (`Europe/Paris`).",
    )
    every_seconds = serializers.IntegerField(
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_INTERVAL_SECONDS,
        help_text="Fire every this many seconds instead of by a cron line; null: by the cron line.",
    )
    cool_off_minutes = serializers.IntegerField(
        default=0,
        min_value=0,
        max_value=MAX_COOL_OFF_MINUTES,
        help_text="Take only messages in their state (dead-lettered, blacklisted, failed) for "
        "at least this long.",
    )
    give_up_after = serializers.IntegerField(
        default=DEFAULT_GIVE_UP_AFTER,
        min_value=1,
        max_value=MAX_GIVE_UP_AFTER,
        help_text="Leave a message alone once it has been replayed this many times (its "
        "generation).",
    )
    enabled = serializers.BooleanField(default=True, help_text="False: saved paused.")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        """A change (PATCH) names what it changes: no field has a default
        there, which a client generated from the schema would send."""
        fields = super().get_fields()
        if self.partial:
            for field in fields.values():
                field.default = empty
                field.required = False
        return fields

    def schedule_spec(self) -> ScheduleSpec:
        """The schedule the valid data describes; the schedule service
        checks it whole (an InvalidInput naming every field)."""
        data = self.validated_data
        return ScheduleSpec(
            name=data["name"],
            replay=ReplaySpec(
                source=data["source"],
                source_queue=data["source_queue"],
                filter=_selection(data.get("filter")),
                target_queue=data["target_queue"],
                rules_text=data["rules_text"],
                velocity=data["velocity"],
            ),
            timing=Timing(
                cron=data["cron"], time_zone=data["time_zone"], every_seconds=data["every_seconds"]
            ),
            cool_off_minutes=data["cool_off_minutes"],
            give_up_after=data["give_up_after"],
            enabled=data["enabled"],
        )

    def schedule_parts(self) -> dict[str, Any]:
        """What a partial body changes, as ``schedule_update_parts`` takes
        it: the filter whole."""
        parts = dict(self.validated_data)
        if "filter" in parts:
            parts["filter"] = _selection(parts["filter"])
        return parts


class LastJobSerializer(BodyModelSerializer[ReplayJob]):
    """The latest replay job a schedule's firing submitted."""

    class Meta:
        model = ReplayJob
        fields = ["id", "status", "written", "finished_at"]
        read_only_fields = fields


TIME = serializers.DateTimeField()


def _firings(schedule: ReplaySchedule, count: int = 5) -> list[datetime]:
    """The next ``count`` times the schedule fires; none while paused or deleted."""
    first = next_firing(schedule)
    if first is None:
        return []
    return [first, *next_firings(timing_of(schedule), after=first, count=count - 1)]


class ReplayScheduleSerializer(BodyModelSerializer[ReplaySchedule]):
    """A replay schedule: the replay it runs, when it fires next, and its
    latest job."""

    filter = serializers.SerializerMethodField()
    cron = serializers.SerializerMethodField(help_text="Blank for an interval schedule.")
    time_zone = serializers.SerializerMethodField()
    every_seconds = serializers.SerializerMethodField(help_text="Null for a cron schedule.")
    enabled = serializers.BooleanField(read_only=True, help_text="False: paused.")
    next_firing = serializers.SerializerMethodField(help_text="Null while paused.")
    next_firings = serializers.SerializerMethodField(
        help_text="The next five firings; empty while paused."
    )
    last_job = serializers.SerializerMethodField(help_text="Null before the first firing.")
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = ReplaySchedule
        fields = [
            "id",
            "name",
            "source",
            "source_queue",
            "filter",
            "target_queue",
            "rules_text",
            "velocity",
            "cron",
            "time_zone",
            "every_seconds",
            "cool_off_minutes",
            "give_up_after",
            "enabled",
            "next_firing",
            "next_firings",
            "last_job",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(ReplayFilterSerializer)
    def get_filter(self, schedule: ReplaySchedule) -> dict[str, Any]:
        return dict(ReplayFilterSerializer(MessageSelection.from_stored(schedule.filters)).data)

    def get_cron(self, schedule: ReplaySchedule) -> str:
        return timing_of(schedule).cron

    def get_time_zone(self, schedule: ReplaySchedule) -> str:
        return timing_of(schedule).time_zone

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_every_seconds(self, schedule: ReplaySchedule) -> int | None:
        return timing_of(schedule).every_seconds

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_firing(self, schedule: ReplaySchedule) -> str | None:
        first = next_firing(schedule)
        return None if first is None else TIME.to_representation(first)

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_firings(self, schedule: ReplaySchedule) -> list[str]:
        return [TIME.to_representation(moment) for moment in _firings(schedule)]

    @extend_schema_field(LastJobSerializer(allow_null=True))
    def get_last_job(self, schedule: ReplaySchedule) -> dict[str, Any] | None:
        job = latest_job(schedule)
        return None if job is None else dict(LastJobSerializer(job).data)


class ScheduleFiringSerializer(BodyModelSerializer[ScheduleFiring]):
    """One firing of a schedule and the replay job it submitted."""

    job = ReplayJobSerializer(read_only=True, allow_null=True)

    class Meta:
        model = ScheduleFiring
        fields = ["id", "fired_at", "manual", "skipped", "job"]
        read_only_fields = fields
        extra_kwargs = {
            "manual": {"help_text": "Run now by a user rather than fired by its timing."},
            "skipped": {"help_text": "Why it submitted no job; blank when it did."},
        }


def schedule_json(schedule_id: int) -> dict[str, Any]:
    """A schedule as every answer shows it, read afresh after a change. A
    deleted one is gone from the API (its jobs are still listed)."""
    schedule = schedule_get(schedule_id=schedule_id)
    if schedule.deleted_at is not None:
        raise ScheduleNotFound(f"Replay schedule {schedule.name!r} was deleted.")
    return dict(ReplayScheduleSerializer(schedule).data)


SCHEDULE_ERRORS = (
    "Anything wrong is 400 `invalid` with an error per field and nothing is stored: the "
    "replay's fields as a replay job's (a queue that is not there included), `name`, `cron` "
    "(five fields, each in range), `time_zone`, `every_seconds` (a cron line or an interval, "
    "not both), `cool_off_minutes`, `give_up_after`. A name another schedule has is 409 "
    "`already_exists`. " + REPLAY_SPEC_ERRORS
)


class ReplayScheduleListView(APIView):
    @extend_schema(
        responses=ReplayScheduleSerializer(many=True),
        description="The replay schedules (not deleted), by name.",
    )
    def get(self, request: Request) -> Response:
        within = replays_within(request_access(request), request.user.pk)
        return Response(ReplayScheduleSerializer(schedules_all(within=within), many=True).data)

    @extend_schema(
        request=ReplayScheduleInSerializer,
        responses={201: ReplayScheduleSerializer, 400: ERROR, 409: ERROR},
        description="Save a replay schedule (operator); beat fires it from its next slot on. "
        + SCHEDULE_ERRORS,
    )
    def post(self, request: Request) -> Response:
        spec = parsed(ReplayScheduleInSerializer, request.data).schedule_spec()
        spec = replace(spec, replay=held_replay(request_access(request), spec.replay))
        schedule = schedule_create(spec=spec, actor=request.user)
        return Response(schedule_json(schedule.id), status=status.HTTP_201_CREATED)


class ReplayScheduleDetailView(APIView):
    @extend_schema(
        responses={200: ReplayScheduleSerializer, 404: ERROR},
        description="One schedule; 404 once deleted (its jobs are still listed).",
    )
    def get(self, request: Request, schedule_id: int) -> Response:
        schedule_held(request, schedule_id)
        return Response(schedule_json(schedule_id))

    @extend_schema(
        request=ReplayScheduleInSerializer,
        responses={200: ReplayScheduleSerializer, 400: ERROR, 404: ERROR, 409: ERROR},
        description="Replace what the schedule does and when, as a creation would (`enabled` "
        "left out is true); its past jobs stay as they ran. 409 `schedule_deleted` for a "
        "deleted schedule. " + SCHEDULE_ERRORS,
    )
    def put(self, request: Request, schedule_id: int) -> Response:
        check_replay(request_access(request), schedule_replay(schedule_held(request, schedule_id)))
        spec = parsed(ReplayScheduleInSerializer, request.data).schedule_spec()
        spec = replace(spec, replay=held_replay(request_access(request), spec.replay))
        schedule_update(schedule_id=schedule_id, spec=spec, actor=request.user)
        return Response(schedule_json(schedule_id))

    @extend_schema(
        request=ReplayScheduleInSerializer,
        responses={200: ReplayScheduleSerializer, 400: ERROR, 404: ERROR, 409: ERROR},
        description="Change the fields given; the rest stay (`filter` is replaced whole). A "
        "`cron` given alone turns an interval schedule into a cron one, an `every_seconds` "
        "given alone the other way. The result is checked whole. " + SCHEDULE_ERRORS,
    )
    def patch(self, request: Request, schedule_id: int) -> Response:
        schedule = schedule_held(request, schedule_id)
        check_replay(request_access(request), schedule_replay(schedule))
        serializer = ReplayScheduleInSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        parts = held_schedule_parts(request_access(request), schedule, serializer.schedule_parts())
        schedule_update_parts(schedule_id=schedule_id, actor=request.user, **parts)
        return Response(schedule_json(schedule_id))

    @extend_schema(
        responses={204: NO_CONTENT, 404: ERROR, 409: ERROR},
        description="Stop the schedule for good: it fires no more, its jobs stay, and its name "
        "is free again. 409 `schedule_deleted` when it was deleted already.",
    )
    def delete(self, request: Request, schedule_id: int) -> Response:
        check_replay(request_access(request), schedule_replay(schedule_held(request, schedule_id)))
        schedule_delete(schedule_id=schedule_id, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ReplayScheduleSwitchView(APIView):
    """pause: the schedule fires no more until resumed. resume: it fires at
    its next slot, or at once when a slot passed while it was paused (once,
    however many passed)."""

    operation = ""

    @extend_schema(request=None, responses={200: ReplayScheduleSerializer, 404: ERROR, 409: ERROR})
    def post(self, request: Request, schedule_id: int) -> Response:
        check_replay(request_access(request), schedule_replay(schedule_held(request, schedule_id)))
        switch = schedule_pause if self.operation == "pause" else schedule_resume
        switch(schedule_id=schedule_id, actor=request.user)
        return Response(schedule_json(schedule_id))


class ReplayScheduleRunView(APIView):
    @extend_schema(
        request=None,
        responses={201: ScheduleFiringSerializer, 404: ERROR, 409: ERROR},
        description="Fire the schedule now, outside its timing (which goes on as before): its "
        "replay job is queued. 409 `schedule_paused`, `schedule_deleted`, or `schedule_busy` "
        "while its previous job is queued or running.",
    )
    def post(self, request: Request, schedule_id: int) -> Response:
        check_replay(request_access(request), schedule_replay(schedule_held(request, schedule_id)))
        firing = schedule_run_now(schedule_id=schedule_id, actor=request.user)
        fired = ScheduleFiring.objects.select_related("job__created_by").get(id=firing.id)
        return Response(ScheduleFiringSerializer(fired).data, status=status.HTTP_201_CREATED)


class ReplayScheduleJobsView(ListAPIView[ReplayJob]):
    """The replay jobs a schedule's firings submitted, newest first, in
    keyset pages; `?status=` (repeatable). A deleted schedule's too: they
    stay."""

    queryset = ReplayJob.objects.none()
    serializer_class = ReplayJobSerializer
    filterset_class = ReplayJobFilter
    pagination_class = NewestFirst

    def get_queryset(self) -> QuerySet[ReplayJob]:
        schedule = schedule_held(self.request, self.kwargs["schedule_id"])
        return ReplayJob.objects.select_related("created_by").filter(schedule=schedule)

    @extend_schema(responses={200: ReplayJobSerializer(many=True), 404: ERROR})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
