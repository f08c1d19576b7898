"""The bare claim+ack loop as a worker process of bench/peers.py (in .venv).

Each process runs bench.deliver's bare path, ``claim_and_ack`` of
bench._celery: the service's CLAIM_SQL (suspect = false, limit B) in one
transaction, then BARE_ACK_SQL in a second one, on its own autocommit psycopg
connection, until a claim returns nothing. Django is set up only because the statements live in
the service's module; nothing goes through the ORM.
"""

from __future__ import annotations

import argparse
import os
import secrets
from typing import Any

import psycopg

from bench._peer_worker import Tally, wait_for_go


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue-id", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--lease-seconds", type=float, required=True)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    os.environ["DATABASE_URL"] = args.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from bench._celery import claim_and_ack
    from broker.services.delivery import worker_name

    claim: dict[str, Any] = {
        "queue_id": args.queue_id,
        "suspect": False,
        "limit": args.batch,
        "owner": f"{worker_name()}:{secrets.randbits(62) + 1}",
        "lease_seconds": args.lease_seconds,
    }
    tally = Tally()
    with psycopg.connect(args.url, autocommit=True) as conn:
        wait_for_go()
        while True:
            tally.before_fetch()
            delivered = claim_and_ack(conn, claim)
            tally.fetched(delivered)
            if not delivered:
                break
            tally.ack(delivered)
    tally.report()


if __name__ == "__main__":
    main()
