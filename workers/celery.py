"""The Celery app. Redis carries only wake-ups; the messages themselves live
in PostgreSQL, so losing Redis loses no message.

Queues: ``deliveries`` for delivery tasks, ``control`` for the sweeper, the
dispatcher and the poison-alarm webhook, so that busy deliveries never delay
crash detection; ``pipeline`` for the Spark jobs (replay, archive), whose
tasks last as long as their job. The control worker runs two processes: only one of them at a
time posts alarms (an advisory lock), so a slow webhook never holds up a
sweep. Run one worker per queue and one beat:

    celery -A workers worker -Q deliveries
    celery -A workers worker -Q control -c 2 -n control@%h
    celery -A workers worker -Q pipeline -c 1 -n pipeline@%h
    celery -A workers beat
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("lazaretto")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])
