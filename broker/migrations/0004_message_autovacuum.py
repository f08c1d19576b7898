"""Vacuum the message table early.

Every message is updated at least twice (claimed, then settled), so dead
tuples and dead index entries pile up fast; with the default thresholds
(20 % of the table) a big table waits long for autovacuum and every claim and
ack walks the dead entries meanwhile. Vacuuming at 2 % keeps the hot indexes
lean.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("broker", "0003_system_dead_letter_queue")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE broker_message SET (autovacuum_vacuum_scale_factor = 0.02,"
            " autovacuum_analyze_scale_factor = 0.02)",
            "ALTER TABLE broker_message RESET (autovacuum_vacuum_scale_factor,"
            " autovacuum_analyze_scale_factor)",
        )
    ]
