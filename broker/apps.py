from django.apps import AppConfig
from django.conf import settings


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
