"""``python -m workers.spark replay JOB_ID`` or ``python -m workers.spark
archive``; ``python -m workers.spark standby`` loads what a job needs, then
reads the job's arguments (``replay JOB_ID`` or ``archive``) from a line of
its standard input, and exits at once on an empty one
(``workers.pipeline.Standby``)."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import django

JOBS = ("workers.spark.replay", "workers.spark.archive")


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from workers.spark.session import yield_to_deliveries

    yield_to_deliveries()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if argv == ["standby"]:
        _load()
        argv = sys.stdin.readline().split()
        if not argv:
            return 0
    if len(argv) == 2 and argv[0] == "replay" and argv[1].isdigit():
        from workers.spark.replay import replay_main

        return replay_main(int(argv[1]))
    if argv == ["archive"]:
        from workers.spark.archive import archive_main

        return archive_main()
    print("usage: python -m workers.spark replay JOB_ID | archive | standby", file=sys.stderr)
    return 2


def _load() -> None:
    """Import the jobs and the Spark client their session will use."""
    from django.conf import settings

    for module in JOBS:
        importlib.import_module(module)
    if settings.SPARK_REMOTE:
        importlib.import_module("pyspark.sql.connect.session")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
