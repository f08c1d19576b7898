"""Progress bars for the pipeline's commands (tqdm): a replay job's settled
rows against its total, the archive's messages archived, each with its rate.
Shown on the command's stderr, by default only when that is a terminal."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from django.core.management.base import OutputWrapper
from tqdm import tqdm

from broker.models import ReplayJob


class _Raw:
    """An OutputWrapper that writes what tqdm gives it as it is (the wrapper
    would end every write with a newline, breaking tqdm's redraws)."""

    def __init__(self, wrapper: OutputWrapper) -> None:
        self.wrapper = wrapper

    def write(self, text: str) -> None:
        self.wrapper.write(text, ending="")

    def flush(self) -> None:
        self.wrapper.flush()


class Progress:
    """A bar on ``stream``; ``show`` None: only if it is a terminal."""

    def __init__(self, stream: OutputWrapper, *, what: str, show: bool | None) -> None:
        disable = not stream.isatty() if show is None else not show
        self.bar = tqdm(desc=what, unit="msg", file=_Raw(stream), disable=disable)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.bar.close()

    def replay(self, job: ReplayJob) -> None:
        """The job's settled rows of its total, and how they ended."""
        self._show(
            job.settled,
            job.total or None,
            written=job.written,
            skipped=job.skipped,
            failed=job.failed,
        )

    def archived(self, rows: int) -> None:
        self._show(rows, None)

    def _show(self, done: int, total: int | None, **counts: Any) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)
        if counts:
            self.bar.set_postfix(counts, refresh=False)
        self.bar.refresh()
