"""The counters take changes by insert: the depth trigger and the per-minute
counts write rows to QueueDepthDelta and QueueCountDelta, which the sweeper
folds into QueueDepth, QueueMinute and QueueTotal (broker.services.counters).

Updating the counter rows in place made every claim, ack and publish of a
queue lock the same few rows until its commit, and leave a row version that
no VACUUM may remove while an older transaction stays open (QueueDepthDelta
says what that cost). Readers read the three ``_current`` views below, which
add the changes not folded yet to the folded rows: exact at any moment, as
the counters were.
"""

import django.db.models.deletion
from django.db import migrations, models

# QueueMinute's and QueueTotal's counters, in column order: a copy of
# broker.services.stats.COUNTERS as it stood, since a migration must not
# change when that list does (a new counter recreates the views in its own).
COUNTERS = (
    "published",
    "delivered",
    "failed",
    "poisoned",
    "handler_errors",
    "crashed",
    "timed_out",
    "dead_lettered",
    "blacklisted",
    "discarded",
)
_SUMS = ", ".join(f"sum({name})::bigint AS {name}" for name in COUNTERS)
_COLUMNS = ", ".join(COUNTERS)
_DELTA_COLUMNS = ", ".join(f"x.{name}" for name in COUNTERS)

FORWARD = f"""
CREATE OR REPLACE FUNCTION broker_message_count_depth() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO broker_queuedepthdelta (queue_id, state, n)
        SELECT queue_id, state, count(*) FROM new_rows GROUP BY queue_id, state;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO broker_queuedepthdelta (queue_id, state, n)
        SELECT queue_id, state, -count(*) FROM old_rows GROUP BY queue_id, state;
    ELSE
        INSERT INTO broker_queuedepthdelta (queue_id, state, n)
        SELECT queue_id, state, sum(n) FROM (
            SELECT queue_id, state, 1 AS n FROM new_rows
            UNION ALL
            SELECT queue_id, state, -1 AS n FROM old_rows
        ) AS changes
        GROUP BY queue_id, state HAVING sum(n) <> 0;
    END IF;
    RETURN NULL;
END
$$;

CREATE VIEW broker_queuedepth_current AS
SELECT d.queue_id, d.state, d.count + coalesce(c.n, 0) AS count
FROM broker_queuedepth AS d
LEFT JOIN (
    SELECT queue_id, state, sum(n)::bigint AS n FROM broker_queuedepthdelta
    GROUP BY queue_id, state
) AS c ON c.queue_id = d.queue_id AND c.state = d.state;

CREATE VIEW broker_queueminute_current AS
SELECT queue_id, minute, {_SUMS} FROM (
    SELECT queue_id, minute, {_COLUMNS} FROM broker_queueminute
    UNION ALL
    SELECT x.queue_id, x.minute, {_DELTA_COLUMNS}
    FROM broker_queuecountdelta AS x JOIN broker_queue AS q ON q.id = x.queue_id
) AS c
GROUP BY queue_id, minute;

CREATE VIEW broker_queuetotal_current AS
SELECT queue_id, {_SUMS} FROM (
    SELECT queue_id, {_COLUMNS} FROM broker_queuetotal
    UNION ALL
    SELECT x.queue_id, {_DELTA_COLUMNS}
    FROM broker_queuecountdelta AS x JOIN broker_queue AS q ON q.id = x.queue_id
) AS c
GROUP BY queue_id;

-- Small tables whose every row is deleted within seconds of its insert:
-- vacuumed after a few thousand deletes, whatever their size.
ALTER TABLE broker_queuedepthdelta SET (autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000, autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000);
ALTER TABLE broker_queuecountdelta SET (autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000, autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000);
"""

# Back to counting in place: fold what is pending, then restore migration
# 0002's trigger function.
BACKWARD = f"""
UPDATE broker_queuedepth AS d SET count = d.count + c.n
FROM (SELECT queue_id, state, sum(n)::bigint AS n FROM broker_queuedepthdelta
      GROUP BY queue_id, state) AS c
WHERE c.queue_id = d.queue_id AND c.state = d.state;

INSERT INTO broker_queueminute AS t (queue_id, minute, {_COLUMNS})
SELECT x.queue_id, x.minute, {", ".join(f"sum(x.{name})" for name in COUNTERS)}
FROM broker_queuecountdelta AS x JOIN broker_queue AS q ON q.id = x.queue_id
GROUP BY x.queue_id, x.minute
ON CONFLICT (queue_id, minute) DO UPDATE
SET {", ".join(f"{name} = t.{name} + EXCLUDED.{name}" for name in COUNTERS)};

INSERT INTO broker_queuetotal AS t (queue_id, {_COLUMNS})
SELECT x.queue_id, {", ".join(f"sum(x.{name})" for name in COUNTERS)}
FROM broker_queuecountdelta AS x JOIN broker_queue AS q ON q.id = x.queue_id
GROUP BY x.queue_id
ON CONFLICT (queue_id) DO UPDATE
SET {", ".join(f"{name} = t.{name} + EXCLUDED.{name}" for name in COUNTERS)};

DROP VIEW broker_queuetotal_current;
DROP VIEW broker_queueminute_current;
DROP VIEW broker_queuedepth_current;

CREATE OR REPLACE FUNCTION broker_message_count_depth() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delta record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        FOR delta IN
            SELECT queue_id, state, count(*) AS n FROM new_rows
            GROUP BY queue_id, state ORDER BY queue_id, state
        LOOP
            UPDATE broker_queuedepth SET count = count + delta.n
            WHERE queue_id = delta.queue_id AND state = delta.state;
        END LOOP;
    ELSIF TG_OP = 'DELETE' THEN
        FOR delta IN
            SELECT queue_id, state, count(*) AS n FROM old_rows
            GROUP BY queue_id, state ORDER BY queue_id, state
        LOOP
            UPDATE broker_queuedepth SET count = count - delta.n
            WHERE queue_id = delta.queue_id AND state = delta.state;
        END LOOP;
    ELSE
        FOR delta IN
            SELECT queue_id, state, sum(n) AS n FROM (
                SELECT queue_id, state, 1 AS n FROM new_rows
                UNION ALL
                SELECT queue_id, state, -1 AS n FROM old_rows
            ) AS changes
            GROUP BY queue_id, state HAVING sum(n) <> 0 ORDER BY queue_id, state
        LOOP
            UPDATE broker_queuedepth SET count = count + delta.n
            WHERE queue_id = delta.queue_id AND state = delta.state;
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("broker", "0013_lease_index_names_the_lease")]

    operations = [
        migrations.CreateModel(
            name="QueueDepthDelta",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("TBDL", "To be delivered"),
                            ("DLNG", "Delivering"),
                            ("DLVD", "Delivered"),
                            ("NDLV", "Not deliverable (blacklisted)"),
                            ("FAIL", "Failed"),
                        ],
                        max_length=4,
                    ),
                ),
                ("n", models.BigIntegerField()),
                (
                    "queue",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="broker.queue",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="QueueCountDelta",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("minute", models.DateTimeField()),
                ("published", models.IntegerField(db_default=0)),
                ("delivered", models.IntegerField(db_default=0)),
                ("failed", models.IntegerField(db_default=0)),
                ("poisoned", models.IntegerField(db_default=0)),
                ("handler_errors", models.IntegerField(db_default=0)),
                ("crashed", models.IntegerField(db_default=0)),
                ("timed_out", models.IntegerField(db_default=0)),
                ("dead_lettered", models.IntegerField(db_default=0)),
                ("blacklisted", models.IntegerField(db_default=0)),
                ("discarded", models.IntegerField(db_default=0)),
                (
                    "queue",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="broker.queue",
                    ),
                ),
            ],
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
