"""The live partition's publishes fill 45 % of a page (fillfactor 45),
leaving the rest for the claim.

A claim writes a new version of each message it takes (TBDL -> DLNG under
a lease). On a full page that version goes to another page, often a new one
at the end of the table, and the WAL record carries the whole row, payload
and all. With room on the row's own page it stays there, and PostgreSQL
logs only the bytes that differ from the old version: the lease columns,
which follow the payload (unless wal_level is logical, which logs whole
rows). With 1 kB payloads this is a quarter of the WAL a delivered message
writes. 55 % of a page leaves room for a claimed version of every row on it,
a little longer than the row with the lease written in, whatever the payload
size (a row longer than about 2 kB keeps its payload out of line, in the
TOAST table). A message waiting in the queue takes about twice the space it
did; what the acknowledgement moves out of the partition is given back to
the next publishes as before.

It applies to the pages written from now on; an existing backlog keeps its
pages as they are.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("broker", "0020_replay_marks_on_copies")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE broker_message_live SET (fillfactor = 45)",
            "ALTER TABLE broker_message_live RESET (fillfactor)",
        )
    ]
