"""The data pipeline: replay jobs, replay schedules and archive chunks."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from broker.models.queues import QUEUE_NAME_MAX_LENGTH


class ReplaySource(models.TextChoices):
    DEAD_LETTER = "dead_letter", "A dead-letter queue"
    BLACKLIST = "blacklist", "The blacklist (NDLV)"
    FAILED = "failed", "Failed messages (FAIL)"
    DELIVERED = "delivered", "Delivered messages (DLVD)"
    ARCHIVE = "archive", "The archive"


class ReplayJobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class ReplaySchedule(models.Model):
    """A saved replay that runs by the clock: each firing submits an ordinary
    replay job of this spec (broker.pipeline.schedules). When it fires is
    its periodic task's (django-celery-beat: a crontab in a time zone, or
    an interval; enabled or paused), which beat reads from PostgreSQL.

    Its jobs take only messages that entered their state at least
    ``cool_off_minutes`` ago, that no schedule's job copied before
    (Message.schedule_replayed_at), and whose generation is below
    ``give_up_after``: a message that keeps failing is replayed that many
    times over its copies, then stays where it is, given up."""

    name = models.CharField(max_length=100)
    source = models.CharField(max_length=16, choices=ReplaySource.choices)
    source_queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    filters = models.JSONField(default=dict, blank=True)
    target_queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    rules_text = models.TextField(blank=True)
    velocity = models.PositiveIntegerField(null=True, blank=True)
    cool_off_minutes = models.PositiveIntegerField(default=0)
    give_up_after = models.PositiveSmallIntegerField(default=3)
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replay_schedule",
    )
    # When beat last fired it (not a run now): a firing of the same slot
    # again (a failover's new primary) is dropped.
    last_fired_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Deleted: it fires no more; its jobs and firings stay.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(deleted_at__isnull=True),
                name="replay_schedule_name_unique",
            ),
            models.CheckConstraint(
                condition=Q(give_up_after__gte=1), name="replay_schedule_give_up_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"replay schedule {self.name}"

    @property
    def enabled(self) -> bool:
        return self.periodic_task is not None and self.periodic_task.enabled


class ReplayJob(models.Model):
    """Dead (or delivered, or archived) messages put back on queues in bulk
    by a Spark job (workers.spark.replay). Each copy carries the job and its
    source (Message.replay_job_id, replay_source_id), and each write of a
    range of sources commits with the job's mark (``written_upto``), so a
    failed or cancelled job may be run again: it writes only what lies past
    the mark."""

    source = models.CharField(max_length=16, choices=ReplaySource.choices)
    # The dead-letter queue read, for source dead_letter.
    source_queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    # queues, reason, since, until (ISO 8601), header ("name=value"),
    # payload_text: broker.pipeline.selection.MessageSelection.
    filters = models.JSONField(default=dict, blank=True)
    # Blank: each message goes back to its original queue.
    target_queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    rules_text = models.TextField(blank=True)
    # At most this many messages written per second; null: as fast as it goes.
    velocity = models.PositiveIntegerField(null=True, blank=True)
    dry_run = models.BooleanField(default=False)
    status = models.CharField(
        max_length=10, choices=ReplayJobStatus.choices, default=ReplayJobStatus.QUEUED
    )
    cancel_requested = models.BooleanField(default=False)
    # Source rows in the job's queues, states and time range when it started.
    total = models.BigIntegerField(default=0)
    read = models.BigIntegerField(default=0)
    matched = models.BigIntegerField(default=0)
    written = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    # {queue name: messages}, {rule number: messages} with "0" for no rule
    # matched (jobs with a rules table only), and for a dry run a few of the
    # messages it would write.
    per_target = models.JSONField(default=dict, blank=True)
    per_rule = models.JSONField(default=dict, blank=True)
    sample = models.JSONField(default=list, blank=True)
    spark_app_id = models.CharField(max_length=100, blank=True)
    driver_pid = models.IntegerField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=0)
    # The job's resume mark: every source message it staged with an id up to
    # this one was written (or found unwritable) by a committed write, which
    # stored the mark in the same transaction. A run writes only sources
    # above it, whatever became of the copies since (delivered, deleted,
    # archived). Runs never lower it.
    written_upto = models.BigIntegerField(default=0)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # The schedule whose firing submitted it, and the limits of its firing:
    # only sources that entered their state before ``entered_before`` (the
    # cool-off), with a generation below ``generation_below`` (the give-up
    # limit), that no schedule's job copied before.
    schedule = models.ForeignKey(
        ReplaySchedule, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    entered_before = models.DateTimeField(null=True, blank=True)
    generation_below = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When its start (a Celery task) was last sent; null: not yet, or Redis
    # refused it (broker.services.job_starts).
    start_sent_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # The driver's last sign of life: a running job silent for long had its
    # driver killed and may be run again.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(velocity__isnull=True) | Q(velocity__gte=1),
                name="replay_job_velocity_positive",
            ),
        ]
        indexes = [
            models.Index(fields=["id"], condition=Q(status="queued"), name="replay_job_queued_idx"),
        ]

    def __str__(self) -> str:
        return f"replay job {self.id} ({self.status})"

    @property
    def settled(self) -> int:
        """Source rows the job is through with: filtered out, written,
        skipped or failed."""
        return self.read - self.matched + self.written + self.skipped + self.failed

    @property
    def percent(self) -> int:
        if self.status == ReplayJobStatus.DONE or not self.total:
            return 100 if self.status == ReplayJobStatus.DONE else 0
        return min(100, round(100 * self.settled / self.total))

    @property
    def finished(self) -> bool:
        return self.status in {
            ReplayJobStatus.DONE,
            ReplayJobStatus.FAILED,
            ReplayJobStatus.CANCELLED,
        }


class ScheduleFiring(models.Model):
    """One firing of a replay schedule: the job it submitted, or why it
    submitted none (``skipped``: the schedule's previous job still ran)."""

    schedule = models.ForeignKey(ReplaySchedule, on_delete=models.CASCADE, related_name="firings")
    fired_at = models.DateTimeField(db_default=Now())
    # Run now by a user rather than by beat.
    manual = models.BooleanField(default=False)
    job = models.ForeignKey(ReplayJob, null=True, blank=True, on_delete=models.SET_NULL)
    skipped = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"firing {self.id} of {self.schedule_id}"


class ArchiveChunkStatus(models.TextChoices):
    WRITTEN = "written", "Written and verified"
    DELETED = "deleted", "Deleted from PostgreSQL"


class ArchiveChunk(models.Model):
    """One step of the archive: a set of messages written to Parquet and
    verified (WRITTEN), then deleted from PostgreSQL (DELETED). A run that
    finds a WRITTEN chunk finishes it before anything else, so a crash
    between write and delete neither loses nor duplicates a message."""

    name = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=8, choices=ArchiveChunkStatus.choices)
    rows = models.PositiveIntegerField()
    first_id = models.BigIntegerField()
    last_id = models.BigIntegerField()
    # Parquet files relative to ARCHIVE_DIR.
    files = models.JSONField(default=list)
    spark_app_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"archive chunk {self.name} ({self.status}, {self.rows} rows)"
