from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Lazaretto console"

    def ready(self) -> None:
        from console import logins  # noqa: F401 - connects the lockout's audit event
