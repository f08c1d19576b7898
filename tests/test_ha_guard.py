"""Database errors the HA pair explains become errors with a stable code:
a write the guard refused, or no primary to be had during a failover."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError, connection

from broker.errors import HaMaintenance, StoreUnavailable
from broker.ha.guard import refusal
from broker.models import Queue
from tests.support.console import publish_refused


def django_error(cause: psycopg.Error) -> OperationalError:
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "cause",
    [
        psycopg.OperationalError("connection to server at 127.0.0.1 failed: Connection refused"),
        psycopg.OperationalError("connection to server failed: session is read-only"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    ],
)
def test_no_primary_to_be_had_is_store_unavailable(cause: psycopg.Error) -> None:
    assert isinstance(refusal(django_error(cause)), StoreUnavailable)
    assert isinstance(refusal(cause), StoreUnavailable)


def test_other_database_errors_are_not_explained() -> None:
    assert refusal(psycopg.errors.UniqueViolation("duplicate key")) is None
    assert refusal(ValueError("not a database error")) is None


def test_a_guard_refusal_keeps_its_own_error() -> None:
    class Refused(psycopg.errors.RaiseException):
        sqlstate = "LZ001"

    assert isinstance(refusal(Refused("The HA pair is in maintenance")), HaMaintenance)


def test_a_publish_to_a_store_that_takes_no_writes_is_503(operator_api, orders: Queue) -> None:
    # What a fenced primary or a standby answers a write (SQLSTATE 25006),
    # from a trigger that lives as long as the test's transaction.
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION pg_temp.read_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' "
            "USING ERRCODE = '25006'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER read_only BEFORE INSERT ON broker_message "
            "FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.read_only()"
        )

    body = publish_refused(operator_api, orders)

    assert body["code"] == "store_unavailable"
    assert "Retry" in body["detail"]
