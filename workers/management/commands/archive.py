"""The message archive from the command line: run the archive job (Spark)
now, or search what it holds."""

from __future__ import annotations

import argparse
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from broker.pipeline.archive_reads import MAX_RESULTS, archive_search
from broker.pipeline.selectors import ArchivedMessage
from workers import pipeline
from workers.management.commands.replay import invalid_text, moment_option, table
from workers.progress import Progress

PAYLOAD_PREVIEW = 60


class Command(BaseCommand):
    help = "Run the archive job (Spark) and search the archive."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        run = commands.add_parser(
            "run",
            help="move delivered and failed messages past their retention to Parquet, now",
        )
        run.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="a progress bar on stderr (default: when stderr is a terminal)",
        )
        search = commands.add_parser("search", help="archived messages of a queue, newest first")
        search.add_argument("--queue", required=True)
        search.add_argument("--since", metavar="ISO", help="published at or after")
        search.add_argument("--until", metavar="ISO", help="published before")
        search.add_argument("--before", type=int, metavar="ID", help="ids below ID (next page)")
        search.add_argument("--limit", type=int, default=50, help=f"1 to {MAX_RESULTS}")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, f"_{action}")(**options)

    def _run(self, *, progress: bool | None, **options: Any) -> None:
        with Progress(self.stderr, what="archived", show=progress) as bar:
            code = pipeline.archive_launch(watch=bar.archived)
        if code < 0:
            raise CommandError(
                f"the archive job failed: its Spark driver was killed by signal "
                f"{signal.Signals(-code).name}"
            )
        if code:
            raise CommandError(
                f"the archive job failed: its Spark driver exited with status {code}"
            )
        self.stdout.write("archive run finished")

    def _search(
        self,
        *,
        queue: str,
        since: str | None,
        until: str | None,
        before: int | None,
        limit: int,
        **options: Any,
    ) -> None:
        problems: dict[str, list[str]] = {}
        start = moment_option(since, "since", problems)
        end = moment_option(until, "until", problems)
        if not 1 <= limit <= MAX_RESULTS:
            problems["limit"] = [f"Give 1 to {MAX_RESULTS}."]
        if problems:
            raise CommandError(invalid_text("The search is not valid.", problems))
        rows = archive_search(queue=queue, since=start, until=end, before_id=before, limit=limit)
        if not rows:
            self.stdout.write(f"no archived messages of {queue} in that range")
            return
        cells = [
            [
                str(row.id),
                row.state,
                timezone.localtime(row.created_at).isoformat(timespec="seconds"),
                "-" if row.payload is None else str(len(row.payload)),
                (row.dead_letter or {}).get("reason") or "-",
                _preview(row),
            ]
            for row in rows
        ]
        header = ["ID", "STATE", "PUBLISHED", "BYTES", "REASON", "PAYLOAD"]
        for line in table(header, cells, right={0, 3}):
            self.stdout.write(line)
        if len(rows) == limit:
            self.stdout.write(f"more: --before {rows[-1].id}")


def _preview(row: ArchivedMessage) -> str:
    if row.payload is None:
        return "(not retained)"
    head = row.payload[: PAYLOAD_PREVIEW * 4]
    text = " ".join(head.decode(errors="replace").split())
    cut = len(text) > PAYLOAD_PREVIEW or len(row.payload) > len(head)
    return text[:PAYLOAD_PREVIEW] + ("…" if cut else "")
