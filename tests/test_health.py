"""/healthz and /readyz as a load balancer sees them: a real gunicorn serving
the console with production settings, its database or Redis or a migration
missing, probed over plain http without logging in."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.db.migrations.loader import MigrationLoader

from rig.processes import ROOT, database_url_for_workers, free_port, wait_until
from tests.support.databases import throwaway_database
from tests.support.processes import manage

pytestmark = pytest.mark.slow


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body, redirects not followed."""
    try:
        with urllib.request.build_opener(NoRedirect).open(url, timeout=15) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


class Server:
    """gunicorn as scripts/run.sh starts it, with production settings: DEBUG
    off, a real secret key, HTTPS redirects and HSTS on."""

    def __init__(self, log: Path, **env: str) -> None:
        self.port = free_port()
        self.log = log
        environment = {key: value for key, value in os.environ.items() if key != "DEBUG"}
        environment.update(
            SECRET_KEY=secrets.token_urlsafe(50),
            ALLOWED_HOSTS="127.0.0.1",
            WEB_WORKERS="1",
            **env,
        )
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "gunicorn", "-c", "python:console.gunicorn_conf"),
                    *("--bind", f"127.0.0.1:{self.port}", "console.wsgi:application"),
                ],
                cwd=ROOT,
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._up, timeout=30, what="gunicorn to answer /healthz")

    def _up(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            return self.get("/healthz")[0] == 200
        except OSError:
            return False

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return get(f"http://127.0.0.1:{self.port}{path}")

    def json(self, path: str) -> tuple[int, dict]:
        status, _, body = self.get(path)
        return status, json.loads(body)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    servers: list[Server] = []

    def start(**env: str) -> Server:
        servers.append(Server(tmp_path / f"gunicorn-{len(servers)}.log", **env))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def closed_port() -> int:
    return free_port()  # bound a moment ago and released: nothing listens there


def test_a_server_with_everything_up_is_ready(db, serve):
    server = serve(DATABASE_URL=database_url_for_workers())

    status, body = server.json("/readyz")

    assert status == 200
    assert body == {
        "status": "ready",
        "checks": {"database": {"ok": True}, "migrations": {"ok": True}, "redis": {"ok": True}},
    }


def test_healthz_answers_without_the_database_and_readyz_names_it(serve):
    url = urlsplit(os.environ["DATABASE_URL"])._replace(
        netloc=f"lazaretto:secret-password@127.0.0.1:{closed_port()}"
    )
    server = serve(DATABASE_URL=url.geturl())

    status, headers, body = server.get("/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    assert headers["Cache-Control"].startswith("max-age=0")

    status, body = server.json("/readyz")
    assert status == 503
    assert body["status"] == "unavailable"
    assert body["checks"]["database"]["ok"] is False
    assert "connecting within 2 s failed" in body["checks"]["database"]["error"]
    assert body["checks"]["migrations"] == {"ok": False, "error": "database unreachable"}
    assert body["checks"]["redis"] == {"ok": True}
    # Nothing sensitive: no password, no address.
    assert "secret-password" not in json.dumps(body)
    assert "127.0.0.1" not in json.dumps(body)


def test_readyz_names_redis_when_the_broker_is_unreachable(db, serve):
    server = serve(
        DATABASE_URL=database_url_for_workers(),
        CELERY_BROKER_URL=f"redis://127.0.0.1:{closed_port()}/0",
    )

    status, body = server.json("/readyz")

    assert status == 503
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["migrations"] == {"ok": True}
    assert body["checks"]["redis"]["ok"] is False
    assert "PING within 2 s failed" in body["checks"]["redis"]["error"]


@pytest.fixture
def one_step_behind(db) -> Iterator[tuple[str, str]]:
    """A throwaway database migrated to the end (a copy of the suite's
    migrated template), then the newest broker migration taken back;
    yields its URL and that migration's name."""
    newest, previous = sorted(
        migration for app, migration in MigrationLoader(None).disk_migrations if app == "broker"
    )[-1:-3:-1]
    name = f"lazaretto_readyz_{os.getpid()}"
    with throwaway_database(database_url_for_workers(), name, migrated=True) as throwaway:
        migrated = manage(
            "migrate", "broker", previous, "--noinput", timeout=300, DATABASE_URL=throwaway
        )
        assert migrated.returncode == 0, migrated.stderr
        yield throwaway, newest


def test_readyz_names_an_unapplied_migration(one_step_behind, serve):
    url, newest = one_step_behind
    server = serve(DATABASE_URL=url)

    status, body = server.json("/readyz")

    assert status == 503
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["migrations"] == {"ok": False, "error": f"1 unapplied: broker.{newest}"}


def test_the_probes_answer_plain_http_while_the_console_redirects_to_https(db, serve):
    server = serve(DATABASE_URL=database_url_for_workers())

    assert server.get("/healthz")[0] == 200
    assert server.get("/readyz")[0] == 200
    status, headers, _ = server.get("/login/")
    assert status == 301
    assert headers["Location"].startswith("https://")


def test_with_log_format_json_every_server_line_is_json(db, serve):
    server = serve(DATABASE_URL=database_url_for_workers(), LOG_FORMAT="json")

    server.get("/readyz")
    server.stop()

    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line]
    access = [line for line in lines if line["logger"] == "gunicorn.access"]
    assert any("GET /readyz" in line["event"] for line in access)
    assert {"timestamp", "level", "logger", "event", "worker"} <= access[0].keys()
