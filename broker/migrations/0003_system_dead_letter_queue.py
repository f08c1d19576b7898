"""Every installation has the system dead-letter queue that standard queues
dead-letter to by default."""

from django.db import migrations

NAME = "SYSTEM.DEAD.LETTER.QUEUE"


def create(apps, schema_editor):
    Queue = apps.get_model("broker", "Queue")
    Queue.objects.get_or_create(
        name=NAME,
        defaults={"kind": "dead_letter", "description": "Messages no consumer could take."},
    )


class Migration(migrations.Migration):
    dependencies = [("broker", "0002_queue_depth_triggers")]

    operations = [migrations.RunPython(create, migrations.RunPython.noop)]
