"""Replay jobs from the command line: submit one (and, with --wait, run it
here in the foreground), show, cancel or run one again, list them."""

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
from broker.models import ReplayJob, ReplayJobStatus, ReplaySource
from broker.pipeline.replay import replay_job_cancel, replay_job_run_again, replay_job_submit
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

# Field names (the replay service's, and the archive search's limit) as the
# options that set them, in the order errors are reported.
OPTIONS = {
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
    help = "Submit, show, cancel and run again replay jobs (Spark)."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        submit = commands.add_parser("submit", help="check and queue a replay job")
        submit.add_argument(
            "--source", required=True, help=f"one of: {', '.join(ReplaySource.values)}"
        )
        submit.add_argument(
            "--source-queue", default="", help="the dead-letter queue to read (source dead_letter)"
        )
        submit.add_argument(
            "--queue",
            dest="queues",
            action="append",
            default=[],
            metavar="QUEUE",
            help="only messages of this queue (of a dead-letter source: dead-lettered from it); "
            "repeat for more",
        )
        submit.add_argument("--reason", default="", help="only this dead-letter reason code")
        submit.add_argument("--since", metavar="ISO", help="only published at or after")
        submit.add_argument("--until", metavar="ISO", help="only published before")
        submit.add_argument(
            "--header", default="", metavar="NAME=VALUE", help="only with this header value"
        )
        submit.add_argument(
            "--payload-text", default="", metavar="TEXT", help="only payloads containing TEXT"
        )
        submit.add_argument(
            "--target-queue", default="", help="default: each message to its original queue"
        )
        submit.add_argument(
            "--rules", type=Path, metavar="FILE", help="a rules table (runmqdlq syntax) to route by"
        )
        submit.add_argument("--velocity", metavar="N", help="at most N messages a second")
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
        source: str,
        source_queue: str,
        queues: list[str],
        reason: str,
        since: str | None,
        until: str | None,
        header: str,
        payload_text: str,
        target_queue: str,
        rules: Path | None,
        velocity: str | None,
        dry_run: bool,
        wait: bool,
        progress: bool | None,
        user: str | None,
        **options: Any,
    ) -> None:
        actor = self._actor(user)
        problems: dict[str, list[str]] = {}
        start = moment_option(since, "since", problems)
        end = moment_option(until, "until", problems)
        if problem := window_problem(start, end):
            problems["until"] = [problem]
        rules_text = self._read(rules) if rules else ""
        per_second = self._velocity(velocity, problems)
        spec: ReplaySpec | None = None
        # The options this command could not read and the parser's
        # objections are listed together.
        try:
            spec = replay_spec_parse(
                source=source,
                source_queue=source_queue,
                queues=queues,
                reason=reason,
                since=start,
                until=end,
                header=header,
                payload_text=payload_text,
                target_queue=target_queue,
                rules_text=rules_text,
                velocity=per_second,
                dry_run=dry_run,
            )
        except InvalidInput as error:
            for name, messages in error.field_errors.items():
                problems.setdefault(name, []).extend(messages)
        if problems or spec is None:
            labels = {"rules_text": f"--rules {rules}"} if rules else None
            raise CommandError(invalid_text("The replay job is not valid.", problems, labels))
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

    def _velocity(self, text: str | None, problems: dict[str, list[str]]) -> int | None:
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            problems.setdefault("velocity", []).append(
                f"{text!r} is not a whole number of messages a second."
            )
            return None


def _source(job: ReplayJob) -> str:
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
