"""A node's hold on PostgreSQL: its own server (start, stop, promote, fence,
rewind, clone, follow) and what it asks of its peer's.

Replication is PostgreSQL's own: a physical slot on the primary for its
standby, ``standby.signal`` and ``primary_conninfo`` on the standby,
``synchronous_standby_names`` while the standby keeps up, ``pg_promote()``,
``pg_rewind`` and ``pg_basebackup``. Nothing here copies a row.

Settings a node manages are kept in the server's ``postgresql.auto.conf``
(``ALTER SYSTEM`` while the server runs, an edit of the file while it is
stopped): they belong to that server, and are not replicated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.abc import Query
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from broker.store import hosts
from broker.store.deadline import StoreConnection, StoreTimeout, limit

logger = logging.getLogger(__name__)

# Sessions of the nodes themselves: never terminated when a store is fenced,
# and read-write on a fenced store (their own writes: epoch, node rows).
NODE_APPLICATION_NAME = "lazaretto-node"
# Settings a node owns in its server's postgresql.auto.conf. A clone or a
# rewind copies the source's file, so they are reset on the copy.
MANAGED_SETTINGS = (
    "wal_receiver_status_interval",
    "wal_retrieve_retry_interval",
    "synchronous_standby_names",
    "default_transaction_read_only",
    "lazaretto.ha_mode",
    "primary_conninfo",
    "primary_slot_name",
)
TOOL_TIMEOUT_SECONDS = 600
# How often a standby replies to its primary, idle or not.
STATUS_INTERVAL_SECONDS = 1
# How long one of the node's own statements may wait on a server (the
# server's own statement_timeout, set below, ends it there first).
STATEMENT_SECONDS = 12.0
PROMOTE_SECONDS = 60
CHECKPOINT_SECONDS = 120.0


class PostgresError(RuntimeError):
    """A PostgreSQL tool or statement the node needed failed."""


def slot_name(node_name: str) -> str:
    """The physical replication slot a primary keeps for standby ``node_name``."""
    return "lazaretto_" + re.sub(r"[^a-z0-9_]", "_", node_name.lower())


# What libpq takes in a connection string. Django's OPTIONS also hold its own
# and psycopg's connection arguments (pool, prepare_threshold, ...).
LIBPQ_KEYWORDS = frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def conninfo_of(database: dict[str, Any], **extra: Any) -> str:
    """A libpq connection string for one of Django's DATABASES entries."""
    params: dict[str, Any] = {
        "dbname": database.get("NAME") or None,
        "user": database.get("USER") or None,
        "password": database.get("PASSWORD") or None,
        "host": database.get("HOST") or None,
        "port": database.get("PORT") or None,
    }
    options = database.get("OPTIONS") or {}
    params.update({k: v for k, v in options.items() if k in LIBPQ_KEYWORDS})
    params.update(extra)
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


@dataclass(frozen=True)
class Replica:
    """One row of the primary's pg_stat_replication."""

    name: str
    state: str
    sync_state: str
    lag_bytes: int
    # Seconds since the standby last replied (None: never).
    reply_age: float | None = None


@dataclass(frozen=True)
class Probe:
    """What a server says about itself."""

    in_recovery: bool
    lsn: int
    timeline: int
    read_only: bool
    ha_mode: str
    receiving: bool = False
    replicas: tuple[Replica, ...] = ()


def _connect(conninfo: str, timeout: float) -> psycopg.Connection[Any]:
    return StoreConnection.connect(
        conninfo,
        autocommit=True,
        connect_timeout=max(1, round(timeout)),
        application_name=NODE_APPLICATION_NAME,
        # A dead peer or a cut link is found in seconds, not in TCP's minutes.
        keepalives=1,
        keepalives_idle=1,
        keepalives_interval=1,
        keepalives_count=3,
        tcp_user_timeout=max(1000, round(timeout * 1000)),
        # The node's own writes (epoch, node rows) pass a fenced store and
        # never wait for a synchronous standby that may be gone.
        options=(
            "-c default_transaction_read_only=off -c synchronous_commit=local"
            " -c statement_timeout=10000"
        ),
    )


PROBE_SQL = """
SELECT pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery()
            THEN coalesce(pg_last_wal_replay_lsn(), '0/0')
            ELSE pg_current_wal_lsn() END - '0/0',
       (SELECT timeline_id FROM pg_control_checkpoint()),
       coalesce(current_setting('lazaretto.ha_mode', true), ''),
       EXISTS (SELECT FROM pg_stat_wal_receiver WHERE status = 'streaming')
"""
REPLICAS_SQL = """
SELECT application_name, state, sync_state,
       coalesce(pg_current_wal_lsn() - coalesce(replay_lsn, '0/0'), 0)::bigint,
       extract(epoch FROM clock_timestamp() - reply_time)::float8
FROM pg_stat_replication
"""
# The timeline a primary writes now (the first 8 hex digits of its WAL
# file's name) and the one its control file shows.
TIMELINES_SQL = """
SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int,
       (SELECT timeline_id FROM pg_control_checkpoint())
"""
FENCED_SQL = """
SELECT setting = 'on' FROM pg_file_settings
WHERE name = 'default_transaction_read_only' AND applied IS NOT NULL
ORDER BY seqno DESC LIMIT 1
"""


@dataclass(frozen=True)
class Identity:
    """Which server this is: its cluster and its current run."""

    system_identifier: int
    started_at: str
    rewindable: bool


IDENTITY_SQL = """
SELECT (SELECT system_identifier FROM pg_control_system()),
       pg_postmaster_start_time()::text,
       current_setting('wal_log_hints') = 'on' OR current_setting('data_checksums') = 'on'
"""


@dataclass
class Server:
    """A PostgreSQL server reached at ``conninfo``; with ``pgdata`` (a node's
    own server, on its own machine) it can also be started, stopped,
    rewound and cloned."""

    conninfo: str
    pgdata: Path | None = None
    bindir: Path | None = None
    os_user: str | None = None
    options: str = ""
    log_file: Path | None = None
    _connection: psycopg.Connection[Any] | None = field(default=None, repr=False)

    # -- SQL --------------------------------------------------------------

    @contextlib.contextmanager
    def session(self, timeout: float = 2.0) -> Iterator[psycopg.Connection[Any]]:
        """A kept connection, opened again after any error."""
        if self._connection is None or self._connection.closed:
            self._connection = _connect(self.conninfo, timeout)
        try:
            yield self._connection
        except psycopg.Error:
            self.disconnect()
            raise

    def disconnect(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
        self._connection = None

    def answers(self) -> bool:
        """The server's postmaster answers a connection's first message
        within half a second: it is alive, however busy its sessions are."""
        params = conninfo_to_dict(self.conninfo)
        return hosts.answers(
            str(params.get("host") or "/var/run/postgresql"), str(params.get("port") or 5432)
        )

    def probe(self, timeout: float = 2.0) -> Probe | None:
        """The server's state, or None when it does not answer."""
        try:
            with self.session(timeout) as conn, limit(total=timeout, what="a probe"):
                row = conn.execute(PROBE_SQL).fetchone()
                assert row is not None
                fenced = conn.execute(FENCED_SQL).fetchone()
                replicas: tuple[Replica, ...] = ()
                if not row[0]:
                    replicas = tuple(
                        Replica(
                            name=r[0],
                            state=r[1],
                            sync_state=r[2],
                            lag_bytes=int(r[3]),
                            reply_age=None if r[4] is None else max(0.0, float(r[4])),
                        )
                        for r in conn.execute(REPLICAS_SQL).fetchall()
                    )
        except psycopg.Error as error:
            logger.debug("ha: %s does not answer: %s", self.describe(), error)
            return None
        return Probe(
            in_recovery=bool(row[0]),
            lsn=int(row[1]),
            timeline=int(row[2]),
            read_only=bool(fenced and fenced[0]),
            ha_mode=str(row[3]),
            receiving=bool(row[4]),
            replicas=replicas,
        )

    def execute(
        self,
        statement: Query,
        params: Sequence[Any] | Mapping[str, Any] = (),
        *,
        timeout: float = STATEMENT_SECONDS,
    ) -> list[Any]:
        """Run one of the node's statements (each is idempotent, or only
        advances the epoch), once more on a fresh session when the kept one
        turned out broken: the server restarted, or a cut link reset it."""

        def run() -> list[Any]:
            with self.session() as conn, limit(each=timeout, what="a node's statement"):
                cursor = conn.execute(statement, params)
                return cursor.fetchall() if cursor.description else []

        kept = self._connection is not None and not self._connection.closed
        try:
            return run()
        except StoreTimeout:
            raise
        except psycopg.OperationalError:
            if not kept:
                raise
        return run()

    def execute_named(self, statement: Query, params: dict[str, Any]) -> None:
        with self.session() as conn, limit(each=STATEMENT_SECONDS, what="a node's statement"):
            conn.execute(statement, params)

    def set_settings(self, values: dict[str, str | None]) -> None:
        """ALTER SYSTEM each setting (None: RESET; a custom setting, which
        RESET may not know, is set empty instead), then reload."""
        for name, value in values.items():
            if value is None and "." in name:
                value = ""
            setting = sql.SQL(".").join(sql.Identifier(part) for part in name.split("."))
            if "." in name:
                # Before PostgreSQL 17, ALTER SYSTEM knows a custom setting
                # only once the session has it (a placeholder).
                self.execute("SELECT set_config(%s, '', true)", [name])
            if value is None:
                self.execute(sql.SQL("ALTER SYSTEM RESET {}").format(setting))
            else:
                self.execute(
                    sql.SQL("ALTER SYSTEM SET {} = {}").format(setting, sql.Literal(value))
                )
        self.execute("SELECT pg_reload_conf()")

    def fence(self, timeout: float = 5.0) -> None:
        """Make the server refuse new read-write sessions (applications
        asking ``target_session_attrs=read-write`` pass it by) and end the
        applications' sessions; the nodes' own sessions stay. The reload is
        asynchronous: the sessions are ended once a new one is read-only, so
        that none opened in between stays writable."""
        self.set_settings({"default_transaction_read_only": "on"})
        if not self.wait_setting("transaction_read_only", "on", timeout=timeout):
            raise PostgresError(f"{self.describe()} still takes read-write sessions")
        self.terminate_clients()

    def wait_setting(self, name: str, value: str, *, timeout: float = 5.0) -> bool:
        """Whether a new session shows ``name`` = ``value`` within ``timeout``
        (a reload is asynchronous: the server takes it in a moment later)."""
        deadline = time.monotonic() + timeout
        while self._new_session_shows(name) != value:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _new_session_shows(self, name: str) -> str | None:
        with (
            StoreConnection.connect(
                self.conninfo,
                autocommit=True,
                connect_timeout=2,
                application_name=NODE_APPLICATION_NAME,
            ) as conn,
            limit(each=2.0, what="a settings check"),
        ):
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
        return None if row is None else str(row[0])

    def unfence(self) -> None:
        self.set_settings({"default_transaction_read_only": None})

    def terminate_clients(self) -> None:
        self.execute(
            """
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
              AND application_name <> %s
            """,
            [NODE_APPLICATION_NAME],
        )

    def promote(self) -> None:
        rows = self.execute(
            "SELECT pg_promote(true, %s)", [PROMOTE_SECONDS], timeout=PROMOTE_SECONDS + 5
        )
        if not rows or not rows[0][0]:
            raise PostgresError(
                f"{self.describe()} did not finish its promotion within {PROMOTE_SECONDS} s"
            )

    def identity(self) -> Identity:
        try:
            [(system_identifier, started_at, rewindable)] = self.execute(IDENTITY_SQL)
        except psycopg.Error as error:
            raise PostgresError(f"{self.describe()} does not answer: {error}") from None
        return Identity(int(system_identifier), str(started_at), bool(rewindable))

    def checkpoint(self) -> None:
        self.execute(
            "SELECT set_config('statement_timeout', %s, false)", [f"{CHECKPOINT_SECONDS:g}s"]
        )
        self.execute("CHECKPOINT", timeout=CHECKPOINT_SECONDS + 5)
        self.execute("RESET statement_timeout")

    def checkpoint_if_behind(self) -> None:
        """Make the (primary) server's control file show its current
        timeline, which pg_rewind reads: a server promoted moments ago shows
        its former one until its first checkpoint."""
        [(current, checkpointed)] = self.execute(TIMELINES_SQL)
        if current != checkpointed:
            logger.info(
                "ha: %s is on timeline %s but its last checkpoint is on %s: asking for one",
                self.describe(),
                current,
                checkpointed,
            )
            self.checkpoint()
            [(current, checkpointed)] = self.execute(TIMELINES_SQL)
            if current != checkpointed:
                raise PostgresError(
                    f"{self.describe()} still shows timeline {checkpointed} after a checkpoint"
                )

    def kill(self) -> None:
        """SIGKILL the server's postmaster and every process of it: a server
        that does not answer (frozen, wedged) is stopped for good, even a
        stopped process. It starts again only when the node starts it."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        logger.warning("ha: killing %s (postmaster %s)", self.describe(), pid)
        for target in (pid, *_children(pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGKILL)
        self.disconnect()

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self._data() / "postmaster.pid").read_text().split()[0])
        return None

    def ensure_slot(self, name: str) -> None:
        self.execute(
            """
            SELECT pg_create_physical_replication_slot(%s, true)
            WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s)
            """,
            [name, name],
        )

    def wait_replayed(self, standby: str, lsn: int) -> bool:
        """Whether standby ``standby`` has replayed up to ``lsn``."""
        rows = self.execute(
            "SELECT replay_lsn - '0/0' FROM pg_stat_replication WHERE application_name = %s",
            [standby],
        )
        return bool(rows) and rows[0][0] is not None and int(rows[0][0]) >= lsn

    def describe(self) -> str:
        params = conninfo_to_dict(self.conninfo)
        return f"PostgreSQL at {params.get('host', 'localhost')}:{params.get('port', 5432)}"

    # -- the server's files (own server only) --------------------------------

    def _data(self) -> Path:
        if self.pgdata is None:
            raise PostgresError(
                "this node does not manage its PostgreSQL server (HA_PGDATA is not set)"
            )
        return self.pgdata

    def _tool(self, name: str) -> str:
        if self.bindir is not None:
            return str(self.bindir / name)
        found = shutil.which(name)
        if found:
            return found
        versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
        if versions:
            return str(versions[0])
        raise PostgresError(f"{name} not found: set HA_PG_BINDIR")

    def run(self, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run PostgreSQL tool ``name`` as the cluster's owner."""
        command = [self._tool(name), *args]
        if self.os_user and os.geteuid() == 0:
            command = ["runuser", "-u", self.os_user, "--", *command]
        level = logging.DEBUG if name == "pg_ctl" and args[:1] == ("status",) else logging.INFO
        logger.log(level, "ha: running %s", " ".join(_redact(command)))
        result = subprocess.run(  # noqa: S603 - PostgreSQL's own tools, arguments from settings
            command,
            capture_output=True,
            text=True,
            cwd="/",
            timeout=TOOL_TIMEOUT_SECONDS,
            check=False,
        )
        if check and result.returncode != 0:
            raise PostgresError(
                f"{name} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]}"
            )
        return result

    def has_data(self) -> bool:
        return (self._data() / "PG_VERSION").is_file()

    def running(self) -> bool:
        return self.run("pg_ctl", "status", "-D", str(self._data()), check=False).returncode == 0

    def start(self) -> None:
        args = ["start", "-D", str(self._data()), "-w", "-t", "120"]
        port = conninfo_to_dict(self.conninfo).get("port")
        options = " ".join(part for part in (f"-p {port}" if port else "", self.options) if part)
        if options:
            args += ["-o", options]
        if self.log_file is not None:
            # pg_ctl opens the log as the cluster's owner: the file is made
            # here and handed over, so its directory may be any.
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self.log_file.touch()
            self._chown(self.log_file)
            args += ["-l", str(self.log_file)]
        self.disconnect()
        self.run("pg_ctl", *args)

    def stop(self, mode: str = "fast") -> None:
        self.disconnect()
        if self.running():
            result = self.run(
                "pg_ctl", "stop", "-D", str(self._data()), "-m", mode, "-w", "-t", "60", check=False
            )
            if result.returncode != 0 and mode != "immediate":
                self.run("pg_ctl", "stop", "-D", str(self._data()), "-m", "immediate", "-w")

    def edit_auto_conf(self, values: dict[str, str | None]) -> None:
        """Set (or, with None, remove) settings in postgresql.auto.conf of
        the stopped server."""
        path = self._data() / "postgresql.auto.conf"
        lines = path.read_text().splitlines() if path.exists() else []
        names = {name.lower() for name in values}
        kept = [line for line in lines if line.split("=", 1)[0].strip().lower() not in names]
        for name, value in values.items():
            if value is not None:
                kept.append(f"{name} = '{value.replace(chr(39), chr(39) * 2)}'")
        path.write_text("\n".join(kept) + "\n")
        self._chown(path)

    def write_standby_config(self, *, primary_conninfo: str, slot: str) -> None:
        """Make the stopped server a standby of ``primary_conninfo``, with
        nothing else of the managed settings left from before or copied
        from the source."""
        reset: dict[str, str | None] = dict.fromkeys(MANAGED_SETTINGS)
        reset.update(
            {
                "primary_conninfo": primary_conninfo,
                "primary_slot_name": slot,
                # The primary judges the standby alive by its replies, and a
                # restarted primary is followed again within a second.
                "wal_receiver_status_interval": f"{STATUS_INTERVAL_SECONDS}s",
                "wal_retrieve_retry_interval": f"{STATUS_INTERVAL_SECONDS}s",
            }
        )
        self.edit_auto_conf(reset)
        (self._data() / "standby.signal").touch()
        self._chown(self._data() / "standby.signal", self._data() / "postgresql.auto.conf")

    def fence_stopped(self) -> None:
        """Fence the stopped server for its next start."""
        self.edit_auto_conf({"default_transaction_read_only": "on"})

    def rewind(self, *, source_conninfo: str) -> None:
        """pg_rewind the stopped server onto ``source_conninfo``'s timeline
        (after crash recovery, which pg_rewind runs itself when needed)."""
        self.run(
            "pg_rewind",
            "--target-pgdata",
            str(self._data()),
            "--source-server",
            source_conninfo,
        )

    def clone(self, *, source_conninfo: str, slot: str) -> None:
        """Fill the (empty or missing) data directory with a base backup of
        ``source_conninfo``, streaming WAL through slot ``slot``."""
        data = self._data()
        if data.exists():
            for child in data.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        self.run(
            "pg_basebackup",
            "--pgdata",
            str(data),
            "--dbname",
            source_conninfo,
            "--wal-method",
            "stream",
            "--slot",
            slot,
            "--checkpoint",
            "fast",
        )

    def _chown(self, *paths: Path) -> None:
        if self.os_user and os.geteuid() == 0:
            for path in paths:
                shutil.chown(path, user=self.os_user)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a postmaster's backends)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces and parentheses.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _redact(command: list[str]) -> list[str]:
    return [re.sub(r"password=\S+", "password=***", part) for part in command]
