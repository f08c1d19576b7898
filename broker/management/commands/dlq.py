"""Dead-letter queue rules tables from the command line, as runmqdlq users
expect: validate a table, import or export one, run the handler."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from broker.management.verbs import VerbCommand
from broker.rules import export, parse, validation_report
from broker.selectors import active_rule_table, rule_table_version
from broker.services.dead_letters import (
    ScanResult,
    active_table,
    dead_letter_next_due,
    dead_letter_scan,
)
from broker.services.queues import queue_get
from broker.services.rule_tables import rule_table_create, rule_table_create_and_activate

IDLE_POLL_SECONDS = 1.0


class Command(VerbCommand):
    verb_option = "action"
    help = "Validate, import, export and run dead-letter rules tables (runmqdlq syntax)."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        validate = commands.add_parser("validate", help="check a rules table file")
        validate.add_argument("file", type=Path)
        validate.add_argument(
            "--json", dest="as_json", action="store_true", help="print the parse as JSON"
        )
        load = commands.add_parser("import", help="store a file as a new draft version")
        load.add_argument("file", type=Path)
        load.add_argument("--queue", required=True)
        load.add_argument("--activate", action="store_true", help="activate it at once")
        dump = commands.add_parser("export", help="print a queue's rules table")
        dump.add_argument("--queue", required=True)
        dump.add_argument("--version", type=int, help="default: the active version")
        run = commands.add_parser("run", help="process a dead-letter queue by its active table")
        run.add_argument("--queue", required=True)
        run.add_argument("--once", action="store_true", help="one scan, then stop")

    def _read(self, file: Path) -> str:
        try:
            return file.read_text()
        except OSError as error:
            raise CommandError(f"cannot read {file}: {error.strerror}") from None

    def _validate(self, *, file: Path, as_json: bool = False, **options: Any) -> None:
        """Exit 0 when the table is valid, 1 with its errors otherwise;
        warnings are printed either way."""
        report = validation_report(self._read(file), instance=settings.LAZARETTO_INSTANCE_NAME)
        if as_json:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for error in report["errors"]:
                self.stderr.write(f"{file}:{error['line']}:{error['column']}: {error['message']}")
            for warning in report["warnings"]:
                self.stderr.write(
                    f"{file}:{warning['line']}:{warning['column']}: warning: {warning['message']}"
                )
            if report["valid"]:
                self.stdout.write(f"{file}: valid, {len(report['rules'])} rule(s)")
        if not report["valid"]:
            raise SystemExit(1)

    def _import(self, *, file: Path, queue: str, activate: bool = False, **options: Any) -> None:
        target, text = queue_get(name=queue), self._read(file)
        if activate:
            table = rule_table_create_and_activate(queue=target, text=text)
            self.stdout.write(f"{queue}: stored version {table.version}; it is active")
        else:
            table = rule_table_create(queue=target, text=text)
            self.stdout.write(f"{queue}: stored version {table.version} as a draft")

    def _export(self, *, queue: str, version: int | None = None, **options: Any) -> None:
        source = queue_get(name=queue)
        table = (
            rule_table_version(queue=source, version=version)
            if version
            else active_rule_table(queue=source)
        )
        if table is None:
            raise CommandError(f"{queue} has no active rules table")
        parsed = parse(table.text).table
        self.stdout.write(export(parsed) if parsed else table.text, ending="")

    def _run(self, *, queue: str, once: bool = False, **options: Any) -> None:
        """Scan, re-reading the active table every time (activating a new
        version needs no restart), until the table's WAIT says to stop:
        WAIT(NO) when nothing is left that a rule could still act on,
        WAIT(n) after n seconds of that, WAIT(YES) never. Messages whose
        action failed are scanned again when RETRYINT makes them due."""
        dead_letter_queue = queue_get(name=queue)
        idle_since = time.monotonic()
        while True:
            result = dead_letter_scan(queue=dead_letter_queue)
            self._report(queue, result)
            if once:
                return
            active = active_table(dead_letter_queue)
            wait = active[1].control.wait if active else True
            next_due = None if wait is True else dead_letter_next_due(queue=dead_letter_queue)
            if result.acted or next_due is not None:
                idle_since = time.monotonic()
            elif wait is False or (wait is not True and time.monotonic() - idle_since >= wait):
                return
            time.sleep(_pause(next_due))

    def _report(self, queue: str, result: ScanResult) -> None:
        if result.examined:
            self.stdout.write(
                f"{queue}: examined {result.examined}, retried {result.retried}, "
                f"forwarded {result.forwarded}, discarded {result.discarded}, "
                f"ignored {result.ignored}, failed {result.failed}, "
                f"without header {result.without_header}"
            )


def _pause(next_due: datetime | None) -> float:
    """Until the next message is due, polling at least every IDLE_POLL_SECONDS."""
    if next_due is None:
        return IDLE_POLL_SECONDS
    return max(0.05, min(IDLE_POLL_SECONDS, (next_due - timezone.now()).total_seconds()))
