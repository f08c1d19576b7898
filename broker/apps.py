from typing import Any

from django.apps import AppConfig
from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.conf import settings
from django.db.models.signals import post_migrate

SYSTEM_DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"


def installation_rows(
    sender: AppConfig, using: str = "default", apps: Apps = global_apps, **kwargs: Any
) -> None:
    """The rows every installation has: the system dead-letter queue and the
    HA pair's row (epoch 1). Migrations 0003 and 0010 insert them; this puts
    them back after ``manage.py flush`` emptied every table (Django sends
    post_migrate after a flush as after a migrate), and does nothing when
    they are there. Through ``apps``, the models as the migrations left them:
    after a migration back, today's models name columns not there yet."""
    try:
        queue, pair = apps.get_model("broker", "Queue"), apps.get_model("broker", "HaPair")
    except LookupError:  # migrated back before the tables
        return
    queue.objects.using(using).get_or_create(
        name=SYSTEM_DEAD_LETTER_QUEUE,
        defaults={"kind": "dead_letter", "description": "Messages no consumer could take."},
    )
    pair.objects.using(using).get_or_create(id=1, defaults={"epoch": 1, "primary_name": ""})


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Lazaretto broker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process (web, workers, commands) knows the same handlers: the
        # web process checks a queue's consumer against them, the workers call
        # them.
        from broker.consumers import load_consumer_modules

        load_consumer_modules(settings.LAZARETTO_CONSUMER_MODULES)
        post_migrate.connect(installation_rows, sender=self)
