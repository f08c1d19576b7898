"""A small cast reused across tests: an admin, an operator, a viewer and an
outsider (logged in, no role), each with an API client."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, suppress
from ipaddress import ip_network
from pathlib import Path
from typing import Any
from unittest.mock import patch
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.commands import flush
from django.db import connection, connections
from django.test import override_settings
from pytest_django import DjangoDbBlocker
from rest_framework.test import APIClient

from broker.consumers import load_consumer_modules
from broker.models import Queue
from broker.services.publish import NewMessage
from broker.services.queues import queue_create
from console.tokens import token_create
from rig.processes import (
    RedisServer,
    SparkConnectServer,
    Workers,
    database_url_for_workers,
    point_celery_at,
)
from tests.support.console import with_key
from tests.support.databases import (
    clone_migrated_template,
    post_migrate_of_a_flush,
    sql_flush_of_what_was_written,
)
from tests.support.publishing import published
from tests.support.webhooks import WebhookServer, silent_receiver
from workers.pipeline import STANDBY

# The suite's consumers are the demo's, a consumer module like any user's:
# `make run` names it in LAZARETTO_CONSUMER_MODULES, and so do the worker
# processes the tests start (tests/harness.py). This process loads it here.
load_consumer_modules(["demo_consumers"])


def _user(username: str, group: str | None) -> User:
    user = User.objects.create_user(username=username, password=f"{username}-password-1")
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def admin(db: None) -> User:
    return _user("alice", "admin")


@pytest.fixture
def operator(db: None) -> User:
    return _user("oscar", "operator")


@pytest.fixture
def viewer(db: None) -> User:
    return _user("vera", "viewer")


@pytest.fixture
def outsider(db: None) -> User:
    return _user("olga", None)


def _api_client_of(role: str) -> Any:
    """The fixture ``<role>_api``: an API client with a token of the user
    the fixture ``role`` makes."""

    @pytest.fixture(name=f"{role}_api")
    def api(request: pytest.FixtureRequest) -> APIClient:
        _token, key = token_create(user=request.getfixturevalue(role), name="tests")
        return with_key(key)

    return api


admin_api = _api_client_of("admin")
operator_api = _api_client_of("operator")
viewer_api = _api_client_of("viewer")
outsider_api = _api_client_of("outsider")


@pytest.fixture
def anonymous_api() -> APIClient:
    return APIClient()


@pytest.fixture
def orders(db: None) -> Queue:
    return queue_create(name="ORDERS.IN", consumer="log")


@pytest.fixture
def publish(db: None) -> Callable[..., list[int]]:
    """Publish ``count`` small text messages to a queue; returns their ids."""

    def _publish(queue: Queue, count: int = 1, payload: bytes = b"hello") -> list[int]:
        return published(queue, count, NewMessage(payload=payload))

    return _publish


@pytest.fixture
def dumps(settings: Any, tmp_path: Path) -> Path:
    """DUMP_DIR in this test's own directory: the dump files it finds there
    are its own."""
    settings.DUMP_DIR = tmp_path / "dumps"
    return settings.DUMP_DIR


# --- webhook receivers (tests.support.webhooks) --------------------------------


@pytest.fixture
def make_hook() -> Iterator[Callable[[], WebhookServer]]:
    """Start a webhook receiver on a free port, as many as a test asks for;
    all are stopped at the end."""
    with ExitStack() as running:

        def make() -> WebhookServer:
            server = WebhookServer()
            server.start()
            running.callback(server.stop)
            return server

        yield make


@pytest.fixture
def hook(make_hook: Callable[[], WebhookServer]) -> WebhookServer:
    """A webhook receiver that answers 204 at once (a test may change that)."""
    return make_hook()


@pytest.fixture
def silent_hook() -> Iterator[str]:
    """The URL of a webhook that accepts the connection and never says a word."""
    with silent_receiver() as url:
        yield url


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(directory=tmp_path)
    server.start()
    point_celery_at(server.url)
    yield server
    server.stop()
    point_celery_at(tasks_url_for_tests())


@pytest.fixture
def start_workers(
    transactional_db: None, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., Workers]]:
    """Start Celery worker processes on the test database; stopped at the end."""
    started: list[Workers] = []

    def start(
        concurrency: int = 2, pipeline: bool = False, beat: bool = True, **extra_env: str
    ) -> Workers:
        workers = Workers(
            directory=tmp_path,
            broker_url=redis_server.url,
            concurrency=concurrency,
            extra_env=extra_env,
            pipeline=pipeline,
            beat=beat,
        )
        started.append(workers)
        workers.start()
        return workers

    yield start
    for workers in started:
        workers.stop()


# The Spark settings of the suite's jobs: local mode on two cores, small
# jobs (the quick JIT tier alone starts in half the time), and niceness 1
# rather than the default 10: among the suite's own busy processes, the
# Spark tests keep their share of the two cores (the tests of the setting
# check that drivers and server run at this one).
SPARK_TEST_SETTINGS = {
    "SPARK_MASTER": "local[2]",
    "LAZARETTO_SPARK_PARTITIONS": "2",
    "LAZARETTO_SPARK_DRIVER_MEMORY": "1g",
    "LAZARETTO_SPARK_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1",
    "LAZARETTO_SPARK_NICENESS": "1",
}
SPARK_MODES = ("classic", "connect")


@pytest.fixture(scope="session")
def spark_connect_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SparkConnectServer]:
    """One Spark Connect server per pytest process, started by the first test
    that runs a job in Connect mode (workers.spark.connect_server, as `make
    run` starts it), on a free port, stopped at the end of the session."""
    server = SparkConnectServer(
        directory=tmp_path_factory.mktemp("spark-connect"), extra_env=SPARK_TEST_SETTINGS
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def spark_mode(request: pytest.FixtureRequest) -> str:
    """How the test's Spark jobs run: ``connect`` (a client of the session's
    Spark Connect server) unless a test is parametrized with
    ``pytest.mark.parametrize("spark_mode", SPARK_MODES, indirect=True)``."""
    mode = str(getattr(request, "param", "connect"))
    assert mode in SPARK_MODES, mode
    return mode


@pytest.fixture
def spark_env(
    transactional_db: None,
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    spark_mode: str,
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, str]]:
    """The environment the Spark drivers (python -m workers.spark) start
    in: the test database, a private Redis for their wake-ups, an archive of
    the test's own, Spark in local mode on two cores, in ``spark_mode``:
    a driver of its own (classic) or a client of the session's Spark Connect
    server (connect). Returned for worker processes that launch drivers
    themselves. Each driver starts with its job (no standby driver: it
    would be started in one test's environment and thrown away in the
    next's) unless a test turns LAZARETTO_SPARK_STANDBY on."""
    archive = tmp_path / "archive"
    values = {
        "DATABASE_URL": database_url_for_workers(),
        "CELERY_BROKER_URL": redis_server.url,
        "ARCHIVE_DIR": str(archive),
        "DUMP_DIR": str(tmp_path / "dumps"),
        "LAZARETTO_SPARK_STANDBY": "0",
        **SPARK_TEST_SETTINGS,
    }
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    if spark_mode == "connect":
        server: SparkConnectServer = request.getfixturevalue("spark_connect_server")
        values["SPARK_REMOTE"] = server.url
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings.ARCHIVE_DIR = archive
    settings.LAZARETTO_SPARK_STANDBY = False
    yield values
    STANDBY.discard()


# --- what each pytest process keeps to itself ---------------------------------


@pytest.fixture(scope="session", autouse=True)
def fast_password_hashing() -> Iterator[None]:
    """PBKDF2 takes most of a second a hash here, and most tests make a user
    or two: hashing their passwords took a third of the suite's processor
    time. The tests of logging in go through the same flow with MD5; the
    servers and workers the tests start keep the settings' own hashers."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def static_files_found_when_asked_for() -> Iterator[None]:
    """Every test client loads the middleware afresh, and WhiteNoise's
    loading scanned every static file (a twelfth of the processor time of
    the tests that start no process). Here it finds a file when a request
    asks for it, as under DEBUG; the servers the tests start scan once."""
    with override_settings(WHITENOISE_AUTOREFRESH=True):
        yield


@pytest.fixture(scope="session", autouse=True)
def flush_empties_only_what_was_written() -> Iterator[None]:
    """After each transactional test, Django's flush empties the tables the
    test wrote rather than truncating all of them, and puts back the
    installation's rows alone (tests.support.databases)."""
    with (
        patch.object(flush, "sql_flush", sql_flush_of_what_was_written),
        patch.object(flush, "emit_post_migrate_signal", post_migrate_of_a_flush),
    ):
        yield


@pytest.fixture(scope="session", autouse=True)
def process_private_cache_and_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Cache keys, dump files and archive of this pytest process alone.

    Under pytest-xdist (``make test`` runs the suite on several processes)
    each worker has its own test database, and those
    databases hand out the same ids: the API's rate counts, kept in the shared
    Redis cache under the token's or user's id, and the dump files, named from
    queue and message ids, would otherwise mix between workers. So the cache
    keys carry the database and worker names, and DUMP_DIR and ARCHIVE_DIR
    point into this process's own temporary directory (tests that look at
    either still point them at their own ``tmp_path``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    database = settings.DATABASES["default"]["NAME"]
    cache = {**settings.CACHES["default"], "KEY_PREFIX": f"lazaretto-test-{database}-{worker}"}
    files = tmp_path_factory.mktemp("lazaretto")
    with override_settings(
        CACHES={**settings.CACHES, "default": cache},
        DUMP_DIR=files / "dumps",
        ARCHIVE_DIR=files / "archive",
    ):
        yield


# The Redis database (of the project's Redis) the suite's wake-ups go to.
TEST_TASKS_DATABASE = 14


def tasks_url_for_tests() -> str:
    return urlsplit(settings.CELERY_BROKER_URL)._replace(path=f"/{TEST_TASKS_DATABASE}").geturl()


@pytest.fixture(scope="session", autouse=True)
def tasks_kept_from_make_run() -> Iterator[None]:
    """The tasks this session sends (wake-ups after a commit, jobs to run),
    and those of the servers it starts, go to a database of the project's
    Redis that no worker reads, emptied when the session starts: on database
    0 they waited for `make run`'s workers, which then ran them against its
    own store. Tests that need workers start a Redis of their own
    (``redis_server``)."""
    url = tasks_url_for_tests()
    previous = os.environ.get("CELERY_BROKER_URL")
    os.environ["CELERY_BROKER_URL"] = url
    point_celery_at(url)
    with suppress(redis.RedisError):
        redis.Redis.from_url(url, socket_connect_timeout=1).flushdb()
    yield
    if previous is None:
        os.environ.pop("CELERY_BROKER_URL", None)
    else:
        os.environ["CELERY_BROKER_URL"] = previous


@pytest.fixture(scope="session", autouse=True)
def loopback_webhooks() -> Iterator[None]:
    """The suite's webhook receivers listen on loopback, which webhooks may
    not reach by default (broker.outbound): the suite's processes, and the
    worker processes they start, allow loopback networks. The tests of the
    rule itself (tests/test_outbound.py) set their own."""
    loopback = "127.0.0.0/8,::1/128"
    previous = os.environ.get("LAZARETTO_WEBHOOK_ALLOWED_NETWORKS")
    os.environ["LAZARETTO_WEBHOOK_ALLOWED_NETWORKS"] = loopback
    networks = [ip_network(network) for network in loopback.split(",")]
    try:
        with override_settings(LAZARETTO_WEBHOOK_ALLOWED_NETWORKS=networks):
            yield
    finally:
        if previous is None:
            os.environ.pop("LAZARETTO_WEBHOOK_ALLOWED_NETWORKS", None)
        else:
            os.environ["LAZARETTO_WEBHOOK_ALLOWED_NETWORKS"] = previous


# --- the test database's durability profile ----------------------------------

TEST_DB_PROFILE_VARIABLE = "LAZARETTO_TEST_DB_PROFILE"
TEST_DB_PROFILES = ("fast", "durable")


def chosen_test_db_profile(environ: Mapping[str, str] = os.environ) -> str:
    """The profile LAZARETTO_TEST_DB_PROFILE names: ``fast`` or ``durable``
    (unset or empty). Anything else stops the test session, naming the variable."""
    value = environ.get(TEST_DB_PROFILE_VARIABLE, "")
    if value == "":
        return "durable"
    if value not in TEST_DB_PROFILES:
        raise pytest.UsageError(
            f"{TEST_DB_PROFILE_VARIABLE}: {value!r} is not valid; "
            f"expected one of {', '.join(TEST_DB_PROFILES)}."
        )
    return value


def pytest_configure(config: pytest.Config) -> None:
    """Refuse a bad LAZARETTO_TEST_DB_PROFILE before any test runs."""
    chosen_test_db_profile()


# --- the tiers, and the order the files run in ---------------------------------

# What `make test-fast` leaves out (docs/development.md), from the heaviest:
# the fault-injection pair, the fuzzer, Spark and Chromium. A test carries
# the mark of its module (pytestmark); a test that uses the Spark fixtures,
# or lives in tests/browser/, is marked spark or browser without being told.
TIERS = ("ha", "fuzz", "spark", "browser")
SPARK_FIXTURES = {"spark_env", "spark_connect_server"}
BROWSER_TESTS = Path(__file__).parent / "browser"


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark a test spark when it uses the Spark fixtures, browser when it
    lives in tests/browser/: as it is collected, so that ``-m`` (run after
    collection) sees the marks."""
    if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker("spark")
    if item.path.is_relative_to(BROWSER_TESTS):
        item.add_marker("browser")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the files in the order of their heaviest tier, the heaviest
    first, each file's tests in the order pytest-django gave them. ``make
    test`` hands the files out in this order (``--no-loadscope-reorder``):
    the long files start first and the many short ones fill the processes'
    ends, where pytest-xdist's own order (the files with most tests first)
    left the longest for last."""
    rank: dict[Path, int] = {}
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        tiers = [TIERS.index(tier) for tier in TIERS if tier in marks]
        weight = min(tiers, default=len(TIERS) + ("slow" not in marks))
        rank[item.path] = min(rank.get(item.path, weight), weight)
    order = {item: index for index, item in enumerate(items)}
    first: dict[Path, int] = {}
    for item in items:
        first.setdefault(item.path, order[item])
    items.sort(key=lambda item: (rank[item.path], first[item.path], order[item]))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """This process's test database (``test_<name>_gw<n>`` under xdist), a
    copy of the migrated template (tests/support/databases.py), made before
    pytest-django sets the databases up, which then finds it migrated
    (``django_db_keepdb``). ``--create-db`` migrates one the usual way."""
    database = connection.settings_dict
    test_name = database["TEST"].get("NAME") or f"test_{database['NAME']}"
    clone_migrated_template(os.environ["DATABASE_URL"], test_name)


@pytest.fixture(scope="session")
def django_db_keepdb() -> bool:
    """Use the test database cloned above rather than make it again; it
    is left on the server at the end and copied afresh by the next run."""
    return True


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: DjangoDbBlocker) -> None:
    """pytest-django's test database, in the profile LAZARETTO_TEST_DB_PROFILE
    chooses (``make test`` sets ``fast``; unset means ``durable``).

    ``fast`` sets synchronous_commit off on the test database alone (ALTER
    DATABASE), so every new session on it, this process's and the Celery workers'
    the tests start, commits without waiting for the WAL flush. ``durable``
    resets it, which changes nothing on a fresh test database and undoes a fast
    run's setting on a reused one (--reuse-db). The cluster and the database
    ``make run`` uses are never touched. Open connections are closed so the next
    ones see the setting."""
    profile = chosen_test_db_profile()
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    if profile == "fast":
        statement = f"ALTER DATABASE {name} SET synchronous_commit = off"
    else:
        statement = f"ALTER DATABASE {name} RESET synchronous_commit"
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(statement)
        connections.close_all()


@pytest.fixture
def live_partition_without_autovacuum(db: None) -> Iterator[None]:
    """Autovacuum stays off the live partition, so that it cannot analyze
    it while a test publishes: the test sets the planner's count itself."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE broker_message_live SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE broker_message_live RESET (autovacuum_enabled)")
