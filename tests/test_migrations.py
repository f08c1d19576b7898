"""The models and the migrations agree: a model change without its migration
(or a counter added to ``broker.models.Counts`` alone) fails here."""

from __future__ import annotations

from django.core.management import call_command


def test_the_models_need_no_new_migration(db: None) -> None:
    try:
        call_command("makemigrations", "--check", "--dry-run", verbosity=0)
    except SystemExit as exit_:
        raise AssertionError(
            "a model changed without its migration (manage.py makemigrations)"
        ) from exit_
