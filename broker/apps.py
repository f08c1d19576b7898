from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate

SYSTEM_DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"


def installation_rows(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """The rows every installation has: the system dead-letter queue and the
    HA pair's row (epoch 1). Migrations 0003 and 0010 insert them; this puts
    them back after ``manage.py flush`` emptied every table (Django sends
    post_migrate after a flush as after a migrate), and does nothing when
    they are there."""
    from broker.models import HaPair, Queue, QueueKind

    Queue.objects.using(using).get_or_create(
        name=SYSTEM_DEAD_LETTER_QUEUE,
        defaults={"kind": QueueKind.DEAD_LETTER, "description": "Messages no consumer could take."},
    )
    HaPair.objects.using(using).get_or_create(id=1, defaults={"epoch": 1, "primary_name": ""})


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
