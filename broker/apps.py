from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Lazaretto broker"
    default_auto_field = "django.db.models.BigAutoField"
