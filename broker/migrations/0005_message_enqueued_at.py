"""When a message arrived in its current queue, for discard_old. Messages
that exist already all get the migration's time (now() is evaluated once, so
adding the column rewrites no rows); among them ids break the tie, as before."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0004_message_autovacuum"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="message",
            name="message_waiting_idx",
        ),
        migrations.AddField(
            model_name="message",
            name="enqueued_at",
            field=models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("state", "TBDL")),
                fields=["queue", "enqueued_at", "id"],
                name="message_waiting_idx",
            ),
        ),
    ]
