"""Which messages a pipeline job takes (``MessageSelection``), what a
replay job does (``ReplaySpec``), the rules of a valid one
(``replay_validate``), and the one parser of a submitted job
(``replay_spec_parse``) that the console form, the API and the command use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from broker.errors import (
    InvalidInput,
    NamesNothing,
    QueueIsNotDeadLetter,
    ReplayIntoDeadLetter,
)
from broker.models import Queue, QueueKind, ReplayJob, ReplaySource
from broker.rules import parse

MAX_VELOCITY = 1_000_000
MAX_TEXT_FILTER = 1000


@dataclass(frozen=True)
class MessageSelection:
    """Which messages a job takes (a replay its sources, an archive count
    what it holds): on these queues (for a dead-letter queue, the queues they
    were dead-lettered from), with this dead-letter reason, published in
    [since, until), with header ``name=value``, with this text in their
    payload. Empty parts take everything."""

    queues: tuple[str, ...] = ()
    reason: str = ""
    since: datetime | None = None
    until: datetime | None = None
    header: str = ""
    payload_text: str = ""

    def stored(self) -> dict[str, Any]:
        values = asdict(self)
        values["queues"] = list(self.queues)
        for key in ("since", "until"):
            values[key] = values[key].isoformat() if values[key] else None
        return {key: value for key, value in values.items() if value}

    @classmethod
    def from_stored(cls, values: dict[str, Any]) -> MessageSelection:
        return cls(
            queues=tuple(values.get("queues", ())),
            reason=values.get("reason", ""),
            since=datetime.fromisoformat(values["since"]) if values.get("since") else None,
            until=datetime.fromisoformat(values["until"]) if values.get("until") else None,
            header=values.get("header", ""),
            payload_text=values.get("payload_text", ""),
        )

    @property
    def header_pair(self) -> tuple[str, str] | None:
        if not self.header:
            return None
        name, _, value = self.header.partition("=")
        return name.strip(), value


@dataclass(frozen=True)
class ScheduleLimits:
    """What a replay schedule's job leaves alone besides its filter: sources
    that entered their state at or after ``entered_before`` (the cool-off),
    whose generation reached ``generation_below`` (given up), or that a
    schedule's job copied before."""

    entered_before: datetime
    generation_below: int


@dataclass(frozen=True)
class ReplaySpec:
    """What a replay job does; see ReplayJob."""

    source: str
    source_queue: str = ""
    filter: MessageSelection = field(default_factory=MessageSelection)
    target_queue: str = ""
    rules_text: str = ""
    velocity: int | None = None
    dry_run: bool = False
    limits: ScheduleLimits | None = None

    @classmethod
    def of(cls, job: ReplayJob) -> ReplaySpec:
        limits = None
        if job.entered_before is not None and job.generation_below is not None:
            limits = ScheduleLimits(job.entered_before, job.generation_below)
        return cls(
            source=job.source,
            source_queue=job.source_queue,
            filter=MessageSelection.from_stored(job.filters),
            target_queue=job.target_queue,
            rules_text=job.rules_text,
            velocity=job.velocity,
            dry_run=job.dry_run,
            limits=limits,
        )


NO_QUEUE = "There is no queue named"

# How a job is refused, the first of these that one of its problems calls
# for (any other problem calls for InvalidInput): its own faults first (400
# in the API), then queues it names that are not there (404), then queues of
# the wrong kind (409). The field errors list every problem, whatever the
# refusal.
REFUSALS: tuple[type[InvalidInput], ...] = (
    InvalidInput,
    NamesNothing,
    QueueIsNotDeadLetter,
    ReplayIntoDeadLetter,
)


def _queue_problems(spec: ReplaySpec) -> dict[str, tuple[type[InvalidInput], str]]:
    """What is wrong with the queues ``spec`` names, by field: the refusal
    each problem calls for, and the problem."""
    problems: dict[str, tuple[type[InvalidInput], str]] = {}
    names = {spec.source_queue, spec.target_queue, *spec.filter.queues} - {""}
    queues = {queue.name: queue for queue in Queue.objects.filter(name__in=names)}
    if spec.source == ReplaySource.DEAD_LETTER:
        source = queues.get(spec.source_queue)
        if not spec.source_queue:
            problems["source_queue"] = (InvalidInput, "Name the dead-letter queue to replay from.")
        elif source is None:
            problems["source_queue"] = (NamesNothing, f"{NO_QUEUE} {spec.source_queue!r}.")
        elif source.kind != QueueKind.DEAD_LETTER:
            problems["source_queue"] = (
                QueueIsNotDeadLetter,
                f"{spec.source_queue} is not a dead-letter queue.",
            )
    elif spec.source_queue:
        problems["source_queue"] = (InvalidInput, "Only a dead-letter source names a source queue.")
    unknown = sorted(set(spec.filter.queues) - set(queues))
    if unknown:
        problems["queues"] = (NamesNothing, f"{NO_QUEUE} {', '.join(map(repr, unknown))}.")
    if spec.target_queue:
        target = queues.get(spec.target_queue)
        if target is None:
            problems["target_queue"] = (NamesNothing, f"{NO_QUEUE} {spec.target_queue!r}.")
        elif target.kind == QueueKind.DEAD_LETTER:
            problems["target_queue"] = (
                ReplayIntoDeadLetter,
                f"{spec.target_queue} is a dead-letter queue; replay to a queue that delivers.",
            )
    return problems


def window_problem(since: datetime | None, until: datetime | None) -> str | None:
    """What the console and the command say of a time window that ends
    before it starts. The API takes such a window as it is: it selects no
    message (the schema cannot state a rule between two fields, and a
    client generated from it would be refused what it says is valid)."""
    if since and until and until <= since:
        return "The time range ends before it starts."
    return None


def replay_validate(spec: ReplaySpec) -> None:
    """Refuse a job that cannot run as asked, with every problem by field:
    InvalidInput, or where every problem is a queue it names, NamesNothing
    for one that is not there and else a Conflict for one of the wrong kind
    (QueueIsNotDeadLetter, ReplayIntoDeadLetter; REFUSALS)."""
    errors: dict[str, list[str]] = {}
    if spec.source not in ReplaySource.values:
        errors["source"] = [f"Choose one of {', '.join(ReplaySource.values)}."]
    queue_problems = _queue_problems(spec)
    errors.update({name: [problem] for name, (_, problem) in queue_problems.items()})
    window = spec.filter
    pair = window.header_pair
    if pair is not None and (not pair[0] or "=" not in window.header):
        errors["header"] = ["Write the header filter as name=value."]
    for name, value in (("payload_text", window.payload_text), ("reason", window.reason)):
        if len(value) > MAX_TEXT_FILTER:
            errors[name] = [f"At most {MAX_TEXT_FILTER} characters."]
    if spec.velocity is not None and not 1 <= spec.velocity <= MAX_VELOCITY:
        errors["velocity"] = [
            f"Give from 1 to {MAX_VELOCITY:,} messages per second, or leave it empty for no limit."
        ]
    if spec.rules_text.strip():
        result = parse(spec.rules_text)
        if result.errors:
            errors["rules_text"] = [
                f"line {error.line}, column {error.column}: {error.message}"
                for error in result.errors
            ]
    if not errors:
        return
    refusals = {
        queue_problems[name][0] if name in queue_problems else InvalidInput for name in errors
    }
    refusal = next(kind for kind in REFUSALS if kind in refusals)
    raise refusal(_refusal_detail(refusal, spec), field_errors=errors)


def _refusal_detail(refusal: type[InvalidInput], spec: ReplaySpec) -> str:
    if refusal is NamesNothing:
        return "The replay job names queues that are not there."
    if refusal is QueueIsNotDeadLetter:
        return (
            f"{spec.source_queue} is not a dead-letter queue; a dead-letter replay reads "
            "the messages of a dead-letter queue."
        )
    if refusal is ReplayIntoDeadLetter:
        return (
            f"{spec.target_queue} is a dead-letter queue; messages arrive there only by "
            "dead-lettering. Replay to a queue that delivers."
        )
    return "The replay job is not valid."


def replay_spec_parse(
    *,
    source: str,
    source_queue: str = "",
    queues: Iterable[str] = (),
    reason: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    header: str = "",
    payload_text: str = "",
    target_queue: str = "",
    rules_text: str = "",
    velocity: int | None = None,
    dry_run: bool = False,
) -> ReplaySpec:
    """The replay job these values describe, checked whole: InvalidInput
    names every problem by field (the field names of ReplaySpec and of
    MessageSelection), as a submission would. The console form, the API and
    the command each read their input into these values and show the errors
    their own way."""
    spec = ReplaySpec(
        source=source,
        source_queue=source_queue,
        filter=MessageSelection(
            queues=tuple(queues),
            reason=reason,
            since=since,
            until=until,
            header=header,
            payload_text=payload_text,
        ),
        target_queue=target_queue,
        rules_text=rules_text,
        velocity=velocity,
        dry_run=dry_run,
    )
    replay_validate(spec)
    return spec
