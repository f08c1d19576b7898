"""The Spark session and the JDBC connection the jobs share."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from pyspark.sql import DataFrame, SparkSession

ROOT = Path(__file__).resolve().parent.parent.parent
# Rows per JDBC round trip, reading and writing; with reWriteBatchedInserts the
# driver turns each write batch into a few multi-row INSERTs.
FETCH_ROWS = 10_000
WRITE_BATCH_ROWS = 10_000


def spark_session(app_name: str) -> SparkSession:
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
    spark.sparkContext.setLogLevel("WARN")
    spark.sparkContext.addPyFile(str(_rules_zip(scratch)))
    return spark


def _scratch() -> Path:
    """A temporary directory for this driver's files, removed when the
    driver exits, once its session has stopped writing there."""
    directory = Path(tempfile.mkdtemp(prefix="lazaretto-spark-"))

    def remove() -> None:
        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
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
