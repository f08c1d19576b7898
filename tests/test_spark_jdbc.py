"""The Spark jobs reach PostgreSQL as DATABASE_URL says: every host of a
multi-host URL, and the TLS, timeout and target settings the JDBC driver
understands; a job's read goes over TLS to a server that takes nothing else."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rig.ha import PASSWORD, PG_OS_USER, ROLE, Cluster, as_owner
from workers.spark.session import jdbc_options, jdbc_url


def database(**options: Any) -> dict[str, Any]:
    return {
        "NAME": "lazaretto",
        "USER": "u",
        "PASSWORD": "p",
        "HOST": "db-a,db-b",
        "PORT": "5432,5433",
        "OPTIONS": options,
    }


def test_every_host_of_a_multi_host_url_is_in_the_jdbc_url() -> None:
    assert jdbc_url(database()) == "jdbc:postgresql://db-a:5432,db-b:5433/lazaretto"
    one = {**database(), "HOST": "db", "PORT": ""}
    assert jdbc_url(one) == "jdbc:postgresql://db:5432/lazaretto"


def test_the_drivers_properties_follow_the_urls_libpq_settings() -> None:
    options = jdbc_options(
        database(
            sslmode="verify-full",
            sslrootcert="/etc/lazaretto/ca.pem",
            sslcert="/etc/lazaretto/client.pem",
            connect_timeout=2,
            application_name="lazaretto-spark",
            target_session_attrs="read-write",
            keepalives=1,
            tcp_user_timeout=4000,  # no JDBC counterpart: left out
            options="-c client_connection_check_interval=1000",
        )
    )
    assert options == {
        "url": "jdbc:postgresql://db-a:5432,db-b:5433/lazaretto",
        "user": "u",
        "password": "p",
        "driver": "org.postgresql.Driver",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/lazaretto/ca.pem",
        "sslcert": "/etc/lazaretto/client.pem",
        "connectTimeout": "2",
        "ApplicationName": "lazaretto-spark",
        "targetServerType": "primary",
        "tcpKeepAlive": "true",
        "options": "-c client_connection_check_interval=1000",
    }


def test_a_socket_directory_is_refused_with_the_setting_named() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL: the Spark jobs reach"):
        jdbc_url({**database(), "HOST": "/var/run/postgresql"})


@pytest.fixture
def tls_only_cluster() -> Iterator[Cluster]:
    """A PostgreSQL server with TLS on (a self-signed certificate) that
    refuses every connection without it."""
    if os.geteuid() == 0:
        base = Path(tempfile.mkdtemp(prefix="lazaretto-tls-", dir="/tmp"))
        shutil.chown(base, user=PG_OS_USER)
    else:
        base = Path(tempfile.mkdtemp(prefix="lazaretto-tls-"))
    (base / "run").mkdir()
    if os.geteuid() == 0:
        shutil.chown(base / "run", user=PG_OS_USER)
    cluster = Cluster("tls", base)
    try:
        cluster.initdb()
        made = as_owner(
            "openssl",
            *("req", "-new", "-x509", "-days", "2", "-nodes", "-subj", "/CN=127.0.0.1"),
            *("-keyout", str(cluster.data / "server.key")),
            *("-out", str(cluster.data / "server.crt")),
        )
        assert made.returncode == 0, made.stderr
        (cluster.data / "server.key").chmod(0o600)
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write("ssl = on\n")
        hba = cluster.data / "pg_hba.conf"
        hba.write_text("hostnossl all all 0.0.0.0/0 reject\n" + hba.read_text())
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.spark
def test_a_spark_read_goes_over_tls_when_the_url_asks_for_it(tls_only_cluster: Cluster) -> None:
    from workers.spark.session import spark_session

    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(tls_only_cluster.url, sslmode="disable", connect_timeout=3).close()
    db = {
        "NAME": "postgres",
        "USER": ROLE,
        "PASSWORD": PASSWORD,
        "HOST": tls_only_cluster.host,
        "PORT": str(tls_only_cluster.port),
        "OPTIONS": {
            "sslmode": "verify-full",
            "sslrootcert": str(tls_only_cluster.data / "server.crt"),
            "application_name": "lazaretto-tls-test",
        },
    }
    spark = spark_session("lazaretto-test-tls")

    def read(database: dict[str, Any]) -> list[Any]:
        return (
            spark.read.format("jdbc")
            .options(**jdbc_options(database))
            .option(
                "query",
                "SELECT s.ssl, a.application_name FROM pg_stat_ssl s "
                "JOIN pg_stat_activity a ON a.pid = s.pid WHERE s.pid = pg_backend_pid()",
            )
            .load()
            .collect()
        )

    try:
        rows = read(db)
        # The URL's sslmode reaches the driver: without TLS the server refuses.
        with pytest.raises(Exception, match="no encryption"):
            read({**db, "OPTIONS": {"sslmode": "disable"}})
    finally:
        spark.stop()
        logging.getLogger("py4j").setLevel(logging.WARNING)
    assert [(row["ssl"], row["application_name"]) for row in rows] == [(True, "lazaretto-tls-test")]
