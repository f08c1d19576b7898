"""The Spark session and the JDBC connection the jobs share."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import zipfile
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from pyspark.sql import DataFrame, SparkSession

ROOT = Path(__file__).resolve().parent.parent.parent
# Rows per JDBC round trip, reading and writing; with reWriteBatchedInserts the
# driver turns each write batch into a few multi-row INSERTs.
FETCH_ROWS = 10_000
WRITE_BATCH_ROWS = 10_000


# A Spark Connect server's default port (Spark's own).
CONNECT_PORT = 15002
# How long a driver waits for a Spark Connect server to take its connection,
# and how long its calls keep retrying once the server stops answering: a
# job on a server that is gone fails within seconds, naming the address.
CONNECT_TIMEOUT_SECONDS = 5.0
CONNECT_RETRIES = 4


def yield_to_deliveries() -> None:
    """Run this process, and the JVM and Python workers it starts, at
    LAZARETTO_SPARK_NICENESS: a Spark job's start-up takes both cores of a
    small host for seconds, and a delivery worker beside it would wait for
    the processor, a poison message's innocent batch-mates with it. A
    process already nicer is left as it is (lowering it needs privilege)."""
    niceness = int(settings.LAZARETTO_SPARK_NICENESS)
    if os.getpriority(os.PRIO_PROCESS, 0) < niceness:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)


class SparkUnreachable(Exception):
    """The Spark Connect server SPARK_REMOTE names does not answer."""


def spark_session(app_name: str) -> SparkSession:
    """The jobs' session: a client of the Spark Connect server SPARK_REMOTE
    names when it is set (no JVM here), else a driver of its own on
    SPARK_MASTER. Either way PostgreSQL's JDBC driver is on the classpath
    that runs the job and the rules package reaches every executor."""
    if settings.SPARK_REMOTE:
        return _connect_session(app_name, settings.SPARK_REMOTE)
    return _classic_session(app_name)


def _classic_session(app_name: str) -> SparkSession:
    """A session on SPARK_MASTER with PostgreSQL's JDBC driver and the rules
    package on every executor. Its files (the rules zip, Spark's scratch
    space) go to one temporary directory of this driver, removed when it
    exits (``_scratch``)."""
    jar = Path(settings.SPARK_JDBC_JAR)
    if not jar.is_file():
        raise ImproperlyConfigured(
            f"SPARK_JDBC_JAR: {jar} is not there; run scripts/spark.sh "
            "(Debian's libpostgresql-jdbc-java) or point SPARK_JDBC_JAR at the driver's jar."
        )
    # pyspark takes a SPARK_REMOTE in the environment (even an empty one) for
    # a Spark Connect URL.
    os.environ.pop("SPARK_REMOTE", None)
    master = settings.SPARK_MASTER
    if master.startswith("local"):
        # One machine: keep Spark's own sockets on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    scratch = _scratch()
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.local.dir", str(scratch / "spark"))
        .config("spark.jars", str(jar))
        .config("spark.driver.memory", settings.LAZARETTO_SPARK_DRIVER_MEMORY)
        .config("spark.driver.extraJavaOptions", settings.LAZARETTO_SPARK_JAVA_OPTIONS)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.LAZARETTO_SPARK_PARTITIONS))
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )
    _stop_at_exit(spark)
    spark.sparkContext.setLogLevel("WARN")
    spark.sparkContext.addPyFile(str(_rules_zip(scratch)))
    return spark


def _connect_session(app_name: str, url: str) -> SparkSession:
    """A new session on the Spark Connect server at ``url``: the job's plans
    run there (JDBC reads and writes too, so the server has PostgreSQL's
    JDBC driver and reaches DATABASE_URL's hosts as this process does), the
    rules package goes there as an artifact, and every operation carries
    the tag ``app_name``, which names the job in the server's logs."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    _same_database_from_the_server(url)
    _answering(url)
    scratch = _scratch()
    spark = SparkSession.builder.remote(url).create()
    _stop_at_exit(spark)
    # The client's own policy retries an unanswered call for ten minutes.
    spark.client.set_retry_policies(
        [
            DefaultPolicy(
                max_retries=CONNECT_RETRIES,
                initial_backoff=200,
                backoff_multiplier=2.0,
                max_backoff=2000,
                jitter=100,
            )
        ]
    )
    spark.addTag(app_name)
    for name, value in {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.LAZARETTO_SPARK_PARTITIONS),
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }.items():
        spark.conf.set(name, value)
    spark.addArtifacts(str(_rules_zip(scratch)), pyfile=True)
    return spark


def connect_address(url: str) -> tuple[str, int]:
    """The host and port of a Spark Connect URL (sc://host[:port]/;…)."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or CONNECT_PORT


def _answering(url: str) -> None:
    """Refuse at once, naming the address, when nothing takes a connection
    at ``url`` (the client alone would retry for minutes)."""
    try:
        socket.create_connection(connect_address(url), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as error:
        raise SparkUnreachable(
            f"SPARK_REMOTE: the Spark Connect server at {url} does not answer ({error})"
        ) from None


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _same_database_from_the_server(url: str) -> None:
    """A server on another machine reaches DATABASE_URL's hosts itself: a
    loopback address would be its own machine, not PostgreSQL's."""
    if _loopback(connect_address(url)[0]):
        return
    hosts = str(connection.settings_dict["HOST"] or "127.0.0.1").split(",")
    for host in hosts:
        if _loopback(host):
            raise ImproperlyConfigured(
                f"DATABASE_URL: {host} is this machine's own address, which the Spark "
                f"Connect server at {url} (SPARK_REMOTE) would take for its own; name "
                "PostgreSQL by an address both reach."
            )


def spark_app_id(spark: SparkSession) -> str:
    """What names a job's Spark application: the driver's application id;
    on a Spark Connect server, which many jobs share, the server's
    application id and this job's session id."""
    if settings.SPARK_REMOTE:
        return f"{spark.conf.get('spark.app.id')}/{spark.session_id}"  # type: ignore[attr-defined]
    return str(spark.sparkContext.applicationId)


def interrupt_on_sigterm(spark: SparkSession) -> None:
    """A driver stopped with SIGTERM (a cancel) first interrupts what it
    asked a Spark Connect server to run, which would otherwise go on there
    (a JDBC write, say) after this client is gone. Classic drivers need
    nothing: their JVM stops with them."""
    if not settings.SPARK_REMOTE:
        return

    def interrupt(signum: int, frame: object) -> None:
        with contextlib.suppress(Exception):
            spark.interruptAll()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupt)


def spark_failure(error: BaseException) -> str:
    """What a failed job says: Spark's error, or, for what an operator
    fixes in the set-up, what to fix."""
    text = str(error)
    remote = settings.SPARK_REMOTE
    if isinstance(error, SparkUnreachable):
        return text
    if "org.postgresql.Driver" in text or "No suitable driver" in text:
        if remote:
            return (
                f"the Spark Connect server at {remote} (SPARK_REMOTE) has no PostgreSQL JDBC "
                f"driver ({_first_line(text)}): start it with --jars {settings.SPARK_JDBC_JAR} "
                "(spark.jars), as python -m workers.spark.connect_server does with SPARK_JDBC_JAR"
            )
        return f"SPARK_JDBC_JAR: Spark found no PostgreSQL JDBC driver ({_first_line(text)})"
    if remote and _unanswered(error):
        return (
            f"SPARK_REMOTE: the Spark Connect server at {remote} stopped answering "
            f"({_first_line(text)})"
        )
    return text


def _unanswered(error: BaseException) -> bool:
    import grpc
    from pyspark.errors.exceptions.base import RetriesExceeded
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, RetriesExceeded | SparkUnreachable):
            return True
        if isinstance(seen, grpc.RpcError) and seen.code() == grpc.StatusCode.UNAVAILABLE:
            return True
        if isinstance(seen, SparkConnectGrpcException) and "UNAVAILABLE" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _stop_at_exit(spark: SparkSession) -> None:
    """Stop the session when the driver exits: a Spark Connect session is
    released, and the server interrupts what it still runs for it."""
    atexit.register(spark.stop)


def _scratch() -> Path:
    """A temporary directory for this driver's files, removed when the
    driver exits, once its session has stopped writing there (made before
    the session, so removed after its stop: atexit runs last in, first out)."""
    directory = Path(tempfile.mkdtemp(prefix="lazaretto-spark-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _rules_zip(scratch: Path) -> Path:
    """broker/rules (standard library only) as a zip for the executors."""
    target = scratch / "broker_rules.zip"
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("broker/__init__.py", "")
        for path in sorted((ROOT / "broker" / "rules").glob("*.py")):
            archive.write(path, f"broker/rules/{path.name}")
    return target


# DATABASE_URL's libpq settings that PostgreSQL's JDBC driver understands,
# under the driver's names; the others have no JDBC counterpart.
_JDBC_PROPERTIES = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    # The driver reads a PKCS-8 (DER) or PKCS-12 key, not libpq's PEM one.
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "options": "options",
    "keepalives": "tcpKeepAlive",
    "target_session_attrs": "targetServerType",
}
_SERVER_TYPES = {
    "any": "any",
    "read-write": "primary",
    "primary": "primary",
    "read-only": "secondary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
}


def jdbc_url(database: dict[str, Any] | None = None) -> str:
    """The JDBC URL of ``database`` (Django's DATABASES entry; default: the
    connection's), every host of a multi-host DATABASE_URL included."""
    db = database or connection.settings_dict
    hosts = str(db["HOST"] or "127.0.0.1").split(",")
    ports = str(db["PORT"] or "").split(",")
    if any(host.startswith("/") for host in hosts):
        raise ImproperlyConfigured(
            "DATABASE_URL: the Spark jobs reach PostgreSQL over TCP; give a host name, "
            "not a socket directory."
        )
    ports = ports if len(ports) == len(hosts) else ports[:1] * len(hosts)
    servers = ",".join(f"{host}:{port or 5432}" for host, port in zip(hosts, ports, strict=True))
    return f"jdbc:postgresql://{servers}/{db['NAME']}"


def jdbc_options(database: dict[str, Any] | None = None) -> dict[str, Any]:
    """What Spark's JDBC source and sink get: the URL, the credentials and
    the driver's properties for DATABASE_URL's TLS, timeout and target
    settings (Spark hands every option it does not know to the driver)."""
    db = database or connection.settings_dict
    options: dict[str, Any] = {
        "url": jdbc_url(db),
        "user": db["USER"],
        "password": db["PASSWORD"],
        "driver": "org.postgresql.Driver",
    }
    for name, value in (db.get("OPTIONS") or {}).items():
        property_name = _JDBC_PROPERTIES.get(name)
        if property_name is None or value in (None, ""):
            continue
        if name == "keepalives":
            value = "true" if str(value) == "1" else "false"
        elif name == "target_session_attrs":
            value = _SERVER_TYPES.get(str(value), "any")
        options[property_name] = str(value)
    return options


def read_range(spark: SparkSession, query: str, first: int, last: int) -> DataFrame:
    """Rows of ``query`` with ids in [first, last], read by
    LAZARETTO_SPARK_PARTITIONS connections, each an id range of its own."""
    partitions = max(1, min(settings.LAZARETTO_SPARK_PARTITIONS, last - first + 1))
    return (
        spark.read.format("jdbc")
        .options(**jdbc_options())
        .option("dbtable", f"({query} AND m.id BETWEEN {int(first)} AND {int(last)}) AS src")
        .option("partitionColumn", "id")
        .option("lowerBound", int(first))
        .option("upperBound", int(last) + 1)
        .option("numPartitions", partitions)
        .option("fetchsize", FETCH_ROWS)
        .load()
    )


def write_table(frame: DataFrame, table: str) -> None:
    """Append ``frame`` to an existing table in batched multi-row INSERTs."""
    options = jdbc_options()
    options["url"] += "?reWriteBatchedInserts=true"
    (
        frame.write.format("jdbc")
        .options(**options)
        .option("dbtable", table)
        .option("batchsize", WRITE_BATCH_ROWS)
        .mode("append")
        .save()
    )
