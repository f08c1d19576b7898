"""A Spark Connect server for the Spark jobs, from the pyspark package
(its jars/spark-connect_*.jar), started the way `make run` and the test
suite start it:

    python -m workers.spark.connect_server serve [--port 15002] [--bind 127.0.0.1]
        [--log FILE] [--scratch DIR]
    python -m workers.spark.connect_server wait sc://127.0.0.1:15002 [--pid PID] [--timeout 180]

``serve`` becomes the server's JVM (spark-submit, in the foreground: stop it
with SIGTERM): SPARK_MASTER (local[*] by default), PostgreSQL's JDBC driver
(SPARK_JDBC_JAR) on its classpath, Lazaretto's Spark settings, and scratch
space under var/spark-connect/. Its executors run this virtualenv's Python,
which has what the jobs send them (pyarrow, the rules package).
``wait`` returns once the server takes connections, or fails saying why.
Point the drivers at it with SPARK_REMOTE=sc://host:port.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import pyspark
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workers.spark.session import CONNECT_PORT, connect_address, yield_to_deliveries

ROOT = Path(__file__).resolve().parent.parent.parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# An operation no client is attached to any more (its client died) is
# interrupted after this long (Spark's default is five minutes).
DETACHED_TIMEOUT = "30s"


def spark_home() -> Path:
    return Path(pyspark.__file__).resolve().parent


def scratch_dir(port: int) -> Path:
    """The server's scratch space (spark.local.dir, its warehouse) by default."""
    return ROOT / "var" / "spark-connect" / str(port)


def server_command(
    port: int, *, bind: str = "127.0.0.1", jdbc: bool = True, scratch: Path | None = None
) -> list[str]:
    """spark-submit running the Spark Connect server on ``bind``:``port``,
    its scratch space in ``scratch`` (default: ``scratch_dir(port)``);
    ``jdbc`` puts PostgreSQL's JDBC driver on its classpath."""
    jars = []
    if jdbc:
        jar = Path(settings.SPARK_JDBC_JAR)
        if not jar.is_file():
            raise ImproperlyConfigured(
                f"SPARK_JDBC_JAR: {jar} is not there; run scripts/spark.sh "
                "(Debian's libpostgresql-jdbc-java) or point SPARK_JDBC_JAR at the driver's jar."
            )
        jars = ["--jars", str(jar)]
    scratch = scratch or scratch_dir(port)
    conf = {
        "spark.connect.grpc.binding.address": bind,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.execute.manager.detachedTimeout": DETACHED_TIMEOUT,
        "spark.connect.execute.manager.maintenanceInterval": "5s",
        "spark.local.dir": str(scratch),
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.driver.memory": settings.LAZARETTO_SPARK_DRIVER_MEMORY,
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.LAZARETTO_SPARK_PARTITIONS),
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }
    if settings.LAZARETTO_SPARK_JAVA_OPTIONS:
        conf["spark.driver.extraJavaOptions"] = settings.LAZARETTO_SPARK_JAVA_OPTIONS
    return [
        str(spark_home() / "bin" / "spark-submit"),
        *("--class", SERVER_CLASS),
        *("--name", "Lazaretto Spark Connect server"),
        *("--master", settings.SPARK_MASTER),
        *jars,
        *(item for name, value in conf.items() for item in ("--conf", f"{name}={value}")),
    ]


def server_env(bind: str = "127.0.0.1") -> dict[str, str]:
    """The server's environment: its Python workers run this virtualenv's
    Python; on loopback, Spark's own sockets stay there too."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_HOME": str(spark_home())}
    env.pop("SPARK_REMOTE", None)
    if bind.startswith("127.") or bind == "localhost":
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def serve(port: int, bind: str, log: Path | None = None, scratch: Path | None = None) -> None:
    """Become the server (exec), at LAZARETTO_SPARK_NICENESS: its process
    is this one, so a SIGTERM to it, or to its process group, stops it. Its
    output goes to ``log`` (appended) when given."""
    scratch = scratch or scratch_dir(port)
    command = server_command(port, bind=bind, scratch=scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        os.close(descriptor)
    yield_to_deliveries()
    os.execve(command[0], command, server_env(bind))  # noqa: S606 - our own command line


def answering(url: str) -> bool:
    try:
        socket.create_connection(connect_address(url), timeout=1).close()
    except OSError:
        return False
    return True


def wait_for_server(url: str, *, timeout: float, pid: int | None = None) -> str | None:
    """Wait until the server at ``url`` takes connections; None then, else
    why not (it exited, or it did not answer in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answering(url):
            return None
        if pid is not None and not _alive(pid):
            return f"the Spark Connect server (pid {pid}) exited before it answered at {url}"
        time.sleep(0.5)
    return f"the Spark Connect server did not answer at {url} within {timeout:.0f} s"


def _alive(pid: int) -> bool:
    try:
        waited, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        waited = 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    if waited == pid:
        return False
    # A zombie is dead too (its parent has not reaped it yet).
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.spark.connect_server")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="run the server in the foreground")
    run.add_argument("--port", type=int, default=CONNECT_PORT)
    run.add_argument("--bind", default="127.0.0.1")
    run.add_argument("--log", type=Path, help="append the server's output to this file")
    run.add_argument("--scratch", type=Path, help="scratch space (var/spark-connect/PORT)")
    wait = commands.add_parser("wait", help="wait until a server answers")
    wait.add_argument("url")
    wait.add_argument("--pid", type=int)
    wait.add_argument("--timeout", type=float, default=180.0)
    options = parser.parse_args(argv)
    if options.command == "serve":
        try:
            serve(options.port, options.bind, options.log, options.scratch)
        except ImproperlyConfigured as error:
            print(f"spark-connect: {error}", file=sys.stderr)
            return 1
    problem = wait_for_server(options.url, timeout=options.timeout, pid=options.pid)
    if problem:
        print(f"spark-connect: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    sys.exit(main(sys.argv[1:]))
