"""No caller waits on a frozen server: a store session's waits end by the
caller's limit (broker.store.deadline). The server is really frozen here:
the test's own backend process is stopped with SIGSTOP."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from rest_framework.test import APIClient

from broker.errors import StoreUnavailable
from broker.ha.guard import refusal
from broker.store.deadline import StoreConnection, StoreTimeout, limit

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="stopping a backend needs root")


@contextlib.contextmanager
def frozen_backend() -> Iterator[int]:
    """This thread's store session, its server process stopped (SIGSTOP)."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
        connection.close()


def test_a_statement_on_a_frozen_server_ends_at_the_limit(transactional_db: None) -> None:
    with frozen_backend():
        started = time.monotonic()
        with (
            pytest.raises(OperationalError) as raised,
            limit(total=1.0, what="the test"),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT 1")
        took = time.monotonic() - started
    assert 0.9 <= took < 2.0, took
    assert isinstance(raised.value.__cause__, StoreTimeout)
    assert "the test" in str(raised.value)
    assert isinstance(refusal(raised.value), StoreUnavailable)
    # A new session works at once.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_each_wait_has_its_own_bound_and_an_inner_limit_never_loosens_an_outer(
    transactional_db: None,
) -> None:
    with limit(each=0.5):
        for _ in range(200):  # fast statements never trip the watchdog
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(0.001)")
        with connection.cursor() as cursor:
            started = time.monotonic()
            with pytest.raises(OperationalError), limit(each=30):
                cursor.execute("SELECT pg_sleep(5)")
    assert time.monotonic() - started < 1.5
    connection.close()


def test_outside_any_limit_a_slow_statement_runs_to_its_end(transactional_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(1.2), 7")
        assert cursor.fetchone()[1] == 7


@override_settings(LAZARETTO_STORE_TIMEOUT_SECONDS=1.5)
def test_an_api_request_on_a_frozen_server_answers_503_with_retry_after(
    transactional_db: None, viewer_api: APIClient
) -> None:
    assert viewer_api.get("/api/v1/queues/").status_code == 200
    with frozen_backend():
        started = time.monotonic()
        response = viewer_api.get("/api/v1/queues/")
        took = time.monotonic() - started
    assert response.status_code == 503, response.content
    assert response.json()["code"] == "store_unavailable"
    assert response["Retry-After"] == "2"
    assert took < 1.5 + 1.0, took
    assert viewer_api.get("/api/v1/queues/").status_code == 200


@override_settings(LAZARETTO_STORE_TIMEOUT_SECONDS=1.5)
def test_a_console_page_on_a_frozen_server_answers_the_503_page(
    transactional_db: None, client: object, viewer: object
) -> None:
    from django.test import Client

    assert isinstance(client, Client)
    client.force_login(viewer)  # type: ignore[arg-type]
    with frozen_backend():
        response = client.get("/")
    assert response.status_code == 503
    assert b"cannot take this request now" in response.content
    assert response["Retry-After"] == "2"


def test_a_forked_child_keeps_its_limits(transactional_db: None) -> None:
    """A worker process forked after its parent bounded a wait (Celery's
    prefork, gunicorn) bounds its own: its watchdog starts afresh."""
    with limit(each=0.5), connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the parent's watchdog runs
    conninfo = connection.connection.info.dsn + f" password={connection.settings_dict['PASSWORD']}"
    pid = os.fork()
    if pid == 0:  # the child: its own session, frozen by itself
        code = 1
        try:
            with StoreConnection.connect(conninfo, autocommit=True) as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                backend = int(row[0])
                os.kill(backend, signal.SIGSTOP)
                started = time.monotonic()
                try:
                    with limit(each=0.5):
                        conn.execute("SELECT 1")
                except StoreTimeout:
                    code = 0 if time.monotonic() - started < 1.5 else 2
                finally:
                    os.kill(backend, signal.SIGCONT)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the child's limited wait never ended")
