"""Django's PostgreSQL backend with :class:`~broker.store.deadline.StoreConnection`
sessions."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.postgresql import base

from broker.store.deadline import StoreConnection, limit

# A health check of a kept session (CONN_HEALTH_CHECKS) is one `SELECT 1`:
# a server that takes longer is treated as gone and a new session is opened.
HEALTH_CHECK_SECONDS = 0.5


class _Driver:
    """The DB-API module as the backend sees it: psycopg, but connecting
    with :class:`StoreConnection`."""

    def __getattr__(self, name: str) -> Any:
        return getattr(psycopg, name)

    @staticmethod
    def connect(*args: Any, **kwargs: Any) -> StoreConnection:
        return StoreConnection.connect(*args, **kwargs)


class DatabaseWrapper(base.DatabaseWrapper):
    Database = _Driver()

    def is_usable(self) -> bool:
        with limit(each=HEALTH_CHECK_SECONDS, what="a health check"):
            return bool(super().is_usable())
