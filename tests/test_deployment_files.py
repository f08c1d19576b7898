"""The deployment files, read as an operator would (no container engine runs
here): the image builds on a Debian release with the Java Spark needs, holds
the runtime requirements only, checks its health and honours WEB_WORKERS;
the application's image has no Java and its Spark jobs run on a Spark
Connect service; compose migrates once before anything else starts, has no
default secret, checks every service's health, publishes the web on loopback
only and runs PostgreSQL with the settings a message store needs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
APP_SERVICES = ("web", "worker", "control", "pipeline", "node", "spark-connect")
DEV_ONLY = ("pytest", "ruff", "mypy", "playwright", "schemathesis", "hypothesis", "django-stubs")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def stages(dockerfile: str) -> list[str]:
    return re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]


def requirement_names(path: Path) -> list[str]:
    names = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "-r")):
            names.append(re.split(r"[\[=<>]", line, maxsplit=1)[0].lower())
    return names


def test_the_image_is_built_on_a_debian_release_whose_java_runs_spark() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM (\S+)", dockerfile, flags=re.MULTILINE)
    assert bases, "no FROM"
    # Debian 12 ships openjdk-17-jre-headless; the floating python:3.11-slim
    # moved to Debian 13, which has none.
    assert all(base in ("python:3.11-slim-bookworm", "runtime") for base in bases), bases
    assert "openjdk-17-jre-headless" in stages(dockerfile)[-1]


def stage(dockerfile: str, name: str) -> str:
    [found] = [
        text for text in stages(dockerfile) if text.split("\n", 1)[0].endswith(f" AS {name}")
    ]
    return found


def test_the_application_image_has_no_java_and_the_spark_image_has_java_and_jdbc() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    runtime, spark = stage(dockerfile, "runtime"), stage(dockerfile, "spark")
    assert "openjdk" not in runtime
    assert "jdbc" not in runtime
    assert spark.startswith("runtime AS spark")
    assert "openjdk-17-jre-headless" in spark
    assert "libpostgresql-jdbc-java" in spark


def test_the_pipeline_runs_its_spark_jobs_on_the_spark_connect_service(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    server = services["spark-connect"]
    assert server["build"]["target"] == "spark"
    command = server["command"]
    assert command[:4] == ["python", "-m", "workers.spark.connect_server", "serve"]
    port = command[command.index("--port") + 1]
    # Every address of its container, which the compose network alone reaches.
    assert command[command.index("--bind") + 1] == "0.0.0.0"  # noqa: S104
    assert f"sc://127.0.0.1:{port}" in server["healthcheck"]["test"]
    pipeline = services["pipeline"]
    assert pipeline["environment"]["SPARK_REMOTE"] == (
        "${SPARK_REMOTE-sc://spark-connect:" + port + "}"
    )
    assert pipeline["depends_on"]["spark-connect"] == {"condition": "service_healthy"}
    # Every other application service (the pipeline's driver too) is Java-free.
    for name in APP_SERVICES:
        if name != "spark-connect":
            assert services[name]["build"]["target"] == "runtime", name
    # The server writes and reads the archive where the application does, and
    # reaches PostgreSQL by the same URL.
    archive = services["pipeline"]["environment"]["ARCHIVE_DIR"]
    assert server["environment"]["ARCHIVE_DIR"] == archive
    assert f"archive:{archive}" in server["volumes"]
    assert f"archive:{archive}" in pipeline["volumes"]
    assert server["environment"]["DATABASE_URL"] == pipeline["environment"]["DATABASE_URL"]


def test_the_runtime_image_holds_the_runtime_requirements_only() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert len(stages(dockerfile)) >= 2, "a build stage and a runtime stage"
    assert "requirements-dev.txt" not in dockerfile
    runtime = requirement_names(ROOT / "requirements.txt")
    assert not [name for name in runtime if name.startswith(DEV_ONLY)], runtime
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev
    assert {"pytest", "ruff", "mypy"} <= set(requirement_names(ROOT / "requirements-dev.txt"))
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"tests", "bench", "rig", ".venv", "var", ".env"} <= set(ignored)


def test_every_requirement_is_pinned() -> None:
    for name in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "-r")):
                assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z\-,]+\])?==[0-9][\w.]*", line), line


def test_the_image_checks_its_health_and_honours_web_workers() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^HEALTHCHECK .*\n?.*readyz", dockerfile, flags=re.MULTILINE)
    [cmd] = re.findall(r"^CMD (.+)$", dockerfile, flags=re.MULTILINE)
    assert "--workers" not in cmd  # console/gunicorn_conf.py reads WEB_WORKERS
    assert "console.gunicorn_conf" in cmd


def test_every_application_service_waits_for_a_one_shot_migrate(compose: dict[str, Any]) -> None:
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"][-2:] == ["migrate", "--noinput"]
    assert migrate["restart"] == "no"
    for name in APP_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        assert "migrate" not in " ".join(map(str, services[name]["command"])), name


def test_secrets_have_no_default(compose: dict[str, Any]) -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for secret in ("SECRET_KEY", "POSTGRES_PASSWORD"):
        uses = re.findall(r"\$\{" + secret + r"([^}]*)\}", text)
        assert uses, secret
        # ${NAME:?message}: compose refuses to start without it, saying so.
        assert all(use.startswith(":?") for use in uses), (secret, uses)
    assert "insecure" not in text.lower()


def test_every_service_checks_its_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    checks = {
        name: " ".join(map(str, services[name]["healthcheck"]["test"]))
        for name in services
        if name != "migrate"
    }
    assert "/readyz" in checks["web"]
    for worker in ("worker", "control", "pipeline"):
        assert "inspect ping" in checks[worker], worker
    assert "broker_node status" in checks["node"]
    assert "pg_isready" in checks["postgres"]
    assert "ping" in checks["redis"]


def test_processes_run_under_an_init_with_one_instance_name(compose: dict[str, Any]) -> None:
    services = compose["services"]
    names = set()
    for name in (*APP_SERVICES, "migrate"):
        assert services[name]["init"] is True, name
        names.add(services[name]["environment"]["LAZARETTO_INSTANCE_NAME"])
    assert len(names) == 1


def test_the_web_is_published_on_loopback_and_the_node_listens_inside(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    [port] = services["web"]["ports"]
    assert port.startswith("${WEB_BIND:-127.0.0.1}:")
    for name, service in services.items():
        if name != "web":
            assert "ports" not in service, name
    assert services["node"]["environment"]["HA_LISTEN"].startswith("127.0.0.1:")


def test_postgresql_runs_with_the_message_stores_settings(compose: dict[str, Any]) -> None:
    command = compose["services"]["postgres"]["command"]
    settings = {part for part in command if "=" in part}
    assert {"autovacuum_naptime=10s", "max_wal_size=8GB", "wal_log_hints=on"} <= settings
    assert not {"fsync=off", "synchronous_commit=off", "full_page_writes=off"} & settings
