"""What the operations endpoints decide: who may read /metrics, and whether
this process is ready to serve (/readyz). The views (console.views.ops)
only turn these answers into responses."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

import psycopg
import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest

from console.client import client_address

logger = logging.getLogger(__name__)

# Each readiness check gives up after this long.
CHECK_TIMEOUT_SECONDS = 2


@dataclass(frozen=True)
class Refusal:
    """Why a request may not read /metrics: its HTTP status and the error."""

    status: int
    code: str
    detail: str


def metrics_refusal(request: HttpRequest) -> Refusal | None:
    """None when ``request`` may read /metrics: it bears METRICS_TOKEN, or
    (bearing no token) it comes from METRICS_ALLOWED_NETWORKS. A wrong
    token is refused whatever the network."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if header:
        expected = settings.METRICS_TOKEN
        if scheme.lower() != "bearer" or not expected:
            return Refusal(
                401,
                "not_authenticated",
                "/metrics accepts only 'Authorization: Bearer <METRICS_TOKEN>'"
                + ("." if expected else ", and no METRICS_TOKEN is set."),
            )
        if not hmac.compare_digest(token.strip().encode(), expected.encode()):
            return Refusal(401, "authentication_failed", "The metrics token is wrong.")
        return None
    address = client_address(request)
    if address is not None and any(
        address in network for network in settings.METRICS_ALLOWED_NETWORKS
    ):
        return None
    return Refusal(
        403,
        "permission_denied",
        "/metrics answers only METRICS_ALLOWED_NETWORKS or a request bearing METRICS_TOKEN.",
    )


@dataclass(frozen=True)
class Check:
    ok: bool
    # Why not, for an operator: what failed, never a password or a URL.
    error: str = ""

    def as_json(self) -> dict[str, object]:
        return {"ok": True} if self.ok else {"ok": False, "error": self.error}


def readiness() -> dict[str, Check]:
    """Each part this process needs to serve: the database (reachable, and
    every migration applied) and Redis (CELERY_BROKER_URL), each given
    CHECK_TIMEOUT_SECONDS."""
    database = _database()
    return {
        "database": database,
        "migrations": _migrations() if database.ok else Check(False, "database unreachable"),
        "redis": _redis(),
    }


def _failed(part: str, doing: str, error: Exception) -> Check:
    # The full error (which may name hosts and ports) goes to the log only.
    logger.warning("readiness: %s: %s: %s", part, doing, error)
    return Check(False, f"{doing} failed ({type(error).__name__})")


def _database() -> Check:
    """A connection of its own with a connect timeout (Django's persistent
    one has none), and one query."""
    params = connection.get_connection_params()
    options = f"{params.pop('options', '')} -c statement_timeout={CHECK_TIMEOUT_SECONDS * 1000}"
    params.update(connect_timeout=CHECK_TIMEOUT_SECONDS, options=options.strip())
    try:
        with psycopg.connect(**params, autocommit=True) as probe:
            probe.execute("SELECT 1")
    except psycopg.Error as error:
        return _failed("database", f"connecting within {CHECK_TIMEOUT_SECONDS} s", error)
    return Check(True)


def _migrations() -> Check:
    """No migration on disk left unapplied to the database."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = %s", [CHECK_TIMEOUT_SECONDS * 1000])
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as error:  # any failure to read the migration state
        return _failed("migrations", "reading the applied migrations", error)
    if plan:
        names = ", ".join(f"{migration.app_label}.{migration.name}" for migration, _ in plan)
        return Check(False, f"{len(plan)} unapplied: {names}")
    return Check(True)


def _redis() -> Check:
    client = redis.Redis.from_url(
        settings.CELERY_BROKER_URL,
        socket_connect_timeout=CHECK_TIMEOUT_SECONDS,
        socket_timeout=CHECK_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    except redis.RedisError as error:
        return _failed("redis", f"PING within {CHECK_TIMEOUT_SECONDS} s", error)
    finally:
        client.close()
    return Check(True)
