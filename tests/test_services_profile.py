"""The database `make run` uses is durable; only pytest-django's test database
may go fast, as LAZARETTO_TEST_DB_PROFILE says; var/services.env alone is
enough to run manage.py; scripts/services.sh makes old clusters durable."""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from rig.processes import database_url_for_workers
from tests.conftest import TEST_DB_PROFILE_VARIABLE, chosen_test_db_profile

ROOT = Path(__file__).resolve().parent.parent
DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")

# The block scripts/services.sh appended at initdb before the cluster had to be durable.
OLD_BLOCK = """
# ---- added by scripts/services.sh: throwaway dev/test cluster, NOT crash safe ----
listen_addresses = '127.0.0.1'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
shared_buffers = 256MB
# port and unix_socket_directories are passed by scripts/services.sh on start
"""


def show(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
    assert row is not None
    return str(row[0])


def expected_test_db_commit() -> str:
    return "off" if os.environ.get(TEST_DB_PROFILE_VARIABLE) == "fast" else "on"


def bash_after_source(
    sourced: str, script: str, *args: str, timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (its arguments ``args``) in bash after `source sourced`,
    in the project, in an environment with only PATH, HOME and ``env``: no
    SECRET_KEY, DEBUG or URLs of the caller."""
    return subprocess.run(
        ["bash", "-c", f"source {sourced} && {script}", "services-test", *args],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def services(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with scripts/services.sh sourced (its functions
    defined, its main not run)."""
    return bash_after_source("scripts/services.sh", script, *args, timeout=60, env=env)


# --- the cluster and make run's database ------------------------------------------


@pytest.mark.django_db
def test_the_database_make_run_uses_commits_durably_even_while_the_test_database_is_fast():
    # django_db: the test database exists and carries its profile meanwhile.
    url = urlsplit(os.environ["DATABASE_URL"])
    maintenance = url._replace(path="/postgres").geturl()
    with psycopg.connect(maintenance, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [url.path.lstrip("/")]
        ).fetchone()
    # A database that does not exist yet gets the server's settings, which a
    # plain session on the maintenance database sees.
    target = url.geturl() if exists else maintenance
    with psycopg.connect(target, autocommit=True) as conn:
        seen = {name: show(conn, name) for name in DURABILITY_SETTINGS}

    assert seen == dict.fromkeys(DURABILITY_SETTINGS, "on"), (
        f"PostgreSQL for `make run` must be durable; a new session on "
        f"{urlsplit(target).path.lstrip('/')} sees {seen}"
    )


# --- the test database --------------------------------------------------------------


@pytest.mark.django_db
def test_the_test_database_commits_as_lazaretto_test_db_profile_says():
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        through_django = cursor.fetchone()[0]
        cursor.execute(
            "SELECT coalesce(array_to_string(s.setconfig, ','), '') FROM pg_database d"
            " LEFT JOIN pg_db_role_setting s ON s.setdatabase = d.oid AND s.setrole = 0"
            " WHERE d.datname = current_database()"
        )
        database_settings = cursor.fetchone()[0]
    # A new session, as each Celery worker the tests start opens, sees the same.
    with psycopg.connect(database_url_for_workers(), autocommit=True) as conn:
        new_session = show(conn, "synchronous_commit")

    expected = expected_test_db_commit()
    assert through_django == expected
    assert new_session == expected
    # It is a setting of the test database alone, not of the server.
    assert ("synchronous_commit=off" in database_settings) == (expected == "off")


def test_an_unset_or_empty_profile_means_durable():
    assert chosen_test_db_profile({}) == "durable"
    assert chosen_test_db_profile({TEST_DB_PROFILE_VARIABLE: ""}) == "durable"
    assert chosen_test_db_profile({TEST_DB_PROFILE_VARIABLE: "fast"}) == "fast"
    assert chosen_test_db_profile({TEST_DB_PROFILE_VARIABLE: "durable"}) == "durable"


def test_a_bad_profile_is_refused_naming_the_variable_and_the_choices():
    with pytest.raises(pytest.UsageError) as refused:
        chosen_test_db_profile({TEST_DB_PROFILE_VARIABLE: "turbo"})

    assert str(refused.value) == (
        "LAZARETTO_TEST_DB_PROFILE: 'turbo' is not valid; expected one of fast, durable."
    )


@pytest.mark.slow
def test_a_bad_profile_stops_the_test_session_before_any_test_runs():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=ROOT,
        env={**os.environ, TEST_DB_PROFILE_VARIABLE: "turbo"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "LAZARETTO_TEST_DB_PROFILE: 'turbo' is not valid" in result.stderr
    assert "passed" not in result.stdout


PYTEST_RUN = (
    "PYTHONDONTWRITEBYTECODE= .venv/bin/pytest -n {workers} --dist loadfile --no-loadscope-reorder"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "workers", "selection"),
    [
        ("test", 3, "--durations=10"),
        ("test-fast", 4, '-m "not (ha or fuzz or spark or browser)"'),
    ],
)
@pytest.mark.parametrize(("caller", "profile"), [(None, "fast"), ("durable", "durable")])
def test_make_test_runs_pytest_with_the_fast_profile_unless_told_otherwise(
    target, workers, selection, caller, profile
):
    env = {key: value for key, value in os.environ.items() if key != TEST_DB_PROFILE_VARIABLE}
    if caller is not None:
        env[TEST_DB_PROFILE_VARIABLE] = caller
    result = subprocess.run(
        ["make", "-n", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    runs = [line for line in result.stdout.splitlines() if ".venv/bin/pytest" in line]
    run = PYTEST_RUN.format(workers=workers)
    assert runs == [f"LAZARETTO_TEST_DB_PROFILE={profile} {run} {selection}"]


# --- var/services.env ------------------------------------------------------------------


def source_services_env(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with var/services.env sourced."""
    services_env = ROOT / "var" / "services.env"
    assert services_env.is_file(), "var/services.env is missing: run scripts/services.sh start"
    return bash_after_source("var/services.env", script, timeout=120, env=env)


@pytest.mark.slow
def test_sourcing_services_env_is_enough_for_manage_py():
    if "DATABASE_URL=" not in (ROOT / "var" / "services.env").read_text():
        pytest.skip("var/services.env names no local cluster (the caller brings a DATABASE_URL)")

    result = source_services_env(".venv/bin/python manage.py check")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("caller", "debug"),
    [({}, "true"), ({"DEBUG": "0"}, "0"), ({"SECRET_KEY": "k"}, "<unset>")],
)
def test_services_env_turns_debug_on_only_when_the_caller_chose_nothing(caller, debug):
    result = source_services_env('printf %s "${DEBUG-<unset>}"', **caller)

    assert result.returncode == 0, result.stderr
    assert result.stdout == debug


# --- scripts/services.sh ---------------------------------------------------------------


@pytest.mark.slow
def test_services_sh_removes_the_old_non_durable_lines_from_an_existing_cluster(tmp_path):
    conf = tmp_path / "postgresql.conf"
    stock = "# stock settings\n#fsync = on\nwork_mem = 4MB\n"
    conf.write_text(stock + OLD_BLOCK)
    conf.chmod(0o600)

    assert services('pg_conf_is_fast "$1"', str(conf)).returncode == 0
    result = services('pg_conf_make_durable "$1"', str(conf))

    assert result.returncode == 0, result.stderr
    text = conf.read_text()
    for line in ("fsync = off", "synchronous_commit = off", "full_page_writes = off"):
        assert line not in text
    assert text.startswith(stock)
    for kept in (
        "listen_addresses = '127.0.0.1'",
        "max_connections = 200",
        "shared_buffers = 256MB",
        "# port and unix_socket_directories are passed by scripts/services.sh on start",
    ):
        assert kept in text
    assert "NOT crash safe" not in text
    assert conf.stat().st_mode & 0o777 == 0o600
    assert services('pg_conf_is_fast "$1"', str(conf)).returncode == 1


@pytest.mark.slow
def test_services_sh_leaves_a_durable_postgresql_conf_as_it_is(tmp_path):
    conf = tmp_path / "postgresql.conf"
    durable = "#fsync = off\nsynchronous_commit = local\nfsync = on  # fsync = off\n"
    conf.write_text(durable)

    assert services('pg_conf_is_fast "$1"', str(conf)).returncode == 1
    assert services('pg_conf_make_durable "$1"', str(conf)).returncode == 0
    assert conf.read_text() == durable


@pytest.mark.slow
def test_a_new_cluster_keeps_the_durable_defaults(tmp_path):
    # initdb itself is faked: what is under test is the block services.sh appends.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    initdb = bin_dir / "initdb"
    initdb.write_text('#!/bin/sh\nprintf "# stock postgresql.conf\\n" >"$2/postgresql.conf"\n')
    initdb.chmod(0o755)
    script = (
        'is_root() { return 1; }; PGBIN="$1/bin"; PGBASE="$1"; PGDATA_DIR="$1/data";'
        ' LOG_DIR="$1/log"; mkdir -p "$LOG_DIR"; pg_initdb secret'
    )

    result = services(script, str(tmp_path))

    assert result.returncode == 0, result.stderr
    conf = tmp_path / "data" / "postgresql.conf"
    text = conf.read_text()
    assert "listen_addresses = '127.0.0.1'" in text
    for name in DURABILITY_SETTINGS:
        assert f"{name} =" not in text
    assert services('pg_conf_is_fast "$1"', str(conf)).returncode == 1
    # Vacuum looks at the churning live messages every 10 s, not every minute,
    # and checkpoints come with checkpoint_timeout, not every 1 GB of WAL.
    assert "autovacuum_naptime = 10s" in text
    assert "max_wal_size = 8GB" in text
    assert services('pg_conf_lacks_queue_settings "$1"', str(conf)).returncode == 1


@pytest.mark.slow
def test_services_sh_knows_an_older_cluster_lacks_the_queue_settings(tmp_path):
    conf = tmp_path / "postgresql.conf"
    conf.write_text("# a cluster made before\nwork_mem = 4MB\n")

    assert services('pg_conf_lacks_queue_settings "$1"', str(conf)).returncode == 0


@pytest.mark.slow
def test_services_sh_adds_only_the_queue_settings_an_older_cluster_lacks(tmp_path):
    conf = tmp_path / "postgresql.conf"
    header = services('printf "%s" "$PG_CONF_HEADER"').stdout
    # initdb's own setting, above the block services.sh appends, does not count.
    conf.write_text(f"max_wal_size = 1GB\n\n{header}\nautovacuum_naptime = 10s\n")

    missing = services('pg_conf_missing_queue_settings "$1"', str(conf))

    assert missing.stdout.splitlines() == ["max_wal_size = 8GB"]
    assert services('pg_conf_lacks_queue_settings "$1"', str(conf)).returncode == 0
