"""Delivered messages leave the hot table: broker_message becomes a table
partitioned by state.

- broker_message_live holds what the broker still works on: waiting (TBDL),
  in flight (DLNG), blacklisted (NDLV) and failed (FAIL) messages. Every claim
  and every retry updates these rows, so this is where dead tuples come from;
  under sustained load the partition holds about the backlog, whatever has been
  delivered before, and its vacuum stays short and frequent.
- broker_message_delivered holds DLVD messages. The acknowledgement moves a
  row there (PostgreSQL turns the UPDATE of the partition key into a delete
  from one partition and an insert into the other), and nothing updates it
  afterwards: it only grows, until the archive copies old rows to Parquet and
  deletes them.

Nothing that reads or writes messages changes: statements name broker_message
and PostgreSQL routes them, pruning by state where a statement names one (the
claim, the ack, the sweeper's and the blacklist's scans read the live
partition only).

What partitioning asks in return:
- The primary key is (id, state): a unique index of a partitioned table must
  hold the partition key. Ids still come from one sequence.
- The foreign key to broker_queue sits on the live partition only, where
  messages are written: a row the ack moves to the delivered partition is not
  checked again (one lookup and key-share lock of its queue row per delivered
  message). Django deletes a queue's messages itself before the queue.
- FAIL stays live: only the ack moves rows between partitions, so an
  operator's action never races a row moving away.

The depth-counter triggers (0002) and the HA guard (0010) sit on the
partitioned table, so they see every statement as before: an ack's moved
rows are one UPDATE to the statement trigger's transition tables.

The table is rebuilt: the rows are copied under an exclusive lock.
"""

from django.db import migrations

# The live partition is vacuumed after every 1,000 dead rows, unthrottled:
# it is small, and each dead index entry slows the claim that walks past it.
# The delivered partition gets the table's earlier settings (0004), for the
# archive's deletes.
PARTITIONS = """
CREATE TABLE broker_message_live PARTITION OF broker_message_new
    FOR VALUES IN ('TBDL', 'DLNG', 'NDLV', 'FAIL')
    WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
          autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.02);
CREATE TABLE broker_message_delivered PARTITION OF broker_message_new
    FOR VALUES IN ('DLVD')
    WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
"""

PLAIN = """
ALTER TABLE broker_message_new SET (autovacuum_vacuum_scale_factor = 0.02,
                                    autovacuum_analyze_scale_factor = 0.02);
"""


def rebuild(*, partitioned: bool) -> str:
    """SQL that copies broker_message into a new table, partitioned by state or
    plain, and puts the new one in its place with the same indexes, foreign
    key, sequence position and triggers (the depth counters' of 0002 and the
    HA guard of 0010), each read from the catalog before the old table goes."""
    layout = "PARTITION BY LIST (state)" if partitioned else ""
    primary_key = "(id, state)" if partitioned else "(id)"
    foreign_key_on = "broker_message_live" if partitioned else "broker_message"
    return f"""
DO $rebuild$
DECLARE
    index_ddl text[];
    trigger_ddl text[];
    foreign_key text;
    old_sequence text := pg_get_serial_sequence('broker_message', 'id');
    last bigint;
    called boolean;
    ddl text;
BEGIN
    SELECT coalesce(array_agg(pg_get_indexdef(indexrelid) ORDER BY indexrelid), '{{}}')
    INTO index_ddl
    FROM pg_index WHERE indrelid = 'broker_message'::regclass AND NOT indisprimary;
    SELECT coalesce(array_agg(pg_get_triggerdef(oid) ORDER BY tgname), '{{}}')
    INTO trigger_ddl
    FROM pg_trigger WHERE tgrelid = 'broker_message'::regclass AND NOT tgisinternal;
    SELECT conname INTO foreign_key FROM pg_constraint
    WHERE (conrelid = 'broker_message'::regclass
           OR conrelid IN (SELECT relid FROM pg_partition_tree('broker_message')))
    AND contype = 'f' AND confrelid = 'broker_queue'::regclass LIMIT 1;
    EXECUTE format('SELECT last_value, is_called FROM %s', old_sequence) INTO last, called;

    CREATE TABLE broker_message_new (LIKE broker_message INCLUDING ALL EXCLUDING INDEXES)
    {layout};
    {PARTITIONS if partitioned else PLAIN}
    INSERT INTO broker_message_new SELECT * FROM broker_message;
    PERFORM setval(pg_get_serial_sequence('broker_message_new', 'id'), last, called);

    DROP TABLE broker_message;
    ALTER TABLE broker_message_new RENAME TO broker_message;
    ALTER SEQUENCE broker_message_new_id_seq RENAME TO broker_message_id_seq;
    ALTER TABLE broker_message ADD CONSTRAINT broker_message_pkey PRIMARY KEY {primary_key};
    FOREACH ddl IN ARRAY index_ddl || trigger_ddl LOOP
        EXECUTE ddl;
    END LOOP;
    EXECUTE format(
        'ALTER TABLE {foreign_key_on} ADD CONSTRAINT %I FOREIGN KEY (queue_id)'
        ' REFERENCES broker_queue (id) DEFERRABLE INITIALLY DEFERRED',
        foreign_key
    );
END
$rebuild$;
ANALYZE broker_message;
"""


class Migration(migrations.Migration):
    dependencies = [("broker", "0010_ha")]

    operations = [migrations.RunSQL(rebuild(partitioned=True), rebuild(partitioned=False))]
