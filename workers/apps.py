from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Lazaretto workers"

    def ready(self) -> None:
        # Connects the wake-up receiver in every process that publishes.
        from workers import tasks  # noqa: F401
