"""Messages to and from files: ``messages export`` writes what a filter
selects as JSON Lines or CSV (to a file or stdout, streamed), ``messages
import QUEUE FILE`` publishes a JSON Lines file's messages to a queue, all
or nothing (``--partial``: the good lines, the bad ones listed)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from broker.management.verbs import VerbCommand
from broker.models import MessageState
from broker.selectors import MessageFilter
from broker.services.transfer import FORMATS, ImportInvalid, messages_export, messages_import

VIA = "manage.py messages"


def _time(text: str) -> datetime:
    moment = parse_datetime(text)
    if moment is None or moment.tzinfo is None:
        raise ValueError(f"not an ISO 8601 time with its offset: {text!r}")
    return moment


class Command(VerbCommand):
    help = "Export messages as JSON Lines or CSV; import a JSON Lines file into a queue."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        export = verbs.add_parser("export", help="write the messages a filter selects")
        export.add_argument("--format", dest="export_format", choices=sorted(FORMATS))
        export.add_argument("--output", type=Path, help="a file; default: stdout")
        export.add_argument("--queue", default="")
        export.add_argument("--state", default="", choices=["", *MessageState.values])
        export.add_argument("--reason", default="", help="the dead-letter header's reason")
        export.add_argument("--since", type=_time, help="published at or after (ISO 8601)")
        export.add_argument("--until", type=_time, help="published before (ISO 8601)")
        export.add_argument("--header", default="", help="name=value")
        export.add_argument("--text", default="", help="the payload contains")
        load = verbs.add_parser("import", help="publish a JSON Lines file's messages")
        load.add_argument("queue")
        load.add_argument("file", type=Path)
        load.add_argument(
            "--partial", action="store_true", help="write the good lines, list the bad ones"
        )

    def _export(
        self,
        *,
        export_format: str | None,
        output: Path | None,
        **options: Any,
    ) -> None:
        if options["header"] and "=" not in options["header"]:
            raise CommandError("--header: write it as name=value")
        fields = ("queue", "state", "reason", "since", "until", "header", "text")
        filters = MessageFilter(**{name: options[name] for name in fields})
        chosen = export_format or ("csv" if output and output.suffix == ".csv" else "jsonl")
        chunks = messages_export(filters=filters, export_format=chosen, actor=None, via=VIA)
        if output is None:
            for chunk in chunks:
                self.stdout.write(chunk, ending="")
            return
        try:
            with output.open("w", newline="") as out:
                for chunk in chunks:
                    out.write(chunk)
        except OSError as error:
            raise CommandError(f"cannot write {output}: {error.strerror}") from None

    def _import(self, *, queue: str, file: Path, partial: bool = False, **options: Any) -> None:
        try:
            with file.open("rb") as lines:
                result = messages_import(
                    queue_name=queue, lines=lines, actor=None, via=VIA, partial=partial
                )
        except OSError as error:
            raise CommandError(f"cannot read {file}: {error.strerror}") from None
        except ImportInvalid as invalid:
            for bad in invalid.errors:
                self.stderr.write(f"{file}:{bad.line}: {bad.problem}")
            raise CommandError(invalid.detail) from None
        for bad in result.errors:
            self.stderr.write(f"{file}:{bad.line}: skipped: {bad.problem}")
        skipped = f", skipped {len(result.errors)} bad line(s)" if result.errors else ""
        self.stdout.write(f"{queue}: imported {len(result.ids)} message(s){skipped}")
