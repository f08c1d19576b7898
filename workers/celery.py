"""The Celery app. Redis carries only wake-ups; the messages themselves live
in PostgreSQL, so losing Redis loses no message."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("lazaretto")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])
