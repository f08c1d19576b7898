"""Replay schedules (broker.pipeline.schedules): a saved replay spec whose
firings (django-celery-beat's periodic task) each submit a replay job, and
what a schedule needs of a message.

- broker_message.generation: 0 for a publish, a replay copy's source's + 1.
  A NOT NULL column with a constant default: the partitioned table's catalog
  changes, no row is rewritten.
- broker_message.schedule_replayed_at: set on a source when a schedule's job
  copies it, so that no schedule takes it again; nullable, no default.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0023_job_start_sent"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="generation",
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="message",
            name="schedule_replayed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="replayjob",
            name="entered_before",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="replayjob",
            name="generation_below",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="ReplaySchedule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("dead_letter", "A dead-letter queue"),
                            ("blacklist", "The blacklist (NDLV)"),
                            ("failed", "Failed messages (FAIL)"),
                            ("delivered", "Delivered messages (DLVD)"),
                            ("archive", "The archive"),
                        ],
                        max_length=16,
                    ),
                ),
                ("source_queue", models.CharField(blank=True, max_length=48)),
                ("filters", models.JSONField(blank=True, default=dict)),
                ("target_queue", models.CharField(blank=True, max_length=48)),
                ("rules_text", models.TextField(blank=True)),
                ("velocity", models.PositiveIntegerField(blank=True, null=True)),
                ("cool_off_minutes", models.PositiveIntegerField(default=0)),
                ("give_up_after", models.PositiveSmallIntegerField(default=3)),
                ("last_fired_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("deleted_at", models.DateTimeField(blank=True, null=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "periodic_task",
                    models.OneToOneField(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="replay_schedule",
                        to="django_celery_beat.periodictask",
                    ),
                ),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.AddField(
            model_name="replayjob",
            name="schedule",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="jobs",
                to="broker.replayschedule",
            ),
        ),
        migrations.CreateModel(
            name="ScheduleFiring",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "fired_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("manual", models.BooleanField(default=False)),
                ("skipped", models.CharField(blank=True, max_length=200)),
                (
                    "job",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to="broker.replayjob",
                    ),
                ),
                (
                    "schedule",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="firings",
                        to="broker.replayschedule",
                    ),
                ),
            ],
            options={
                "ordering": ["-id"],
            },
        ),
        migrations.AddConstraint(
            model_name="replayschedule",
            constraint=models.UniqueConstraint(
                condition=models.Q(("deleted_at__isnull", True)),
                fields=("name",),
                name="replay_schedule_name_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="replayschedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("give_up_after__gte", 1)),
                name="replay_schedule_give_up_positive",
            ),
        ),
    ]
