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

from broker.errors import InvalidInput, NamesNothing
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


def _queue_problems(spec: ReplaySpec) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    names = {spec.source_queue, spec.target_queue, *spec.filter.queues} - {""}
    queues = {queue.name: queue for queue in Queue.objects.filter(name__in=names)}
    if spec.source == ReplaySource.DEAD_LETTER:
        source = queues.get(spec.source_queue)
        if not spec.source_queue:
            errors["source_queue"] = ["Name the dead-letter queue to replay from."]
        elif source is None:
            errors["source_queue"] = [f"{NO_QUEUE} {spec.source_queue!r}."]
        elif source.kind != QueueKind.DEAD_LETTER:
            errors["source_queue"] = [f"{spec.source_queue} is not a dead-letter queue."]
    elif spec.source_queue:
        errors["source_queue"] = ["Only a dead-letter source names a source queue."]
    unknown = sorted(set(spec.filter.queues) - set(queues))
    if unknown:
        errors["queues"] = [f"{NO_QUEUE} {', '.join(map(repr, unknown))}."]
    if spec.target_queue:
        target = queues.get(spec.target_queue)
        if target is None:
            errors["target_queue"] = [f"{NO_QUEUE} {spec.target_queue!r}."]
        elif target.kind == QueueKind.DEAD_LETTER:
            errors["target_queue"] = [
                f"{spec.target_queue} is a dead-letter queue; replay to a queue that delivers."
            ]
    return errors


def window_problem(since: datetime | None, until: datetime | None) -> str | None:
    """What the console and the command say of a time window that ends
    before it starts. The API takes such a window as it is: it selects no
    message (the schema cannot state a rule between two fields, and a
    client generated from it would be refused what it says is valid)."""
    if since and until and until <= since:
        return "The time range ends before it starts."
    return None


def replay_validate(spec: ReplaySpec) -> None:
    """Refuse a job that cannot run as asked, with every problem by field."""
    errors: dict[str, list[str]] = {}
    if spec.source not in ReplaySource.values:
        errors["source"] = [f"Choose one of {', '.join(ReplaySource.values)}."]
    errors.update(_queue_problems(spec))
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
    if errors and all(message.startswith(NO_QUEUE) for m in errors.values() for message in m):
        # Only names that name nothing: as a path naming no queue would be.
        raise NamesNothing("The replay job names queues that are not there.", field_errors=errors)
    if errors:
        raise InvalidInput("The replay job is not valid.", field_errors=errors)


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
