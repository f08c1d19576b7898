"""VACUUM never truncates the live partition.

A vacuum that finds empty pages at the end of a table gives them back to the
operating system, and takes an ACCESS EXCLUSIVE lock on the table to do it.
The end of broker_message_live empties whenever the backlog drains, so its
vacuums keep doing this; while one waits for that lock, every claim, ack and
publish waits behind it. The pages stay with the partition instead, and the
next messages published fill them again.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("broker", "0011_message_partitions")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE broker_message_live SET (vacuum_truncate = false)",
            "ALTER TABLE broker_message_live RESET (vacuum_truncate)",
        )
    ]
