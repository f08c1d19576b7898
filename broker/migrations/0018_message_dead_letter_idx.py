"""An index of the messages with a dead-letter header, by queue and reason,
holding what the triage pages group and show (state, enqueued_at and the
header itself), so that grouping a dead-letter queue's hundred thousand
waiting messages, or finding the few of a rare reason, reads the index
alone. A message without a header has no entry: publish, claim and ack
write none."""

import django.db.models.fields.json
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("broker", "0017_queue_depth_minute")]

    operations = [
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                models.F("queue"),
                django.db.models.fields.json.KT("dead_letter__reason"),
                models.F("id"),
                condition=models.Q(dead_letter__isnull=False),
                include=("state", "enqueued_at", "dead_letter"),
                name="message_dead_letter_idx",
            ),
        ),
    ]
