"""Databases of a test's own on the test server, beside the test database:
each pytest process's test database, cloned from one migrated template;
for a process that must start on an empty or half-migrated database; one
value read on the test's own connection; and the suite's flush of the test
database after a transactional test."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psycopg
from django.apps import apps as django_apps
from django.db import connection
from psycopg import sql

from broker.apps import installation_rows
from rig.processes import ROOT
from tests.support.processes import manage

TEMPLATE_PREFIX = "lazaretto_template_"
# The advisory-lock key under which one pytest process makes the template
# while the others wait for it.
TEMPLATE_LOCK_KEY = 0x4C5A_544D_504C  # "LZTMPL"


def _maintenance(url: str) -> str:
    return urlsplit(url)._replace(path="/postgres").geturl()


@contextmanager
def throwaway_database(url: str, name: str, *, migrated: bool = False) -> Iterator[str]:
    """The URL of a new database ``name`` on ``url``'s server, empty or
    (``migrated``) a copy of the migrated template; dropped (and any
    sessions left on it ended) when the block ends. One left behind by a
    run that was killed is dropped first."""
    server = urlsplit(url)
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    if migrated:
        clone_migrated_template(url, name)
    else:
        with psycopg.connect(_maintenance(url), autocommit=True) as conn:
            conn.execute(drop)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield server._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(_maintenance(url), autocommit=True) as conn:
            conn.execute(drop)


def template_name() -> str:
    """The template of what the migrations and the pinned packages make:
    a change to either names another, so it is made again."""
    digest = hashlib.sha256()
    for path in [*sorted(ROOT.glob("*/migrations/*.py")), ROOT / "requirements.txt"]:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return TEMPLATE_PREFIX + digest.hexdigest()[:16]


def clone_migrated_template(url: str, name: str) -> None:
    """Make ``name`` on ``url``'s server a copy of the migrated template,
    making the template first if no pytest process has yet (with
    ``manage.py migrate``, as a new installation is made, once for every
    process of the run and every later run on the same migrations).
    Templates of other migrations are dropped as a new one is made.

    Three processes migrating a database each took 3 s of the server's and
    their own CPU; a copy takes a tenth of that."""
    template = template_name()
    identifier = sql.Identifier(template)
    with psycopg.connect(_maintenance(url), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,))
            if found.fetchone() is None:
                _make_template(conn, url, template)
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), identifier)
            )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))


def _make_template(conn: psycopg.Connection[Any], url: str, template: str) -> None:
    stale = conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE %s", (TEMPLATE_PREFIX + "%",)
    ).fetchall()
    for (old,) in stale:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(old)))
    # Migrated under a name of its own, renamed once complete: a run killed
    # midway leaves no half-migrated template behind under the real name.
    making = template + "_making"
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(making)))
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(making)))
    making_url = urlsplit(url)._replace(path=f"/{making}").geturl()
    migrated = manage("migrate", "--noinput", timeout=600, DATABASE_URL=making_url)
    if migrated.returncode != 0:
        raise RuntimeError(f"migrating the test template failed:\n{migrated.stderr[-3000:]}")
    conn.execute(
        sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(making), sql.Identifier(template)
        )
    )


def scalar(query: str, params: Sequence[Any] = ()) -> Any:
    """The one value ``query`` selects, on the test's own connection."""
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]


# Rows every migrated database has and no test changes: the content types and
# permissions post_migrate makes. A flush keeps them rather than truncating and
# making them again.
STATIC_TABLES = frozenset({"django_content_type", "auth_permission"})
# Truncated rather than emptied row by row: the messages, whose partitions'
# pages and planner statistics some tests read (a DELETE leaves the pages of
# the deleted rows behind until a VACUUM).
TRUNCATED_TABLES = frozenset({"broker_message"})


def sql_flush_of_what_was_written(
    style: Any, conn: Any, reset_sequences: bool = True, allow_cascade: bool = False
) -> list[str]:
    """The SQL that empties the test database after a transactional test: a
    DELETE of each table that holds a row (but TRUNCATED_TABLES, truncated),
    where Django's ``flush`` command truncates every table. A TRUNCATE costs
    the server new files for the table and each index, which the few rows
    of the few tables a test writes do not need; every foreign key is
    checked at the commit (Django makes them DEFERRABLE INITIALLY
    DEFERRED), when every row that referred to a deleted one is gone as
    well. Asked to reset the sequences (a test's ``reset_sequences``), it
    truncates as Django does. The command then calls
    ``post_migrate_of_a_flush``."""
    tables = [
        table
        for table in conn.introspection.django_table_names(only_existing=True, include_views=False)
        if table not in STATIC_TABLES
    ]
    if reset_sequences or not tables:
        return conn.ops.sql_flush(
            style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    probe = sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT {} WHERE EXISTS (SELECT FROM {})").format(
            sql.Literal(table), sql.Identifier(table)
        )
        for table in tables
    )
    with conn.cursor() as cursor:
        cursor.execute(probe.as_string(conn.connection))
        written = [table for (table,) in cursor.fetchall()]
    truncated = [table for table in written if table in TRUNCATED_TABLES]
    statements = [
        sql.SQL("DELETE FROM {}").format(sql.Identifier(table))
        for table in written
        if table not in truncated
    ]
    if truncated:
        # CASCADE: with the tables that refer to it, written or not.
        names = sql.SQL(", ").join(map(sql.Identifier, truncated))
        statements.insert(0, sql.SQL("TRUNCATE {} CASCADE").format(names))
    return [statement.as_string(conn.connection) for statement in statements]


def post_migrate_of_a_flush(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
    """What the flush's post_migrate does that the suite's flush needs: the
    installation's rows (``broker.apps.installation_rows``), made again.
    The content types and permissions, which it keeps (STATIC_TABLES), are
    not looked over again: a query for each model after every
    transactional test."""
    installation_rows(django_apps.get_app_config("broker"), using=db)
