"""PGMQ, as bench/peers.py runs it (in var/peers-venv).

``prepare`` installs the SQL-only PGMQ that the ``pgmq`` package ships
(``install_pgmq_from_sql``: no extension needed on the server), creates the
queue and sends the messages with ``send_batch``, 1000 a call. ``work`` is a
no-op consumer with the package's synchronous client: ``read`` of B messages
(one transaction), then their acknowledgement (a second one), until a read
returns nothing. The acknowledgement is ``--mode archive``: PGMQ's
``archive``, which deletes the messages from the queue table and inserts
them, payload and all, into the queue's archive table (``pgmq.a_bench``); or
``--mode delete``: PGMQ's ``delete``, which keeps nothing.
"""

from __future__ import annotations

from pgmq import PGMQueue, install_pgmq_from_sql  # type: ignore[import-not-found]

from bench._peer_worker import QUEUE, Commands, Tally, chunks, payload, run_command, wait_for_go

PRELOAD_BATCH = 1000
# Long enough that no message reappears while the bench runs: each is read once.
VISIBILITY_SECONDS = 3600
MODES = ("archive", "delete")


def client(url: str) -> PGMQueue:
    return PGMQueue(conn_string=url, pool_size=1, init_extension=False)


def prepare(url: str, messages: int, size: int) -> None:
    install_pgmq_from_sql(dsn=url)
    queue = client(url)
    try:
        queue.create_queue(QUEUE)
        body = {"payload": payload(size)}
        for count in chunks(messages, PRELOAD_BATCH):
            queue.send_batch(QUEUE, [body] * count)
    finally:
        queue.close()


def work(url: str, batch: int, mode: str) -> None:
    if mode not in MODES:
        raise SystemExit(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    queue = client(url)
    acknowledge = queue.archive_batch if mode == "archive" else queue.delete_batch
    tally = Tally()
    wait_for_go()
    while True:
        tally.before_fetch()
        messages = queue.read_batch(QUEUE, vt=VISIBILITY_SECONDS, batch_size=batch)
        tally.fetched(len(messages))
        if not messages:
            break
        done = acknowledge(QUEUE, [message.msg_id for message in messages])
        if len(done) != len(messages):
            raise SystemExit(f"read {len(messages)} messages but {mode}d {len(done)}")
        tally.ack(len(done))
    queue.close()
    tally.report()


def main() -> None:
    run_command(__doc__, Commands(prepare, work))


if __name__ == "__main__":
    main()
