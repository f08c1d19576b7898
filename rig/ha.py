"""Real processes for HA tests: two PostgreSQL clusters (A made with
initdb and migrated, B cloned from it by its node), two broker nodes
(``manage.py broker_node``) that own them, and what the tests send through
them.

The clusters belong to the unprivileged user scripts/services.sh creates
(PostgreSQL refuses to run as root); they live under a directory that user
can reach, removed at the end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from broker.errors import BrokerError
from broker.ha import wire
from rig.netns import Network
from rig.processes import ROOT, Workers, _alive, free_port, wait_until

PG_OS_USER = "lazaretto"
PASSWORD = "ha-test-password"
ROLE = "lazaretto"
DATABASE = "lazaretto"
SECRET = "ha-test-secret-key"
# The tests' heartbeat: a failover is due 4 s after the primary falls silent.
INTERVAL = 0.5
TIMEOUT = 4.0
DISCOVERY = 3.0


def pg_bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), reverse=True)
    assert versions, "PostgreSQL is missing: scripts/services.sh installs it"
    return versions[0].parent


def as_owner(
    *command: str, prefix: tuple[str, ...] = (), **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as the clusters' owner (behind ``prefix``: a network
    namespace's ``ip netns exec``)."""
    if os.geteuid() == 0:
        command = ("runuser", "-u", PG_OS_USER, "--", *command)
    return subprocess.run(
        (*prefix, *command), capture_output=True, text=True, cwd="/", check=False, **kwargs
    )


@dataclass
class Cluster:
    name: str
    base: Path
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    # What starts the server in its network namespace (rig.netns).
    prefix: tuple[str, ...] = ()

    @property
    def data(self) -> Path:
        return self.base / f"data-{self.name}"

    @property
    def sockets(self) -> Path:
        return self.base / "run"

    @property
    def log(self) -> Path:
        return self.base / f"postgres-{self.name}.log"

    @property
    def url(self) -> str:
        return f"postgres://{ROLE}:{PASSWORD}@{self.host}:{self.port}/{DATABASE}"

    @property
    def options(self) -> str:
        return f"-k {self.sockets} -c listen_addresses={self.host}"

    def connect(self, timeout: int = 3) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=timeout)

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        with self.connect() as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def answers(self) -> bool:
        try:
            self.query("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None

    def initdb(self, *, durable: bool = False) -> None:
        """Make the cluster; ``fsync = off`` for the tests' speed unless ``durable``."""
        password_file = self.base / "pw"
        password_file.write_text(PASSWORD + "\n")
        shutil.chown(password_file, user=PG_OS_USER) if os.geteuid() == 0 else None
        result = as_owner(
            str(pg_bindir() / "initdb"),
            *("-D", str(self.data), "-U", ROLE, "-E", "UTF8", "--no-locale"),
            *("--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={password_file}"),
        )
        assert result.returncode == 0, result.stderr
        with (self.data / "pg_hba.conf").open("a") as hba:
            # The nodes of rig.netns reach each other's server from their
            # namespaces' addresses.
            hba.write(
                "host all all 10.213.0.0/16 scram-sha-256\n"
                "host replication all 10.213.0.0/16 scram-sha-256\n"
            )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\nwal_log_hints = on\nmax_wal_senders = 10\nmax_replication_slots = 10\n"
                "max_slot_wal_keep_size = 1GB\nwal_keep_size = 1GB\nshared_buffers = 64MB\n"
                + ("" if durable else "fsync = off\n")
                + "wal_sender_timeout = 5s\nwal_receiver_status_interval = 1s\n"
            )

    def start(self) -> None:
        result = as_owner(
            str(pg_bindir() / "pg_ctl"),
            *("start", "-D", str(self.data), "-w", "-l", str(self.log)),
            *("-o", f"-p {self.port} {self.options}"),
            prefix=self.prefix,
        )
        assert result.returncode == 0, result.stderr + self.log.read_text()

    def start_alone(self) -> None:
        """Start the server by hand, not waiting for any synchronous standby."""
        result = as_owner(
            str(pg_bindir() / "pg_ctl"),
            *("start", "-D", str(self.data), "-w", "-l", str(self.log)),
            *("-o", f"-p {self.port} {self.options} -c synchronous_standby_names="),
            prefix=self.prefix,
        )
        assert result.returncode == 0, result.stderr + self.log.read_text()

    def processes(self) -> list[int]:
        """The postmaster and every process it started."""
        pid = self.postmaster_pid()
        if pid is None:
            return []
        children = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [pid, *map(int, children)]

    def freeze(self) -> list[int]:
        """SIGSTOP the postmaster (first: it forks no backend after) and every
        process it started, skipping one that exits meanwhile; the stopped."""
        pid = self.postmaster_pid()
        if pid is None:
            return []
        stopped = []
        for target in [pid, *self.processes()[1:]]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGSTOP)
                stopped.append(target)
        return stopped

    @staticmethod
    def thaw(stopped: list[int]) -> None:
        for target in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGCONT)

    def signal(self, signum: int) -> None:
        for target in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signum)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (a crash)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        self.signal(signal.SIGKILL)
        wait_until(lambda: not _alive(pid), timeout=10, what=f"postgres {self.name} to die")

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            as_owner(str(pg_bindir() / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate")


class WritableProbe(threading.Thread):
    """Asks both servers every 100 ms whether they take a read-write
    session (a frozen one, which answers nothing, takes none), and keeps
    the moments both did."""

    def __init__(self, *clusters: Cluster) -> None:
        super().__init__(daemon=True)
        self.clusters = clusters
        self.both_writable: list[float] = []
        self.probes = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            writable = [self._writable(cluster) for cluster in self.clusters]
            self.probes += 1
            if all(writable):
                self.both_writable.append(time.monotonic())
            time.sleep(0.1)

    @staticmethod
    def _writable(cluster: Cluster) -> bool:
        async def check() -> None:
            conn = await psycopg.AsyncConnection.connect(
                cluster.url, autocommit=True, target_session_attrs="read-write"
            )
            async with conn:
                await conn.execute("SELECT 1")

        try:
            asyncio.run(asyncio.wait_for(check(), 0.5))
            return True
        except (psycopg.Error, OSError, TimeoutError):
            return False

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


@dataclass
class NodeProcess:
    name: str
    cluster: Cluster
    peer: Cluster
    listen: int
    peer_listen: int
    log: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.cluster.host}:{self.listen}"

    def start(self, **extra_env: str) -> None:
        env = {**self.env, **extra_env}
        self.process = subprocess.Popen(
            [*self.cluster.prefix, sys.executable, "manage.py", "broker_node", "--name", self.name],
            cwd=ROOT,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signum)

    def status(self) -> dict[str, Any] | None:
        """What the node answers (in process: no Django start-up per look)."""
        try:
            return wire.call(self.address, "status", secret=SECRET.encode(), timeout=2.0)
        except BrokerError:
            return None

    def manage(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )


@dataclass
class Pair:
    base: Path
    a: NodeProcess
    b: NodeProcess
    redis_url: str
    network: Network | None = None

    @property
    def nodes(self) -> tuple[NodeProcess, NodeProcess]:
        return self.a, self.b

    @property
    def app_url(self) -> str:
        """What applications use: both servers, the read-write one wins."""
        a, b = self.a.cluster, self.b.cluster
        return (
            f"postgres://{ROLE}:{PASSWORD}@{a.host}:{a.port},{b.host}:{b.port}/{DATABASE}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def app_env(self) -> dict[str, str]:
        return {**self.a.env, "DATABASE_URL": self.app_url}

    def role_of(self, node: NodeProcess) -> str | None:
        status = node.status()
        return None if status is None else str(status["role"])

    def wait_roles(self, roles: dict[str, str], timeout: float = 60) -> None:
        def reached() -> bool:
            return all(
                self.role_of(node) == roles[node.name] for node in self.nodes if node.name in roles
            )

        try:
            wait_until(reached, timeout=timeout, interval=0.1, what=f"roles {roles}")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.logs()}") from None

    def logs(self) -> str:
        return "\n".join(
            f"--- {node.name}\n" + node.log.read_text(errors="replace")[-6000:]
            for node in self.nodes
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.cluster.stop()


def process_env() -> dict[str, str]:
    """What every process of a pair gets from the tests' own environment."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HA_", "PYTEST"))},
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "SECRET_KEY": SECRET,
    }


_MIGRATED: dict[bool, Path] = {}


def migrated_cluster(*, durable: bool) -> Path:
    """The data directory of a cluster made with initdb and migrated, cleanly
    shut down: each pair starts from a copy of it (made once per process,
    removed at exit) rather than paying initdb and every migration again."""
    if durable not in _MIGRATED:
        base = Path(tempfile.mkdtemp(prefix="lazaretto-ha-template-", dir="/tmp"))
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        if os.geteuid() == 0:
            shutil.chown(base, user=PG_OS_USER)
        (base / "run").mkdir()
        if os.geteuid() == 0:
            shutil.chown(base / "run", user=PG_OS_USER)
        template = Cluster("T", base)
        template.initdb(durable=durable)
        template.start()
        try:
            with psycopg.connect(
                f"postgres://{ROLE}:{PASSWORD}@127.0.0.1:{template.port}/postgres",
                autocommit=True,
            ) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
            migrate = subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                cwd=ROOT,
                env={**process_env(), "DATABASE_URL": template.url},
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
            )
            assert migrate.returncode == 0, migrate.stderr
        finally:
            stopped = as_owner(str(pg_bindir() / "pg_ctl"), "stop", "-D", str(template.data))
        assert stopped.returncode == 0, stopped.stderr
        _MIGRATED[durable] = template.data
    return _MIGRATED[durable]


def _nodes_env(redis_url: str, dump_dir: Path) -> dict[str, str]:
    """What both nodes of a pair get: the tests' heartbeat, secret and tools."""
    return {
        **process_env(),
        "CELERY_BROKER_URL": redis_url,
        "DUMP_DIR": str(dump_dir),
        "HA_SECRET": SECRET,
        "HA_HEARTBEAT_INTERVAL": str(INTERVAL),
        "HA_HEARTBEAT_TIMEOUT": str(TIMEOUT),
        "HA_DISCOVERY_TIMEOUT": str(DISCOVERY),
        "HA_PG_OS_USER": PG_OS_USER if os.geteuid() == 0 else "",
        "HA_PG_BINDIR": str(pg_bindir()),
        "LAZARETTO_SWEEP_INTERVAL_SECONDS": "0.5",
        "LAZARETTO_DISPATCH_INTERVAL_SECONDS": "0.5",
    }


def _node_env(
    common: dict[str, str], me: Cluster, peer: Cluster, listen: int, peer_listen: int
) -> dict[str, str]:
    """One node's: its own server, where it and its peer listen."""
    return {
        **common,
        "DATABASE_URL": me.url,
        "HA_LISTEN": f"{me.host}:{listen}",
        "HA_PEER": f"{peer.host}:{peer_listen}",
        "HA_PEER_DATABASE_URL": peer.url,
        "HA_PGDATA": str(me.data),
        "HA_PG_OPTIONS": me.options,
        "HA_PG_LOG": str(me.log),
    }


def _owned_base() -> Path:
    """A new directory for clusters, owned by the servers' OS user."""
    base = Path(tempfile.mkdtemp(prefix="lazaretto-ha-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(base, user=PG_OS_USER)
    (base / "run").mkdir()
    if os.geteuid() == 0:
        shutil.chown(base / "run", user=PG_OS_USER)
    return base


def _copy_migrated(cluster: Cluster, *, durable: bool) -> None:
    copied = as_owner("cp", "-a", str(migrated_cluster(durable=durable)), str(cluster.data))
    assert copied.returncode == 0, copied.stderr


@contextlib.contextmanager
def single_cluster(*, durable: bool = False) -> Iterator[Cluster]:
    """One migrated cluster, started, with no HA node: for a test that
    kills the server under the applications using it."""
    base = _owned_base()
    cluster = Cluster("A", base)
    try:
        _copy_migrated(cluster, durable=durable)
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def ha_pair(
    redis_url: str, *, dump_dir: Path, durable: bool = False, network: Network | None = None
) -> Iterator[Pair]:
    """Cluster A copied from a migrated one, nodes A and B configured (not started);
    B's cluster is an empty directory its node fills from A (with A's
    postgresql.conf). ``durable`` leaves fsync on (the benches); the tests
    turn it off for speed. With a ``network`` (members A and B), each node
    and its server run in the member's namespace, at its address."""
    base = _owned_base()
    a, b = (
        Cluster(name, base)
        if network is None
        else Cluster(name, base, host=network.address(name), prefix=tuple(network.prefix(name)))
        for name in ("A", "B")
    )
    pair = None
    try:
        _copy_migrated(a, durable=durable)
        a.start()
        listen_a, listen_b = free_port(), free_port()
        common = _nodes_env(redis_url, dump_dir)
        node_a = NodeProcess(
            "A",
            a,
            b,
            listen_a,
            listen_b,
            base / "node-A.log",
            _node_env(common, a, b, listen_a, listen_b),
        )
        node_b = NodeProcess(
            "B",
            b,
            a,
            listen_b,
            listen_a,
            base / "node-B.log",
            _node_env(common, b, a, listen_b, listen_a),
        )
        pair = Pair(base=base, a=node_a, b=node_b, redis_url=redis_url, network=network)
        yield pair
    finally:
        if pair is not None:
            pair.stop()
        else:
            a.stop()
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class WebServer:
    """gunicorn on the pair (the multi-host URL), with an admin's API token."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    token: str = ""

    def start(self) -> None:
        env = {
            **self.env,
            "DEBUG": "0",
            "SECURE_SSL_REDIRECT": "0",
            "LAZARETTO_API_RATE": "1000000/s",
        }
        made = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", MAKE_ADMIN_TOKEN],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        self.token = made.stdout.strip().splitlines()[-1]
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "gunicorn", "console.wsgi:application"),
                *("--bind", f"127.0.0.1:{self.port}", "--workers", "2", "--timeout", "30"),
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(lambda: self.get("/healthz")[0] == 200, timeout=60, what="gunicorn")

    def request_with_headers(
        self, method: str, path: str, body: Any = None
    ) -> tuple[int, Any, dict[str, str]]:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": f"Token {self.token}", "Content-Type": "application/json"}
            conn.request(
                method, path, body=None if body is None else json.dumps(body), headers=headers
            )
            response = conn.getresponse()
            data = response.read()
            answer = {k.lower(): v for k, v in response.getheaders()}
            try:
                return response.status, json.loads(data) if data else None, answer
            except ValueError:
                return response.status, data.decode(errors="replace"), answer
        except OSError:
            return 0, None, {}
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, answer, _ = self.request_with_headers(method, path, body)
        return status, answer

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def publish(self, queue: str, payload: str) -> tuple[int, Any]:
        return self.request(
            "POST", f"/api/v1/queues/{queue}/messages/", {"messages": [{"payload": payload}]}
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


MAKE_ADMIN_TOKEN = """
from django.contrib.auth.models import Group, User
from console.tokens import token_create
user, _ = User.objects.get_or_create(username="ha-admin", defaults={"is_superuser": True, "is_staff": True})
print(token_create(user=user, name=f"ha-{User.objects.count()}-{__import__('time').time()}")[1])
"""


# -- what the tests send through the pair ---------------------------------------

QUEUE = "HA.ORDERS"
# Publishes a second of the tests' client (Publisher).
PUBLISH_RATE = 20.0


def start_pair(pair: Pair) -> None:
    pair.a.start()
    pair.b.start()
    pair.wait_roles({"A": "primary", "B": "standby"})
    wait_until(
        lambda: (pair.a.status() or {}).get("mode") == "synchronous",
        timeout=30,
        what="synchronous replication",
    )


def shell(env: dict[str, str], code: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def make_queue(env: dict[str, str]) -> None:
    shell(
        env,
        "from broker.models import Queue; "
        f"Queue.objects.get_or_create(name={QUEUE!r}, defaults={{'consumer': 'demo'}})",
    )


class Publisher(threading.Thread):
    """Publishes p-0, p-1, … one at a time through the API, each retried
    until answered 201 (what a client of a failing-over server does), at
    most ``rate`` a second: flat out, the client, gunicorn and both servers
    took a core between them, which the pair's own heartbeats then lacked."""

    def __init__(self, web: WebServer, rate: float = PUBLISH_RATE) -> None:
        super().__init__(daemon=True)
        self.web = web
        self.interval = 1.0 / rate
        self.acked: list[str] = []
        self.ack_times: list[float] = []
        self.failures = 0
        self.longest_gap = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        number = 0
        last_ack = time.monotonic()
        next_at = time.monotonic()
        while not self.stopping.is_set():
            next_at = max(next_at + self.interval, time.monotonic())
            payload = f"p-{number}"
            status, _ = self.web.publish(QUEUE, payload)
            if status == 201:
                now = time.monotonic()
                self.longest_gap = max(self.longest_gap, now - last_ack)
                last_ack = now
                self.acked.append(payload)
                self.ack_times.append(now)
                number += 1
            else:
                self.failures += 1
                next_at = max(next_at, time.monotonic() + 0.05)
            self.stopping.wait(max(next_at - time.monotonic(), 0.0))

    def gap_around(self, start: float, end: float) -> float:
        """The longest time without a 201, from the last one before ``start``
        to the first after ``end``."""
        times = list(self.ack_times)
        before = [t for t in times if t < start][-1:]
        inside = [t for t in times if start <= t <= end]
        after = [t for t in times if t > end][:1]
        window = before + inside + after
        return max((b - a for a, b in itertools.pairwise(window)), default=0.0)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


def serve_the_pair(pair: Pair, tmp_path: Path) -> tuple[WebServer, Workers]:
    """The pair started and synchronous, the test queue made, gunicorn and
    Celery workers on its multi-host URL, their store waits bounded by the
    heartbeat timeout."""
    start_pair(pair)
    env = pair.app_env()
    make_queue(env)
    web = WebServer(env, tmp_path / "web.log")
    web.start()
    workers = Workers(
        tmp_path,
        pair.redis_url,
        beat=False,
        extra_env={"DATABASE_URL": pair.app_url, "LAZARETTO_STORE_TIMEOUT_SECONDS": str(TIMEOUT)},
    )
    workers.start()
    return web, workers


def payloads_in(pair: Pair, cluster_name: str) -> list[str]:
    cluster = pair.a.cluster if cluster_name == "A" else pair.b.cluster
    rows = cluster.query(
        "SELECT convert_from(m.payload, 'UTF8') FROM broker_message m "
        "JOIN broker_queue q ON q.id = m.queue_id WHERE q.name = %s",
        [QUEUE],
    )
    return [row[0] for row in rows]
