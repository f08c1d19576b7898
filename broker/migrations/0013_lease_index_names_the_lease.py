"""The index of leases (message_in_flight_idx) holds the messages that have a
lease (lease_deadline IS NOT NULL), the DLNG ones, instead of naming the state.

A message leaves DLNG by key: the ack, a retry or a dead-lettering looks up the
batch's ids. With the index's predicate ``state = 'DLNG'``, the planner could
read the whole index instead, which it believes holds the few messages in
flight; it also holds an entry for every message delivered since the last
VACUUM, and for all of them while a transaction older than their delivery
stays open, which cost a worker 400 ms a batch. A statement that does not say
``lease_deadline IS NOT NULL`` can no longer use the index: the sweeper's
scans say it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("broker", "0012_live_partition_keeps_its_pages")]

    operations = [
        migrations.RemoveIndex(model_name="message", name="message_in_flight_idx"),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(lease_deadline__isnull=False),
                fields=["lease_deadline"],
                name="message_in_flight_idx",
            ),
        ),
    ]
