"""Replay writes copies of messages; the sources stay as they are (a replay
schedule's job stamps them). A copy is a new arrival on its target queue
(TBDL, fresh counters, its source's generation + 1) carrying its replay job
and its source (replay_job_id, replay_source_id), written by one
set-based statement from a replay job's staging rows. Archiving deletes
delivered and failed messages once the archive holds them."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection

from broker.services.transitions.table import Transition, guard

T = Transition

# Columns a replayed message takes from its source; the rest start afresh.
_COPY = "payload, content_type, headers, priority, put_application, put_user"

# Staged rows of one job in (after, upto] whose target queue exists, each
# written as a copy marked with the job and its source. The source must still
# be replayable (hot table) or is carried by the staging row (archive). A
# source staged twice (a Spark task retried after some of its rows were
# loaded) is written once. The caller starts the range past what the job
# wrote before (its mark, ReplayJob.written_upto), and a driver's writes each
# take a range of their own, so no copy of the range is there yet; should one
# be (a second driver of the job), the unique index message_replayed_once_idx
# of broker_message_live refuses the insert as a whole. No ON CONFLICT
# clause: its speculative insertion costs about a fifth of the write.
#
# A replay schedule's job (%(scheduled)s) also stamps each source it copied
# (schedule_replayed_at), so that no schedule takes it again.
_REPLAY_SQL = f"""
WITH written AS (
    INSERT INTO broker_message (queue_id, {_COPY}, dead_letter, state, replay_job_id,
                                replay_source_id, generation, available_at, enqueued_at,
                                created_at, updated_at)
    SELECT t.id, {{columns}},
           CASE WHEN s.keep_header THEN {{dead_letter}} END,
           'TBDL', s.job_id, s.source_id, {{generation}}, now(), now(), now(), now()
    FROM (
        SELECT DISTINCT ON (source_id) * FROM broker_replaystage
        WHERE job_id = %(job)s AND source_id > %(after)s AND source_id <= %(upto)s
        ORDER BY source_id
    ) AS s
    JOIN broker_queue AS t ON t.name = s.target
    {{source_join}}
    RETURNING queue_id, replay_source_id
), stamped AS (
    UPDATE broker_message AS m SET schedule_replayed_at = now()
    FROM written AS w
    WHERE %(scheduled)s AND m.id = w.replay_source_id
      AND m.id > %(after)s AND m.id <= %(upto)s
)
SELECT queue_id, count(*) FROM written GROUP BY queue_id
"""  # noqa: S608
_FROM_HOT_SQL = _REPLAY_SQL.format(
    columns=", ".join(f"m.{column}" for column in _COPY.split(", ")),
    dead_letter="m.dead_letter",
    generation="m.generation + 1",
    # The range again on the message's own key, so its rows come by the
    # primary key's range rather than from a scan of the table.
    source_join=(
        "JOIN broker_message AS m ON m.id = s.source_id "
        "AND m.id > %(after)s AND m.id <= %(upto)s "
        f"JOIN broker_queue AS q ON q.id = m.queue_id AND {guard(T.REPLAY)}"
    ),
)
_FROM_ARCHIVE_SQL = _REPLAY_SQL.format(
    columns=(
        "s.payload, coalesce(s.content_type, 'application/octet-stream'), "
        "coalesce(s.headers, '{}')::jsonb, coalesce(s.priority, 4), "
        "coalesce(s.put_application, ''), coalesce(s.put_user, '')"
    ),
    dead_letter="s.dead_letter::jsonb",
    # The archive keeps no generation: its copies count as first replays.
    generation="1",
    source_join="",
)

_ARCHIVED_SQL = f"""
DELETE FROM broker_message AS m
WHERE m.id = ANY(%(ids)s) AND {guard(T.ARCHIVE)}
"""  # noqa: S608


def messages_replay_staged(
    *, job_id: int, after: int, upto: int, from_archive: bool, scheduled: bool = False
) -> dict[int, int]:
    """Write a copy (TBDL on its staged target, fresh counters, marked with
    the job and its source, one generation on from its source) of each
    message job ``job_id`` staged with a source id in (``after``, ``upto``],
    once each; sources staying as they are, but for the stamp of a
    schedule's job (``scheduled``). A live copy by the job of one of them (a second driver of the job)
    fails the write as a whole with IntegrityError. An internal move: no
    max-messages limit refuses it. Runs in the caller's transaction, which
    stores the job's mark (``broker.pipeline.replay.replay_write_staged``);
    returns the messages written per target queue id."""
    sql = _FROM_ARCHIVE_SQL if from_archive else _FROM_HOT_SQL
    with connection.cursor() as cursor:
        cursor.execute(sql, {"job": job_id, "after": after, "upto": upto, "scheduled": scheduled})
        return dict(cursor.fetchall())


def messages_archived(*, message_ids: Sequence[int]) -> int:
    """DLVD or FAIL -> deleted, for those of ``message_ids`` the archive
    holds (the caller verified it). Returns how many went."""
    with connection.cursor() as cursor:
        cursor.execute(_ARCHIVED_SQL, {"ids": list(message_ids)})
        return cursor.rowcount
