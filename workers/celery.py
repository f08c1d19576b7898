"""The Celery app. Redis carries only wake-ups; the messages themselves live
in PostgreSQL, so losing Redis loses no message.

Queues: ``deliveries`` for delivery tasks, ``control`` for the sweeper and the
dispatcher, so that busy deliveries never delay crash detection. Run one
worker per queue and one beat:

    celery -A workers worker -Q deliveries
    celery -A workers worker -Q control -c 1 -n control@%h
    celery -A workers beat
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("lazaretto")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])
