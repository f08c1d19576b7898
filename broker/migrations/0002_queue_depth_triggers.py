"""Keep broker_queuedepth exact inside every transaction that touches messages.

Why counters and not COUNT(*): the dashboard and the max-messages check need
each queue's depth by state on every request and every publish. Counting
millions of rows (even over a partial index) grows with the backlog; reading
five rows per queue does not.

Each queue gets one counter row per state when it is created. A statement-level
trigger with transition tables turns each INSERT, UPDATE or DELETE of messages
into at most a few counter updates (one per queue and state it changed), so a
1000-row COPY or a 100-row claim costs one small aggregate, not 1000 row
triggers. Counter rows are updated in (queue_id, state) order so two
transactions touching the same counters always lock them in the same order
and cannot deadlock.
"""

from django.db import migrations

STATES = "('TBDL'), ('DLNG'), ('DLVD'), ('NDLV'), ('FAIL')"

FORWARD = f"""
CREATE FUNCTION broker_queue_create_depths() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO broker_queuedepth (queue_id, state, count)
    SELECT NEW.id, s.state, 0 FROM (VALUES {STATES}) AS s(state);
    RETURN NULL;
END
$$;

CREATE TRIGGER broker_queue_create_depths
AFTER INSERT ON broker_queue
FOR EACH ROW EXECUTE FUNCTION broker_queue_create_depths();

INSERT INTO broker_queuedepth (queue_id, state, count)
SELECT q.id, s.state, 0 FROM broker_queue q CROSS JOIN (VALUES {STATES}) AS s(state)
ON CONFLICT DO NOTHING;

CREATE FUNCTION broker_message_count_depth() RETURNS trigger
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

CREATE TRIGGER broker_message_depth_insert
AFTER INSERT ON broker_message REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION broker_message_count_depth();

CREATE TRIGGER broker_message_depth_update
AFTER UPDATE ON broker_message REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION broker_message_count_depth();

CREATE TRIGGER broker_message_depth_delete
AFTER DELETE ON broker_message REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION broker_message_count_depth();
"""

BACKWARD = """
DROP TRIGGER broker_message_depth_delete ON broker_message;
DROP TRIGGER broker_message_depth_update ON broker_message;
DROP TRIGGER broker_message_depth_insert ON broker_message;
DROP FUNCTION broker_message_count_depth();
DROP TRIGGER broker_queue_create_depths ON broker_queue;
DROP FUNCTION broker_queue_create_depths();
"""


class Migration(migrations.Migration):
    dependencies = [("broker", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
