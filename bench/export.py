"""Export: messages/s and peak memory of ``manage.py messages export``
streaming a queue to a file, at a tenth of the messages and at all of them.

Each export runs in its own process, whose peak resident set size
(``ru_maxrss``, read with ``os.wait4``) is its own: flat across the two
sizes means the export holds a chunk, not the whole result.
``python -m bench.export --help`` lists the options.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench import _harness as harness
from bench._loaders import copy_batch

QUEUE = "BENCH.EXPORT"
LOAD_BATCH = 10_000
PAYLOAD_BYTES = 256


def parse_args(argv: Sequence[str] | None) -> int:
    options = harness.parser(__doc__, messages=harness.messages(1_000_000, "at the larger size"))
    return int(options.parse_args(argv).messages)


def load(bench_url: str, queue_id: int, count: int) -> None:
    """``count`` more TBDL messages on the queue, half of them binary."""
    text = harness.make_payload(PAYLOAD_BYTES)
    binary = bytes(range(256)) * (PAYLOAD_BYTES // 256)
    messages = harness.make_messages(text, LOAD_BATCH // 2)
    messages += [
        message.__class__(payload=binary, content_type="application/octet-stream")
        for message in messages
    ]
    with psycopg.connect(bench_url) as conn:
        for size in harness.batch_sizes(count, LOAD_BATCH):
            copy_batch(conn, queue_id, messages[:size])


def export(bench_url: str, expected: int, output: Path) -> dict[str, Any]:
    """One ``manage.py messages export`` in its own process: its rate and
    its peak RSS."""
    env = {**os.environ, **harness.PRODUCTION_ENV, "DATABASE_URL": bench_url}
    command = [sys.executable, "manage.py", "messages", "export", "--queue", QUEUE]
    started = time.perf_counter()
    process = subprocess.Popen(
        [*command, "--output", str(output)], cwd=harness.ROOT, env=env, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    seconds = harness.since(started)
    if status != 0:
        assert process.stderr is not None
        raise harness.BenchError(f"export failed: {process.stderr.read().decode()[-2000:]}")
    with output.open("rb") as lines:
        written = sum(1 for _ in lines)
    if written != expected:
        raise harness.BenchError(f"exported {written} lines, expected {expected}")
    return {
        "messages": expected,
        "seconds": round(seconds, 2),
        "messages_per_s": round(expected / seconds),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "file_mib": round(output.stat().st_size / 2**20, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    total = parse_args(argv)
    sizes = sorted({max(1, total // 10), total})

    def measure(bench_url: str) -> None:
        harness.setup_django(bench_url)
        queue = harness.make_queue(QUEUE, PAYLOAD_BYTES)
        runs, loaded = [], 0
        with tempfile.TemporaryDirectory() as scratch:
            for size in sizes:
                harness.log(f"loading {size - loaded} messages")
                load(bench_url, queue.id, size - loaded)
                loaded = size
                harness.checkpoint()
                harness.log(f"exporting {size} messages")
                runs.append(export(bench_url, size, Path(scratch) / "export.jsonl"))
        report(runs)

    return harness.run_bench(measure)


def report(runs: list[dict[str, Any]]) -> None:
    harness.title(
        "export bench: manage.py messages export --format jsonl to a file, one process a size",
        f"payloads of {PAYLOAD_BYTES} bytes, half text, half binary (base64 in the file)",
    )
    harness.table(
        ["messages", "seconds", "messages/s", "peak RSS MiB", "file MiB"],
        [
            [
                f"{run['messages']:,}",
                f"{run['seconds']:.2f}",
                f"{run['messages_per_s']:,}",
                run["peak_rss_mib"],
                run["file_mib"],
            ]
            for run in runs
        ],
    )
    harness.print_figures({"bench": "export", "runs": runs})


if __name__ == "__main__":
    sys.exit(main())
