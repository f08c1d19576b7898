"""A virtualenv of a bench's own under var/, for what the project does not
require: the peers the peers bench compares with, matplotlib for the charts.
Never requirements.txt or .venv."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path


class VenvError(Exception):
    """pip could not install the requirements."""


def venv_python(directory: Path, requirements: Path) -> Path:
    """``directory``'s interpreter, the venv made and given ``requirements``
    the first time, and again whenever that file changed (the installed copy
    is kept as a stamp)."""
    python = directory / "bin" / "python"
    stamp = directory / ".installed"
    wanted = requirements.read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"creating {directory} from {requirements}", file=sys.stderr, flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(directory)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    install = subprocess.run(
        [*pip, "-r", str(requirements)],
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    # As the Makefile does: pip's "WARNING: Location ... is ignored" lines
    # (this machine's local index configuration) are dropped.
    for line in install.stderr.splitlines():
        if not line.startswith("WARNING: Location"):
            print(line, file=sys.stderr, flush=True)
    if install.returncode:
        raise VenvError(f"pip install -r {requirements} failed")
    stamp.write_text(wanted)
    return python
