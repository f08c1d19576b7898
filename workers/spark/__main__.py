"""``python -m workers.spark replay JOB_ID`` or ``python -m workers.spark archive``."""

from __future__ import annotations

import logging
import os
import sys

import django


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if len(argv) == 2 and argv[0] == "replay" and argv[1].isdigit():
        from workers.spark.replay import replay_main

        return replay_main(int(argv[1]))
    if argv == ["archive"]:
        from workers.spark.archive import archive_main

        return archive_main()
    print("usage: python -m workers.spark replay JOB_ID | archive", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
