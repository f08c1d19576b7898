"""Replay jobs from the command line: submit one (and, with --wait, run it
here in the foreground), show, cancel or run one again, list them; and
replay schedules: create, list, pause, resume, run now and delete them."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from broker.errors import BrokerError, InvalidInput
from broker.models import ReplayJob, ReplayJobStatus, ReplaySchedule, ReplaySource
from broker.pipeline.replay import replay_job_cancel, replay_job_run_again, replay_job_submit
from broker.pipeline.schedules import (
    DEFAULT_GIVE_UP_AFTER,
    SCHEDULE_SOURCES,
    ScheduleSpec,
    Timing,
    latest_job,
    next_firing,
    schedule_create,
    schedule_delete,
    schedule_pause,
    schedule_resume,
    schedule_run_now,
    schedule_validate,
    schedules_all,
    timing_of,
)
from broker.pipeline.selection import (
    MessageSelection,
    ReplaySpec,
    replay_spec_parse,
    window_problem,
)
from broker.pipeline.selectors import replay_job_get, replay_jobs_recent
from broker.services.audit import Actor
from workers import pipeline
from workers.progress import Progress

# Field names (the replay and schedule services', and the archive search's
# limit) as the options that set them, in the order errors are reported.
OPTIONS = {
    "name": "--name",
    "source": "--source",
    "source_queue": "--source-queue",
    "queues": "--queue",
    "reason": "--reason",
    "since": "--since",
    "until": "--until",
    "header": "--header",
    "payload_text": "--payload-text",
    "target_queue": "--target-queue",
    "rules_text": "--rules",
    "velocity": "--velocity",
    "dry_run": "--dry-run",
    "cron": "--cron",
    "time_zone": "--time-zone",
    "every_seconds": "--every",
    "cool_off_minutes": "--cool-off",
    "give_up_after": "--give-up-after",
    "limit": "--limit",
}


def moment_option(text: str | None, name: str, problems: dict[str, list[str]]) -> datetime | None:
    """An ISO 8601 time (local time when it names no offset); a bad one is
    recorded in ``problems`` under ``name``."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        problems.setdefault(name, []).append(
            f"{text!r} is not an ISO 8601 time, such as 2026-05-01T12:00:00Z."
        )
        return None
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def table(header: list[str], rows: list[list[str]], *, right: set[int]) -> list[str]:
    """Columns as wide as their widest cell, those in ``right`` aligned right."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    return [
        "  ".join(
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


def invalid_text(
    detail: str, field_errors: Mapping[str, list[str]], labels: Mapping[str, str] | None = None
) -> str:
    """An error and each of its field errors on a line of its own, named by
    option (or by ``labels``)."""
    names = {**OPTIONS, **(labels or {})}
    fields = [name for name in names if name in field_errors]
    fields += sorted(set(field_errors) - set(names))
    lines = [detail]
    for name in fields:
        lines += [f"  {names.get(name, name)}: {message}" for message in field_errors[name]]
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Submit, show, cancel and run again replay jobs (Spark); keep replay schedules."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        submit = commands.add_parser("submit", help="check and queue a replay job")
        self._add_spec(submit, sources=ReplaySource.values)
        submit.add_argument(
            "--dry-run", action="store_true", help="count and sample; write nothing"
        )
        self._add_wait(submit)
        self._add_user(submit)
        show = commands.add_parser("status", help="show a job: status, progress and counts")
        show.add_argument("job_id", type=int)
        cancel = commands.add_parser("cancel", help="stop a queued or running job")
        cancel.add_argument("job_id", type=int)
        self._add_user(cancel)
        again = commands.add_parser(
            "run",
            help="run a finished, failed or cancelled job again (it writes only what is missing)",
        )
        again.add_argument("job_id", type=int)
        self._add_wait(again)
        self._add_user(again)
        listing = commands.add_parser("list", help="the latest jobs, newest first")
        listing.add_argument("--limit", type=int, default=20)
        self._add_schedule(commands.add_parser("schedule", help="replay schedules"))

    def _add_schedule(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="schedule_action", required=True)
        create = commands.add_parser("create", help="save a replay that runs by the clock")
        create.add_argument("--name", required=True, help="unique among schedules")
        self._add_spec(create, sources=[str(source) for source in SCHEDULE_SOURCES])
        create.add_argument(
            "--cron",
            default="",
            metavar='"M H DOM MON DOW"',
            help="fire at these wall-clock times (five fields, as crontab's)",
        )
        create.add_argument(
            "--time-zone", default="UTC", help="the cron line's time zone (default: UTC)"
        )
        create.add_argument("--every", metavar="SECONDS", help="fire every SECONDS instead")
        create.add_argument(
            "--cool-off",
            default="0",
            metavar="MINUTES",
            help="take only messages dead (blacklisted, failed) for this long (default: 0)",
        )
        create.add_argument(
            "--give-up-after",
            default=str(DEFAULT_GIVE_UP_AFTER),
            metavar="K",
            help="leave a message alone once it has been replayed K times "
            f"(default: {DEFAULT_GIVE_UP_AFTER})",
        )
        create.add_argument("--paused", action="store_true", help="save it paused")
        self._add_user(create)
        commands.add_parser("list", help="every schedule: timing, state, next firing, last job")
        for action, what in (
            ("pause", "stop firing it until resumed"),
            ("resume", "fire it again from its next slot"),
            ("run", "fire it now; prints the job it queued"),
            ("delete", "stop it for good (its jobs stay)"),
        ):
            one = commands.add_parser(action, help=what)
            one.add_argument("schedule", metavar="SCHEDULE", help="its name or id")
            self._add_user(one)

    def _add_spec(self, parser: CommandParser, *, sources: list[str]) -> None:
        """The options of a replay's spec: a job's, a schedule's."""
        parser.add_argument("--source", required=True, help=f"one of: {', '.join(sources)}")
        parser.add_argument(
            "--source-queue", default="", help="the dead-letter queue to read (source dead_letter)"
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            default=[],
            metavar="QUEUE",
            help="only messages of this queue (of a dead-letter source: dead-lettered from it); "
            "repeat for more",
        )
        parser.add_argument("--reason", default="", help="only this dead-letter reason code")
        parser.add_argument("--since", metavar="ISO", help="only published at or after")
        parser.add_argument("--until", metavar="ISO", help="only published before")
        parser.add_argument(
            "--header", default="", metavar="NAME=VALUE", help="only with this header value"
        )
        parser.add_argument(
            "--payload-text", default="", metavar="TEXT", help="only payloads containing TEXT"
        )
        parser.add_argument(
            "--target-queue", default="", help="default: each message to its original queue"
        )
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="a rules table (runmqdlq syntax) to route by"
        )
        parser.add_argument("--velocity", metavar="N", help="at most N messages a second")

    def _add_wait(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--wait",
            action="store_true",
            help="run the job here, in the foreground, and exit non-zero unless it is done",
        )
        parser.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="with --wait, a progress bar on stderr (default: when stderr is a terminal)",
        )

    def _add_user(self, parser: CommandParser) -> None:
        parser.add_argument("--user", metavar="NAME", help="act as this user (default: system)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            getattr(self, f"_{action}")(**options)
        except BrokerError as error:
            raise CommandError(invalid_text(error.detail, error.field_errors)) from None

    # --- the subcommands ---------------------------------------------------------

    def _submit(
        self,
        *,
        dry_run: bool,
        wait: bool,
        progress: bool | None,
        user: str | None,
        **options: Any,
    ) -> None:
        actor = self._actor(user)
        problems: dict[str, list[str]] = {}
        values = self._spec_values(options, problems)
        spec: ReplaySpec | None = None
        # The options this command could not read and the parser's
        # objections are listed together.
        try:
            spec = replay_spec_parse(**values, dry_run=dry_run)
        except InvalidInput as error:
            _merge(problems, error.field_errors)
        if problems or spec is None:
            raise CommandError(
                invalid_text("The replay job is not valid.", problems, _labels(options))
            )
        job = replay_job_submit(spec=spec, actor=actor)
        self.stdout.write(f"replay job {job.id} queued" + (" (dry run)" if job.dry_run else ""))
        if wait:
            self._wait(job.id, actor, progress)

    def _status(self, *, job_id: int, **options: Any) -> None:
        self._show(replay_job_get(job_id=job_id))

    def _cancel(self, *, job_id: int, user: str | None, **options: Any) -> None:
        job = replay_job_cancel(job_id=job_id, actor=self._actor(user))
        if job.status == ReplayJobStatus.CANCELLED:
            self.stdout.write(f"replay job {job.id} cancelled")
        else:
            self.stdout.write(
                f"replay job {job.id}: cancel requested; it stops after its current step "
                "(what it wrote stays written)"
            )

    def _run(
        self,
        *,
        job_id: int,
        wait: bool,
        progress: bool | None,
        user: str | None,
        **options: Any,
    ) -> None:
        actor = self._actor(user)
        job = replay_job_run_again(job_id=job_id, actor=actor)
        self.stdout.write(f"replay job {job.id} queued again")
        if wait:
            self._wait(job.id, actor, progress)

    def _list(self, *, limit: int, **options: Any) -> None:
        if limit < 1:
            raise CommandError("--limit: give 1 or more.")
        jobs = replay_jobs_recent(limit=limit)
        if not jobs:
            self.stdout.write("no replay jobs")
            return
        rows = [
            [
                str(job.id),
                job.status,
                str(job.percent),
                _source(job),
                _target(job),
                "dry run" if job.dry_run else str(job.written),
                timezone.localtime(job.created_at).strftime("%Y-%m-%d %H:%M"),
                _by(job),
            ]
            for job in jobs
        ]
        header = ["ID", "STATUS", "%", "SOURCE", "TARGET", "WRITTEN", "SUBMITTED", "BY"]
        for line in table(header, rows, right={0, 2, 5}):
            self.stdout.write(line)

    # --- replay schedules ----------------------------------------------------------------

    def _schedule(self, *, schedule_action: str, **options: Any) -> None:
        getattr(self, f"_schedule_{schedule_action}")(**options)

    def _schedule_create(
        self,
        *,
        name: str,
        cron: str,
        time_zone: str,
        every: str | None,
        cool_off: str,
        give_up_after: str,
        paused: bool,
        user: str | None,
        **options: Any,
    ) -> None:
        actor = self._actor(user)
        problems: dict[str, list[str]] = {}
        values = self._spec_values(options, problems)
        # An option this command could not read stands in as a valid value,
        # so that the service's objections are only to the others.
        every_seconds = self._whole(every, "every_seconds", "seconds", problems)
        minutes = self._whole(cool_off, "cool_off_minutes", "minutes", problems)
        replays = self._whole(give_up_after, "give_up_after", "replays", problems)
        spec = ScheduleSpec(
            name=name,
            replay=ReplaySpec(
                source=values["source"],
                source_queue=values["source_queue"],
                filter=MessageSelection(
                    queues=tuple(values["queues"]),
                    reason=values["reason"],
                    since=values["since"],
                    until=values["until"],
                    header=values["header"],
                    payload_text=values["payload_text"],
                ),
                target_queue=values["target_queue"],
                rules_text=values["rules_text"],
                velocity=values["velocity"],
            ),
            timing=Timing(
                cron=cron,
                time_zone=time_zone,
                every_seconds=1 if "every_seconds" in problems else every_seconds,
            ),
            cool_off_minutes=0 if minutes is None else minutes,
            give_up_after=DEFAULT_GIVE_UP_AFTER if replays is None else replays,
            enabled=not paused,
        )
        schedule: ReplaySchedule | None = None
        detail = "The replay schedule is not valid."
        try:
            if problems:
                schedule_validate(spec)
            else:
                schedule = schedule_create(spec=spec, actor=actor)
        except InvalidInput as error:  # a name taken is the service's own detail
            if not problems:
                detail = error.detail
            _merge(problems, error.field_errors)
        if schedule is None:
            raise CommandError(invalid_text(detail, problems, _labels(options)))
        self.stdout.write(
            f"replay schedule {schedule.id} ({schedule.name}) created: "
            f"{spec.timing.describe()}, {_next(schedule)}"
        )

    def _schedule_list(self, **options: Any) -> None:
        schedules = schedules_all()
        if not schedules:
            self.stdout.write("no replay schedules")
            return
        rows = [
            [
                str(schedule.id),
                schedule.name,
                _source(schedule),
                timing_of(schedule).describe(),
                "enabled" if schedule.enabled else "paused",
                _when_short(next_firing(schedule)),
                _last_job(schedule),
            ]
            for schedule in schedules
        ]
        header = ["ID", "NAME", "SOURCE", "WHEN", "STATE", "NEXT FIRING", "LAST JOB"]
        for line in table(header, rows, right={0}):
            self.stdout.write(line)

    def _schedule_pause(self, *, schedule: str, user: str | None, **options: Any) -> None:
        paused = schedule_pause(schedule_id=self._schedule_id(schedule), actor=self._actor(user))
        self.stdout.write(f"replay schedule {paused.name} paused")

    def _schedule_resume(self, *, schedule: str, user: str | None, **options: Any) -> None:
        resumed = schedule_resume(schedule_id=self._schedule_id(schedule), actor=self._actor(user))
        self.stdout.write(f"replay schedule {resumed.name} resumed: {_next(resumed)}")

    def _schedule_run(self, *, schedule: str, user: str | None, **options: Any) -> None:
        schedule_id = self._schedule_id(schedule)
        firing = schedule_run_now(schedule_id=schedule_id, actor=self._actor(user))
        self.stdout.write(
            f"replay schedule {firing.schedule.name}: replay job {firing.job_id} queued"
        )

    def _schedule_delete(self, *, schedule: str, user: str | None, **options: Any) -> None:
        deleted = schedule_delete(schedule_id=self._schedule_id(schedule), actor=self._actor(user))
        self.stdout.write(f"replay schedule {deleted.name} deleted (its jobs stay)")

    # --- helpers ---------------------------------------------------------------------

    def _wait(self, job_id: int, actor: Actor, progress: bool | None) -> None:
        """Run the job's Spark driver here, with a progress bar; the exit
        status says whether it ended done. Ctrl-C asks the job to stop."""
        self.stdout.write(f"replay job {job_id} running here (Ctrl-C cancels it)")
        try:
            with Progress(self.stderr, what=f"replay job {job_id}", show=progress) as bar:
                job = pipeline.replay_job_launch(job_id, watch=bar.replay)
                while not job.finished:  # a pipeline worker took it first: follow it
                    time.sleep(1.0)
                    job.refresh_from_db()
                    bar.replay(job)
        except KeyboardInterrupt:
            with contextlib.suppress(BrokerError):  # it ended meanwhile
                replay_job_cancel(job_id=job_id, actor=actor)
            raise CommandError(
                f"interrupted: cancel requested for replay job {job_id}; "
                f"`replay status {job_id}` shows when it stops"
            ) from None
        self._show(job)
        if job.status != ReplayJobStatus.DONE:
            raise CommandError(
                f"replay job {job.id} {job.status}" + (f": {job.error}" if job.error else "")
            )

    def _show(self, job: ReplayJob) -> None:
        lines = [
            (
                "status",
                f"{job.status}, {job.percent}%"
                + (" (cancel requested)" if job.cancel_requested and not job.finished else ""),
            ),
            ("source", _source(job)),
            ("filter", _filter(job) or "everything"),
            ("target", _target(job)),
            (
                "rules",
                f"{len(job.rules_text.splitlines())} line(s)" if job.rules_text.strip() else "none",
            ),
            ("velocity", f"{job.velocity} a second" if job.velocity else "no limit"),
            ("dry run", "yes: it writes nothing" if job.dry_run else "no"),
            (
                "counts",
                f"total {job.total}, read {job.read}, matched {job.matched}, "
                f"written {job.written}, skipped {job.skipped}, failed {job.failed}",
            ),
            ("per target", _counts(job.per_target)),
            ("per rule", _counts(job.per_rule)),
            ("spark app", job.spark_app_id or "-"),
            ("runs", str(job.runs)),
            ("submitted", f"{_when(job.created_at)} by {_by(job)}"),
            ("started", _when(job.started_at)),
            ("finished", _when(job.finished_at)),
            ("error", job.error or "-"),
        ]
        lines += [("sample", json.dumps(item, default=str)) for item in job.sample]
        self.stdout.write(f"replay job {job.id}")
        for label, value in lines:
            self.stdout.write(f"  {label:<11} {value}")

    def _actor(self, username: str | None) -> Actor:
        if username is None:
            return None
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"--user: there is no user named {username!r}.")
        return user

    def _read(self, file: Path) -> str:
        try:
            return file.read_text()
        except OSError as error:
            raise CommandError(f"--rules: cannot read {file}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise CommandError(f"--rules: {file} is not UTF-8 text") from None

    def _spec_values(
        self, options: Mapping[str, Any], problems: dict[str, list[str]]
    ) -> dict[str, Any]:
        """The replay's spec as ``replay_spec_parse`` takes it, from the
        options; those it cannot read are recorded in ``problems``."""
        start = moment_option(options["since"], "since", problems)
        end = moment_option(options["until"], "until", problems)
        if problem := window_problem(start, end):
            problems["until"] = [problem]
        rules: Path | None = options["rules"]
        return {
            "source": options["source"],
            "source_queue": options["source_queue"],
            "queues": options["queues"],
            "reason": options["reason"],
            "since": start,
            "until": end,
            "header": options["header"],
            "payload_text": options["payload_text"],
            "target_queue": options["target_queue"],
            "rules_text": self._read(rules) if rules else "",
            "velocity": self._whole(options["velocity"], "velocity", "messages a second", problems),
        }

    def _whole(
        self, text: str | None, field: str, unit: str, problems: dict[str, list[str]]
    ) -> int | None:
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            problems.setdefault(field, []).append(f"{text!r} is not a whole number of {unit}.")
            return None

    def _schedule_id(self, schedule: str) -> int:
        """The schedule (not deleted) of that name, else of that id."""
        for candidate in schedules_all():
            if candidate.name == schedule:
                return candidate.id
        if schedule.isascii() and schedule.isdigit():
            return int(schedule)
        raise CommandError(f"There is no replay schedule named {schedule!r}.")


def _source(job: ReplayJob | ReplaySchedule) -> str:
    return f"{job.source} {job.source_queue}" if job.source_queue else job.source


def _target(job: ReplayJob) -> str:
    return job.target_queue or "original queues"


def _by(job: ReplayJob) -> str:
    return job.created_by.get_username() if job.created_by else "system"


def _when(moment: datetime | None) -> str:
    return timezone.localtime(moment).isoformat(timespec="seconds") if moment else "-"


def _filter(job: ReplayJob) -> str:
    window = MessageSelection.from_stored(job.filters)
    parts = [f"queues={','.join(window.queues)}"] if window.queues else []
    parts += [
        f"{name}={value.isoformat() if isinstance(value, datetime) else value}"
        for name in ("reason", "since", "until", "header", "payload_text")
        if (value := getattr(window, name))
    ]
    return " ".join(parts)


def _counts(counts: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items()) or "-"


def _merge(problems: dict[str, list[str]], field_errors: Mapping[str, list[str]]) -> None:
    for name, messages in field_errors.items():
        problems.setdefault(name, []).extend(messages)


def _labels(options: Mapping[str, Any]) -> dict[str, str] | None:
    """Errors in the rules table are named by its file."""
    rules = options.get("rules")
    return {"rules_text": f"--rules {rules}"} if rules else None


def _when_short(moment: datetime | None) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M") if moment else "-"


def _next(schedule: ReplaySchedule) -> str:
    moment = next_firing(schedule)
    return "paused" if moment is None else f"next firing {_when(moment)}"


def _last_job(schedule: ReplaySchedule) -> str:
    job = latest_job(schedule)
    if job is None:
        return "-"
    return f"job {job.id}: {job.status}, {job.written} written"
