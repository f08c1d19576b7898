"""Archive throughput: delivered messages past their retention moved from
PostgreSQL to Parquet by the archive's Spark job, in rows per second.

Afterwards PostgreSQL must hold none of the messages and the Parquet files
under a temporary ARCHIVE_DIR every one, once, or the bench fails.
"""

from __future__ import annotations

import base64
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import _harness as harness
from bench import _spark
from bench._loaders import age_delivered, copy_batch

QUEUE = "BENCH.ARCHIVE.DONE"
AGE_DAYS = 10
SETUP_BATCH = 10_000
CONTENT_TYPE = "application/octet-stream"

LEFT_SQL = """
SELECT (SELECT count(*) FROM broker_message WHERE queue_id = %(queue)s),
       (SELECT sum(count) FROM broker_queuedepth_current WHERE queue_id = %(queue)s)
"""
CHUNKS_SQL = """
SELECT name, status, rows, created_at, deleted_at FROM broker_archivechunk ORDER BY id
"""


@dataclass(frozen=True)
class Options:
    messages: int
    size: int
    chunk_rows: int | None
    partitions: int | None


@dataclass(frozen=True)
class Chunk:
    name: str
    rows: int
    # Seconds from the launch: written, read back and recorded; deleted from PostgreSQL.
    written: float
    deleted: float


@dataclass(frozen=True)
class Figures(harness.Rated):
    messages: int
    seconds: float
    # Launch to the first JDBC connection (its backend_start); None if unseen.
    startup: float | None
    chunks: list[Chunk]
    parquet_files: int
    parquet_bytes: int
    db_seconds: dict[str, float]
    longest_seconds: dict[str, float]
    config: dict[str, Any]

    @property
    def rate_after_startup(self) -> float | None:
        if self.startup is None:
            return None
        return self.messages / (self.seconds - self.startup)


def parse_args(argv: Sequence[str] | None) -> Options:
    options = harness.parser(
        __doc__,
        messages=harness.messages(200_000, "messages due"),
        size=harness.SIZE,
        chunk_rows=(harness.positive_int, None, "LAZARETTO_ARCHIVE_CHUNK_ROWS for the driver"),
        partitions=_spark.PARTITIONS,
    )
    return Options(**vars(options.parse_args(argv)))


# --- setup --------------------------------------------------------------------------


def random_payloads(count: int, size: int) -> list[bytes]:
    """A different incompressible payload per message, so Parquet's
    dictionary and compression get no help a real payload would not give."""
    return [base64.b64encode(os.urandom(size))[:size] for _ in range(count)]


def deliver_old(bench_url: str, options: Options) -> tuple[int, list[int]]:
    """N messages DLVD on QUEUE, published AGE_DAYS days ago: written with the
    COPY writer, then aged and delivered by a loader. Returns the queue's id
    and the messages' ids."""
    from broker.services.publish import NewMessage

    queue = harness.make_queue(QUEUE, options.size)
    started = time.perf_counter()
    with psycopg.connect(bench_url, autocommit=True) as conn:
        for count in harness.batch_sizes(options.messages, SETUP_BATCH):
            messages = [
                NewMessage(payload=payload, content_type=CONTENT_TYPE, headers={"n": "1"})
                for payload in random_payloads(count, options.size)
            ]
            copy_batch(conn, queue.id, messages)
        ids = age_delivered(conn, queue.id, AGE_DAYS)
    if len(ids) != options.messages:
        raise harness.BenchError(f"setup: {len(ids)} of {options.messages} messages delivered")
    harness.log(
        f"setup: {len(ids)} DLVD messages, {AGE_DAYS} days old, in {harness.since(started):.1f}s"
    )
    return queue.id, ids


# --- the timed run ------------------------------------------------------------------------


def classify_archive(application: str, query: str) -> str | None:
    text = query.lstrip().upper()
    if text.startswith("DELETE FROM BROKER_MESSAGE"):
        return "delete"
    if application == _spark.JDBC_APPLICATION:
        return "jdbc_read" if text.startswith("SELECT") else "jdbc_other"
    if text.startswith("SELECT M.ID FROM BROKER_MESSAGE"):
        return "due_ids"
    return None


@dataclass(frozen=True)
class Run:
    seconds: float
    # From the launch: the first JDBC connection's backend_start (None: unseen).
    startup: float | None
    db_seconds: dict[str, float]
    longest_seconds: dict[str, float]
    # The launch, as a Unix time.
    launched: float


def run_archive(bench_url: str) -> Run:
    """Run the archive's driver to its end, watching the database."""
    from workers.pipeline import archive_launch

    sampler = _spark.Sampler(bench_url, classify_archive)
    sampler.start()
    launched = time.time()
    started = time.perf_counter()
    try:
        with _spark.stdout_to_stderr():
            status = archive_launch()
    finally:
        seconds = harness.since(started)
        db_seconds = sampler.stop()
    if status != 0:
        raise harness.BenchError(f"the archive's Spark driver exited with status {status}")
    first_jdbc = sampler.first_jdbc.timestamp() - launched if sampler.first_jdbc else None
    longest = {kind: round(value, 1) for kind, value in sorted(sampler.longest.items())}
    return Run(seconds, first_jdbc, db_seconds, longest, launched)


def chunks_since(bench_url: str, launched: float) -> list[Chunk]:
    with psycopg.connect(bench_url, autocommit=True) as conn:
        rows = conn.execute(CHUNKS_SQL).fetchall()
    chunks = []
    for name, status, count, created, deleted in rows:
        if status != "deleted" or not isinstance(deleted, datetime):
            raise harness.BenchError(f"archive chunk {name} is {status}, not deleted")
        chunks.append(
            Chunk(name, count, created.timestamp() - launched, deleted.timestamp() - launched)
        )
    return chunks


def verify(bench_url: str, queue_id: int, ids: list[int], archive_dir: Path) -> tuple[int, int]:
    """PostgreSQL holds none of the messages (table and depth counters), and
    the Parquet files hold each exactly once. Returns the files and bytes."""
    import pyarrow.dataset as ds

    with psycopg.connect(bench_url, autocommit=True) as conn:
        row = conn.execute(LEFT_SQL, {"queue": queue_id}).fetchone()
    left, depth = row if row else (None, None)
    if left != 0 or depth != 0:
        raise harness.BenchError(
            f"archive: {left} messages left in PostgreSQL, depth counters say {depth}"
        )
    incoming = [path for path in (archive_dir / "_incoming").glob("*") if path.exists()]
    if incoming:
        raise harness.BenchError(f"archive: left in _incoming: {incoming}")
    files = sorted(archive_dir.glob("queue=*/day=*/*.parquet"))
    if not files:
        raise harness.BenchError(f"archive: no Parquet files under {archive_dir}")
    table = ds.dataset([str(path) for path in files], format="parquet").to_table(columns=["id"])
    found = sorted(table.column("id").to_pylist())
    if found != ids:
        raise harness.BenchError(
            f"archive: the Parquet files hold {len(found)} rows ({len(set(found))} distinct) "
            f"for {len(ids)} messages"
        )
    harness.log(
        f"archive: verified 0 left in PostgreSQL, {len(found)} rows in {len(files)} Parquet files"
    )
    return len(files), sum(path.stat().st_size for path in files)


def run_all(options: Options, bench_url: str) -> Figures:
    with tempfile.TemporaryDirectory(prefix="bench-archive-") as directory:
        archive_dir = Path(directory)
        _spark.spark_environment(
            bench_url,
            archive_dir,
            LAZARETTO_SPARK_PARTITIONS=options.partitions,
            LAZARETTO_ARCHIVE_CHUNK_ROWS=options.chunk_rows,
        )
        harness.setup_django(bench_url)
        # No wake-ups here: the archive sends none, so no Redis of its own.
        os.environ.update(_spark.DRIVER_ENV)
        config = _spark.spark_config()
        harness.log(f"spark settings: {config}")
        harness.log(f"setup: {options.messages} delivered messages of {options.size} bytes")
        queue_id, ids = deliver_old(bench_url, options)
        _spark.vacuum(bench_url)
        harness.checkpoint()
        harness.log(f"archive: running the archive's Spark driver over {options.messages} messages")
        run = run_archive(bench_url)
        chunks = chunks_since(bench_url, run.launched)
        files, size = verify(bench_url, queue_id, ids, archive_dir)
    figures = Figures(
        messages=options.messages,
        seconds=run.seconds,
        startup=run.startup,
        chunks=chunks,
        parquet_files=files,
        parquet_bytes=size,
        db_seconds=run.db_seconds,
        longest_seconds=run.longest_seconds,
        config=config,
    )
    harness.log(
        f"archive: {options.messages} archived in {run.seconds:.2f}s; first JDBC connection at "
        f"{run.startup if run.startup is None else round(run.startup, 2)}s; chunks "
        + ", ".join(
            f"{c.rows} written at {c.written:.2f}s, deleted at {c.deleted:.2f}s" for c in chunks
        )
    )
    harness.log(
        f"archive: sampled database time (s): {run.db_seconds}; longest (s): {run.longest_seconds}"
    )
    return figures


# --- report ----------------------------------------------------------------------------------


def summary(options: Options, figures: Figures) -> dict[str, Any]:
    after = figures.rate_after_startup
    return {
        "bench": "archive",
        "messages": options.messages,
        "payload_bytes": options.size,
        "archive_seconds": round(figures.seconds, 2),
        "archived_per_s": round(figures.rate, 1),
        "spark_startup_seconds": None if figures.startup is None else round(figures.startup, 2),
        "spark_startup_clock": "launch to the first JDBC connection's backend_start",
        "archived_per_s_after_startup": None if after is None else round(after, 1),
        "chunks": [
            {
                "rows": chunk.rows,
                "written_at_s": round(chunk.written, 2),
                "deleted_at_s": round(chunk.deleted, 2),
            }
            for chunk in figures.chunks
        ],
        "parquet_files": figures.parquet_files,
        "parquet_bytes": figures.parquet_bytes,
        "spark_db_sampled_seconds": figures.db_seconds,
        "spark_db_longest_statement_seconds": figures.longest_seconds,
        "left_in_postgresql": 0,
        "rows_in_parquet": options.messages,
        "spark": figures.config,
    }


def print_report(options: Options, figures: Figures) -> None:
    print(
        f"archive bench: {options.messages} delivered messages of {options.size} random bytes, "
        f"{AGE_DAYS} days old, moved to Parquet by python -m workers.spark archive"
    )
    config = figures.config
    print(
        f"spark: {config['master']}, {config['partitions']} JDBC partitions, chunks of "
        f"{config['archive_chunk_rows']} rows, fetch {config['fetch_rows']}"
    )
    print()
    print(f"{'':<32} {'seconds':>8} {'rows/s':>9}")
    print(f"{'total (launch to exit)':<32} {figures.seconds:>8.2f} {figures.rate:>9.0f}")
    if figures.startup is not None and figures.rate_after_startup is not None:
        print(f"{'  start-up (to first JDBC conn.)':<32} {figures.startup:>8.2f}")
        print(
            f"{'  after start-up':<32} {figures.seconds - figures.startup:>8.2f} "
            f"{figures.rate_after_startup:>9.0f}"
        )
    previous = figures.startup or 0.0
    for n, chunk in enumerate(figures.chunks, 1):
        print(
            f"  chunk {n}: {chunk.rows} rows, read+write+check {chunk.written - previous:.2f} s, "
            f"delete {chunk.deleted - chunk.written:.2f} s"
        )
        previous = chunk.deleted
    print(
        f"checked: 0 left in PostgreSQL, {options.messages} rows in {figures.parquet_files} "
        f"Parquet files ({figures.parquet_bytes / 1e6:.1f} MB)"
    )
    harness.print_figures(summary(options, figures))


def main(argv: Sequence[str] | None = None) -> int:
    return harness.main(argv, parse_args, run_all, print_report)


if __name__ == "__main__":
    sys.exit(main())
