"""The fork server the rig starts its Python processes from (rig.forkserver):
a forked command runs as ``python`` would run it, in its own environment,
directory, arguments and streams, and is waited on, polled and signalled as
a ``subprocess.Popen``; what it cannot start so runs as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig import forkserver

pytestmark = pytest.mark.slow

REPORT = textwrap.dedent(
    """
    import json, os, sys
    import django.conf
    import prometheus_client.values
    import helper_of_the_test
    print(json.dumps({
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "colour": os.environ.get("COLOUR"),
        "helper": helper_of_the_test.NAME,
        "settings_configured": django.conf.settings.configured,
        "metrics_values": prometheus_client.values.ValueClass.__name__,
    }))
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("EXIT", "0")))
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[forkserver.ForkServer]:
    """The session's fork server, or one of the module's own when the
    session runs without (LAZARETTO_TEST_FORK_SERVER=0)."""
    if forkserver.SERVER is not None:
        yield forkserver.SERVER
        return
    own = forkserver.ForkServer(log=tmp_path_factory.mktemp("fork-server") / "server.log")
    yield own
    own.stop()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """REPORT, and on PYTHONPATH (``helpers``) the module it imports."""
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "helper_of_the_test.py").write_text("NAME = 'found'\n")
    path = tmp_path / "report.py"
    path.write_text(REPORT)
    return path


def test_a_script_runs_with_its_arguments_environment_directory_and_exit_code(
    server, script, tmp_path
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [sys.executable, str(script), "one", "two"]
    env = {
        **os.environ,
        "COLOUR": "teal",
        "EXIT": "3",
        "PYTHONPATH": str(tmp_path / "helpers"),
        # prometheus_client reads it as it is imported: the server must
        # not have imported it for the child (it imports wsgiref.handlers,
        # which copies the whole environment).
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    assert server.accepts(args, env, {"cwd": elsewhere})

    with (tmp_path / "out").open("w+b") as out, (tmp_path / "err").open("w+b") as err:
        process = server.popen(args, env=env, cwd=elsewhere, stdout=out, stderr=err)
        assert isinstance(process, forkserver.ForkedProcess)
        assert process.wait(timeout=60) == 3
        out.seek(0)
        err.seek(0)
        report = json.loads(out.read().decode())
        assert err.read().decode() == "to stderr\n"

    assert report == {
        "argv": [str(script), "one", "two"],
        "cwd": str(elsewhere),
        "path0": str(tmp_path),
        "colour": "teal",
        "helper": "found",
        "settings_configured": False,
        "metrics_values": "MmapedValue",
    }


def test_a_module_runs_as_python_dash_m_runs_it(server, tmp_path):
    document = tmp_path / "document.json"
    document.write_text('{"b": 1, "a": [2]}')

    args = [sys.executable, "-m", "json.tool", "--sort-keys", str(document)]
    assert server.accepts(args, dict(os.environ), {})

    done = server.run(args, env=dict(os.environ))

    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        '{\n    "a": [\n        2\n    ],\n    "b": 1\n}\n',
        "",
    )


def test_a_forked_process_is_polled_signalled_and_waited_on_as_a_popen(server, tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    with (tmp_path / "out").open("wb") as out:
        process = server.popen(
            [sys.executable, str(sleeper)],
            env=dict(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    assert os.getpgid(process.pid) == process.pid  # a session of its own

    process.send_signal(signal.SIGKILL)

    assert process.wait(timeout=30) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL
    process.kill()  # a finished process is left alone, as Popen leaves it


def test_what_the_server_cannot_start_as_python_would_runs_as_a_subprocess(server, script):
    interpreter_option = [sys.executable, "-X", "dev", str(script)]
    other_warnings = {**os.environ, "PYTHONWARNINGS": "error"}
    assert not server.accepts(interpreter_option, dict(os.environ), {})
    assert not server.accepts([sys.executable, str(script)], other_warnings, {})
    assert not server.accepts([sys.executable, str(script)], dict(os.environ), {"stdout": -1})
    assert not server.accepts(["/bin/true"], dict(os.environ), {})

    started = forkserver.popen(["/bin/true"], stdout=subprocess.DEVNULL)

    assert isinstance(started, subprocess.Popen)
    assert started.wait(timeout=30) == 0
