"""``manage.py`` run as a child process, as an operator starts it: for what
must stop a process at start-up (``refused_at_start_up``), or a command seen
from outside."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from rig.processes import ROOT


def manage(
    *args: str, environ: Mapping[str, str] | None = None, timeout: float = 60, **overrides: str
) -> subprocess.CompletedProcess[str]:
    """``python manage.py *args`` in the project, its output captured as text.
    Its environment is ``environ``, by default this process's with DEBUG on,
    and ``overrides`` on top."""
    base = {**os.environ, "DEBUG": "1"} if environ is None else environ
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **overrides},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused_at_start_up(
    *args: str, environ: Mapping[str, str] | None = None, timeout: float = 60, **overrides: str
) -> str:
    """What ``manage.py *args`` said on stderr when it stopped at start-up
    (as ``manage`` runs it); fails the test when it ran to the end."""
    result = manage(*args, environ=environ, timeout=timeout, **overrides)
    assert result.returncode != 0, result.stdout
    return result.stderr
