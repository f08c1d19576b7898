"""A replayed copy carries its replay job and its source message
(broker_message.replay_job_id, replay_source_id), and a replay job its resume
mark (broker_replayjob.written_upto), in place of the ledger table
broker_replayedmessage: a copy is one row written, not two.

- The two columns are nullable without a default: adding them to the
  partitioned table changes its catalog only, no row is rewritten.
- No foreign key: a key from the partitioned table to the jobs would be
  checked again for every row the acknowledgement moves between partitions,
  and a source may be archived or deleted long before its copy.
- The job's mark is its idempotency record: a write of a range of sources
  commits with the mark, so a run again writes only what lies above it,
  whatever became of the copies since (delivered, deleted by their queue's
  delivered_retention, archived, purged). Among the live rows, where copies
  are written, a unique index (message_replayed_once_idx, on the live
  partition: a unique index of the partitioned table would have to hold the
  state) keeps a second writer of the same job and source from writing it
  again; the write skips what it holds (ON CONFLICT DO NOTHING).
- message_replay_source_idx (partial: only copies have entries) finds the
  copies of a message for its timeline.

Existing ledgers: each copy still in PostgreSQL gets its job and source from
its ledger row. Each job's mark is the highest source id in its ledger. That
skips no source a job has still to write: every run wrote its ranges of
sources in ascending id order, each range and its ledger rows in one
transaction, skipping only what the ledger held, so at any commit a job's
ledger held every staged source up to its highest entry that could be
written. (Sources below the mark that joined the job's selection after the
run passed them, or could not be written then, are decided: a run again no
longer writes them.) Then the ledger goes.

The reverse builds the ledger again from the copies PostgreSQL still holds.
Copies deleted or archived since have no row to build it from: a job run
again on the earlier version may write their sources a second time.
"""

from django.db import migrations, models

COPY_LEDGERS = """
UPDATE broker_message AS m
SET replay_job_id = r.job_id, replay_source_id = r.source_message_id
FROM broker_replayedmessage AS r
WHERE m.id = r.message_id;
UPDATE broker_replayjob AS j SET written_upto = r.upto
FROM (
    SELECT job_id, max(source_message_id) AS upto FROM broker_replayedmessage GROUP BY job_id
) AS r
WHERE j.id = r.job_id;
"""

# The reverse: the ledger of the copies still here (a copy of a job since
# deleted cannot be recorded: the ledger's key to the job would refuse it).
LEDGERS_FROM_COPIES = """
INSERT INTO broker_replayedmessage (job_id, source_message_id, message_id, created_at)
SELECT m.replay_job_id, m.replay_source_id, m.id, m.created_at
FROM broker_message AS m JOIN broker_replayjob AS j ON j.id = m.replay_job_id
WHERE m.replay_source_id IS NOT NULL
ON CONFLICT DO NOTHING;
"""

# A job writes a source once among the live rows, where copies are
# inserted (TBDL): the replay's INSERT … ON CONFLICT DO NOTHING
# (broker.services.transitions.replayed) skips what this holds.
REPLAYED_ONCE = """
CREATE UNIQUE INDEX message_replayed_once_idx
    ON broker_message_live (replay_job_id, replay_source_id)
    WHERE replay_job_id IS NOT NULL;
"""

# The ledger's HA guard (migration 0010) goes with its table, and comes back
# with it.
LEDGER_GUARD = """
CREATE TRIGGER broker_replayedmessage_ha_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON broker_replayedmessage
    FOR EACH STATEMENT EXECUTE FUNCTION lazaretto_ha_guard('data');
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0019_delivered_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="replay_job_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="message",
            name="replay_source_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="replayjob",
            name="written_upto",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunSQL(COPY_LEDGERS, LEDGERS_FROM_COPIES),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("replay_source_id__isnull", False)),
                fields=["replay_source_id"],
                name="message_replay_source_idx",
            ),
        ),
        migrations.RunSQL(REPLAYED_ONCE, "DROP INDEX message_replayed_once_idx"),
        migrations.RunSQL(
            "DROP TRIGGER broker_replayedmessage_ha_guard ON broker_replayedmessage", LEDGER_GUARD
        ),
        migrations.DeleteModel(
            name="ReplayedMessage",
        ),
    ]
