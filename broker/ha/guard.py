"""The store-side HA rules as the rest of Lazaretto meets them.

A node sets its server's ``lazaretto.ha_mode`` (maintenance, synchronising)
and the guard trigger of migration 0010 refuses the writes that mode forbids
with its own SQLSTATE; :func:`refusal` turns such a database error into the
broker error with a stable code. :func:`primary_duty` runs a primary-only
duty under the epoch it was issued with: the store refuses it, and every
write in it, once the pair has moved to another epoch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from django.db import DatabaseError, connection

from broker.errors import (
    BrokerError,
    HaMaintenance,
    HaSynchronising,
    StaleEpoch,
    StoreUnavailable,
)

# The guard trigger's SQLSTATEs (broker/migrations/0010_ha.py).
SQLSTATE_MAINTENANCE = "LZ001"
SQLSTATE_SYNCHRONISING = "LZ002"
SQLSTATE_STALE_EPOCH = "LZ003"

_ERRORS: dict[str, type[BrokerError]] = {
    SQLSTATE_MAINTENANCE: HaMaintenance,
    SQLSTATE_SYNCHRONISING: HaSynchronising,
    SQLSTATE_STALE_EPOCH: StaleEpoch,
}


# No primary to be had: the connection failed or was ended (a server down, a
# fenced one ending its sessions), or the server takes no writes (a standby,
# a fenced primary).
_UNAVAILABLE_SQLSTATES = {"57P01", "57P02", "57P03", "25006"}
UNAVAILABLE_DETAIL = (
    "The message store cannot take this request now: a failover or switchover of the HA "
    "pair may be under way. Retry in a few seconds."
)


def refusal(error: BaseException) -> BrokerError | None:
    """The broker error for a database error the HA pair explains (a write
    the HA guard refused, or no primary to be had), else None."""
    cause = error.__cause__ if isinstance(error, DatabaseError) else error
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError) and (
        sqlstate is None or sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES
    ):
        return StoreUnavailable(UNAVAILABLE_DETAIL)
    if sqlstate in _UNAVAILABLE_SQLSTATES:
        return StoreUnavailable(UNAVAILABLE_DETAIL)
    if sqlstate not in _ERRORS:
        return None
    diag = getattr(cause, "diag", None)
    detail = getattr(diag, "message_primary", None) or str(cause)
    return _ERRORS[sqlstate](detail)


def store_epoch() -> int | None:
    """The pair's epoch as the connected store has it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT epoch FROM broker_hapair WHERE id = 1")
        row = cursor.fetchone()
    return int(row[0]) if row else None


@contextlib.contextmanager
def primary_duty(epoch: int | None) -> Iterator[None]:
    """Run a primary duty issued under ``epoch``.

    Raises :class:`StaleEpoch` at once when the store is at another epoch,
    and marks the session so that the store refuses each of the duty's
    writes should the epoch change while it runs. ``None`` (a duty run by
    hand: ``manage.py archive run``, a test) runs unguarded.
    """
    if epoch is None:
        yield
        return
    # The epoch read and the session marked in one statement; a stale duty
    # clears the mark on its way out, as any other.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT epoch, set_config('lazaretto.duty_epoch', %s, false)"
            " FROM broker_hapair WHERE id = 1",
            [str(epoch)],
        )
        row = cursor.fetchone()
    current = int(row[0]) if row else None
    try:
        if current != epoch:
            raise StaleEpoch(
                f"A primary duty of epoch {epoch} is stale: the pair is at epoch {current}."
            )
        yield
    except (DatabaseError, psycopg.Error) as error:
        # psycopg's own errors come out of COPY, which Django does not wrap.
        translated = refusal(error)
        if translated is not None:
            raise translated from error
        raise
    finally:
        # The mark must not outlive the duty: a session that cannot clear it
        # is closed instead.
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lazaretto.duty_epoch', '', false)")
        except DatabaseError:
            connection.close()
