"""`make run` on a database of its own: migrates, loads the demo, prints the
admin password, serves the login page and runs the Spark jobs on a Spark
Connect server of its own."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from rig.processes import ROOT, free_port
from tests.support.databases import throwaway_database
from workers.spark.connect_server import answering

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def fresh_database_url():
    name = f"lazaretto_make_run_{os.getpid()}"
    with throwaway_database(os.environ["DATABASE_URL"], name) as url:
        yield url


def fetch(url: str) -> tuple[int, str]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location", "")


def processes_in_session(session: int) -> list[tuple[int, str]]:
    """The pids and command lines of the processes in session ``session``."""
    processes = []
    for pid in pids_in_session(session):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            processes.append((pid, command))
    return processes


def commands_in_session(session: int) -> list[str]:
    """The command lines of the processes in session ``session``."""
    return [command for _pid, command in processes_in_session(session)]


def environment_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


def wait_for(condition, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def node_roles(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return [(name, role) for name, role in conn.execute("SELECT name, role FROM broker_node")]


def test_make_run_serves_the_login_page(fresh_database_url, tmp_path):
    port = free_port()
    spark_port = free_port()
    log = tmp_path / "make-run.log"
    env = {
        **{key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"},
        "DATABASE_URL": fresh_database_url,
        "PORT": str(port),
        "HA_LISTEN": f"127.0.0.1:{free_port()}",
        "SPARK_CONNECT_PORT": str(spark_port),
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            ["make", "run"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        status, body = 0, ""
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, body = fetch(f"http://127.0.0.1:{port}/login/")
                break
            except OSError:
                time.sleep(0.5)
        output = log.read_text()
        assert status == 200, f"no login page; make run said:\n{output[-3000:]}"
        assert 'name="password"' in body
        assert re.search(r"admin\s+password: \S+", output)
        assert fetch(f"http://127.0.0.1:{port}/") == (302, "/login/?next=/")
        # gunicorn serves it, the static files through whitenoise, the
        # health probe without a login, its access log in make run's output.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.headers["Server"].startswith("gunicorn")
            assert json.loads(response.read()) == {"status": "ok"}
        status, css = fetch(f"http://127.0.0.1:{port}/static/css/console.css")
        assert status == 200
        assert css
        assert any("gunicorn" in command for command in commands_in_session(process.pid))
        assert "runserver" not in " ".join(commands_in_session(process.pid))
        wait_for(lambda: '"GET /healthz HTTP/1.1" 200' in log.read_text(), "the access log line")
        # One broker node alone sends the duties, as primary of a pair of one.
        assert any("broker_node" in command for command in commands_in_session(process.pid))
        wait_for(lambda: node_roles(fresh_database_url) == [("local", "primary")], "the node")
        # A Spark Connect server of its own, answering before the pipeline
        # worker starts, which alone is pointed at it.
        remote = f"sc://127.0.0.1:{spark_port}"
        assert f"run: the Spark Connect server answers at {remote}" in output
        assert any("SparkConnectServer" in command for command in commands_in_session(process.pid))
        assert answering(remote)
        pipeline = [
            pid for pid, command in processes_in_session(process.pid) if "-Q pipeline" in command
        ]
        assert pipeline
        for pid in pipeline:
            assert f"SPARK_REMOTE={remote}" in environment_of(pid)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        end_session(process.pid)


def end_session(session: int) -> None:
    """Wait for make run's processes to stop (its script stops them, SIGKILL
    after 10 s); SIGKILL any still in its session after 20 s, so that none
    outlives the test (a fixture drops their database next)."""
    deadline = time.monotonic() + 20
    while pids_in_session(session) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in pids_in_session(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pids_in_session(session: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session:
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def test_make_run_says_why_when_its_spark_connect_server_cannot_start(fresh_database_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spark_port = taken.getsockname()[1]
        env = {
            **{key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"},
            "DATABASE_URL": fresh_database_url,
            "PORT": str(free_port()),
            "HA_LISTEN": f"127.0.0.1:{free_port()}",
            "SPARK_CONNECT_PORT": str(spark_port),
        }
        result = subprocess.run(
            ["make", "run"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=True,
        )
    assert result.returncode != 0
    assert f"run: error: port {spark_port}, the Spark Connect server's, is taken" in result.stderr
    assert "gunicorn" not in result.stdout + result.stderr
