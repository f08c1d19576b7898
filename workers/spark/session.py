"""The Spark session and the JDBC connection the jobs share."""

from __future__ import annotations

import os
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
    package on every executor."""
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
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
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
    spark.sparkContext.addPyFile(str(_rules_zip()))
    return spark


def _rules_zip() -> Path:
    """broker/rules (standard library only) as a zip for the executors."""
    target = Path(tempfile.mkdtemp(prefix="lazaretto-spark-")) / "broker_rules.zip"
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("broker/__init__.py", "")
        for path in sorted((ROOT / "broker" / "rules").glob("*.py")):
            archive.write(path, f"broker/rules/{path.name}")
    return target


def jdbc_url() -> str:
    db = connection.settings_dict
    host = db["HOST"] or "127.0.0.1"
    if host.startswith("/"):
        raise ImproperlyConfigured(
            "DATABASE_URL: the Spark jobs reach PostgreSQL over TCP; give a host name, "
            "not a socket directory."
        )
    return f"jdbc:postgresql://{host}:{db['PORT'] or 5432}/{db['NAME']}"


def jdbc_options() -> dict[str, Any]:
    db = connection.settings_dict
    return {
        "url": jdbc_url(),
        "user": db["USER"],
        "password": db["PASSWORD"],
        "driver": "org.postgresql.Driver",
    }


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
