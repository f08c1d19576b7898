"""Python processes forked from a server that has imported the libraries once.

Every Celery worker, ``manage.py`` command or server the suite starts is a
new interpreter that imports Django, Celery, DRF, psycopg and the rest
before it does anything of its own: three quarters of a second of
processor time each, half of a set of Celery workers' start-up, and the
fast tier alone starts about ninety of them.
A fork server (a "zygote", as Android calls its own) imports those libraries
once per pytest process; each process the rig starts is then forked from it
and runs its command (``python -m celery …``, ``python manage.py …``) with
``runpy`` as the interpreter would, in its own environment, directory,
session and standard streams. Nothing that reads the environment is
imported before the fork: the server never configures Django's settings
(a module whose import touches them is left for the child to import), so
each process reads its settings, loads the project and fails or starts
exactly as a process of its own would.

The server then hides what it imported from the garbage collector
(``gc.freeze``): a child's collections would otherwise go over, and so
copy, every page of it, which took back all the fork had saved.

The server learns what to import from a child it forks at start-up, which
sets Django up and imports the project's Celery app, command line and
URLconf, and reports the modules it then holds: the list stays current as
the project and its dependencies change.

What the fork server cannot start as the interpreter would (a command with
interpreter options, pipes to read, another ``PYTHON*`` setting), ``popen``
and ``run`` start as subprocesses, as they do when no server is in use
(``LAZARETTO_TEST_FORK_SERVER=0``, and every bench).

The server is a child of the process that uses it and talks to it over a
socket pair: a request carries the command, its environment and the
standard streams' descriptors, the answer the child's pid; each child's
exit status comes back on a socket of its own, which ``ForkedProcess``
reads as ``subprocess.Popen`` reads ``waitpid``. The server exits when its
user closes the pair.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent

# What a forked child takes from its environment as a new interpreter
# would; the other PYTHON* variables, the locale's and the time zone act as
# the interpreter starts, so a command whose environment sets one of them
# otherwise than the server's runs as a subprocess.
APPLIED_IN_THE_CHILD = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE"}
LOCALE_AND_TIME_ZONE = {"LANG", "LANGUAGE", "TZ"}


def _fixed_at_start(name: str) -> bool:
    if name in APPLIED_IN_THE_CHILD:
        return False
    return name.startswith(("PYTHON", "LC_")) or name in LOCALE_AND_TIME_ZONE


# What a child with Django set up imports, for the server to import before
# any fork (``_harvest``): the project's Celery app, Celery's command line,
# worker, beat and Redis transport, and the console's URLconf, which
# reaches the API, its schema and the views.
HARVESTED = (
    "workers",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.worker.consumer.consumer",
    "celery.concurrency.prefork",
    "kombu.transport.redis",
    "console.urls",
    "django.core.management.commands.check",
)
PROJECT_PACKAGES = {"broker", "console", "workers", "demo_consumers", "rig", "tests", "bench"}
MESSAGE_SIZE = 1 << 20


class Process(Protocol):
    """What the rig and the tests use of a child process: ``subprocess.Popen``
    and ``ForkedProcess`` both are one."""

    args: Any
    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class ForkedProcess:
    """A child of the fork server, used as a ``subprocess.Popen``: its exit
    status arrives on ``status`` when the server has reaped it."""

    def __init__(self, args: Sequence[str], pid: int, status: socket.socket) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self._status = status

    def _collect(self, timeout: float | None) -> bool:
        self._status.settimeout(timeout)
        try:
            data = self._status.recv(64)
        except (BlockingIOError, TimeoutError):
            return False
        self._status.close()
        if not data:
            raise RuntimeError(f"the fork server ended before reporting process {self.pid}")
        self.returncode = os.waitstatus_to_exitcode(int(data))
        return True

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._collect(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _descriptor(value: Any, default: int) -> int | None:
    """The descriptor a Popen stream argument names; None for one the fork
    server cannot give (a pipe)."""
    if value is None:
        return default
    if value == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR)
    if isinstance(value, int):
        return value if value >= 0 else None
    return int(value.fileno())


class ForkServer:
    """The fork server of this process, started by the first command it is
    asked about."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        # The server's environment, and the variables its imports read.
        self._environ: dict[str, str] = {}
        self._read: set[str] = set()

    def accepts(
        self, args: Sequence[str], env: Mapping[str, str], kwargs: Mapping[str, Any]
    ) -> bool:
        """Whether ``popen(args, env=env, **kwargs)`` can be forked as the
        interpreter would start it: ``python -m module`` or ``python script``,
        no pipes, and the variables read as the interpreter started or as
        the server imported the libraries as they are in the server."""
        python_script = len(args) >= 2 and not args[1].startswith("-")
        python_module = len(args) >= 3 and args[1] == "-m"
        if not args or args[0] != sys.executable or not (python_script or python_module):
            return False
        if set(kwargs) - {"cwd", "stdin", "stdout", "stderr", "start_new_session"}:
            return False
        streams = (kwargs.get("stdin"), kwargs.get("stdout"), kwargs.get("stderr"))
        if subprocess.PIPE in streams:
            return False
        with self._lock:
            if self._control is None:
                self._start()
        fixed = {name for name in {*env, *self._environ} if _fixed_at_start(name)}
        return all(env.get(name) == self._environ.get(name) for name in fixed | self._read)

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "rig.forkserver", str(theirs.fileno())],
                cwd=ROOT,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=[theirs.fileno()],
            )
        theirs.close()
        ours.settimeout(120)
        try:
            ready = json.loads(ours.recv(MESSAGE_SIZE) or b"null")
        except (TimeoutError, ValueError):
            ready = None
        ours.settimeout(None)
        if not isinstance(ready, dict):
            self._process.kill()
            self._process.wait()
            raise RuntimeError(f"the fork server did not start; see {self.log}")
        self._control = ours
        self._environ = environ
        self._read = set(ready["environment_read"])

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def popen(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        start_new_session: bool = False,
    ) -> ForkedProcess:
        out = _descriptor(stdout, 1)
        err = out if stderr == subprocess.STDOUT else _descriptor(stderr, 2)
        streams = [_descriptor(stdin, 0), out, err]
        assert None not in streams, "the fork server takes no pipes (see accepts)"
        request = {
            "argv": list(args[1:]),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "new_session": start_new_session,
        }
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                if self._control is None:
                    self._start()
                assert self._control is not None
                fds = [fd for fd in streams if fd is not None] + [theirs.fileno()]
                socket.send_fds(self._control, [json.dumps(request).encode()], fds)
                answer = self._control.recv(64)
        finally:
            theirs.close()
            for value, fd in zip((stdin, stdout, stderr), streams, strict=True):
                if value == subprocess.DEVNULL and fd is not None:
                    os.close(fd)
        if not answer:
            raise RuntimeError(f"the fork server has ended; see {self.log}")
        return ForkedProcess(args, int(answer), ours)

    def run(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``args`` forked and waited for, its output captured as text."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            process = self.popen(args, env=env, cwd=cwd, stdout=out, stderr=err)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise
            texts = []
            for stream in (out, err):
                stream.seek(0)
                texts.append(stream.read().decode(errors="replace"))
        return subprocess.CompletedProcess(list(args), process.wait(), texts[0], texts[1])


# The fork server the rig's processes start from, when the test session
# has one (tests/conftest.py); None elsewhere.
SERVER: ForkServer | None = None


def popen(args: Sequence[str], **kwargs: Any) -> Process:
    """``subprocess.Popen(args, **kwargs)``, forked from the fork server
    when there is one and it can start the command as the interpreter would."""
    env = kwargs.pop("env", None)
    environ = dict(os.environ if env is None else env)
    if SERVER is not None and SERVER.accepts(args, environ, kwargs):
        return SERVER.popen(args, env=environ, **kwargs)
    return subprocess.Popen(args, env=environ, **kwargs)


def run(
    args: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True, ...)``, the
    process forked from the fork server when there is one and it can
    start the command as the interpreter would."""
    environ = dict(os.environ if env is None else env)
    if SERVER is not None and SERVER.accepts(args, environ, {"cwd": cwd}):
        return SERVER.run(args, env=environ, cwd=cwd, timeout=timeout)
    return subprocess.run(
        args, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout
    )


# --- the server ----------------------------------------------------------------------


def _harvest() -> list[str]:
    """The modules a child holds once it has set Django up and imported
    HARVESTED, in the order it imported them; the child is thrown away."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        names: list[str] = []
        try:
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
            import django

            django.setup()
            for name in HARVESTED:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
            names = list(sys.modules)
        except BaseException:
            traceback.print_exc()
        finally:
            with os.fdopen(write, "w") as pipe:
                pipe.write("\n".join(names))
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        names = pipe.read().split()
    os.waitpid(pid, 0)
    return names


class _RecordingEnviron(os._Environ[str]):
    """``os.environ`` noting the names read, for ``_preload``, and whether
    something read all of it (``all_read``)."""

    def __init__(self, environ: os._Environ[str]) -> None:
        super().__init__(
            environ._data,  # type: ignore[attr-defined]
            environ.encodekey,
            environ.decodekey,
            environ.encodevalue,
            environ.decodevalue,
        )
        self.read: set[str] = set()
        self.all_read = False

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return str(super().__getitem__(key))

    def __iter__(self) -> Iterator[str]:
        self.all_read = True
        return super().__iter__()


def _preload(names: list[str]) -> set[str]:
    """Import the libraries among ``names``, none that touches Django's
    settings or copies the whole environment: with no settings module
    named, such an import fails, and one that swallows the failure or
    reads every variable (``wsgiref.handlers`` keeps a copy for its
    requests) is taken out again with all it brought in; the child imports
    them. Returns the variables the imports kept read, which a child's
    environment must then hold as the server's does (``ForkServer.accepts``)."""
    from django.conf import LazySettings

    touched = False
    setup = LazySettings._setup  # type: ignore[attr-defined]

    def refused(self: LazySettings, name: str | None = None) -> None:
        nonlocal touched
        touched = True
        setup(self, name)

    environ = os.environ
    recording = _RecordingEnviron(environ)
    LazySettings._setup = refused  # type: ignore[attr-defined]
    os.environ = recording  # noqa: B003 (noting reads, restored below)
    try:
        for name in names:
            if name.split(".")[0] in PROJECT_PACKAGES or name in sys.modules:
                continue
            before, read = set(sys.modules), set(recording.read)
            touched = recording.all_read = False
            try:
                importlib.import_module(name)
            except Exception:  # noqa: S112 (the child imports it, and says why if it fails)
                continue
            finally:
                if touched or recording.all_read:
                    for added in set(sys.modules) - before:
                        del sys.modules[added]
                    recording.read = read
    finally:
        LazySettings._setup = setup  # type: ignore[attr-defined]
        os.environ = environ  # noqa: B003
    from django.conf import settings

    assert not settings.configured, "the fork server configured Django's settings"
    assert threading.active_count() == 1, "a thread would not survive the forks"
    return recording.read


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In a forked child: take the request's streams, session, directory,
    environment and command line, and run the command as ``python`` would."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds[:3]):
        if fd > 2:
            os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    python_path = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    argv = request["argv"]
    if argv[0] == "-m":
        sys.path[:] = [os.getcwd(), *python_path, *_LIBRARY_PATH]
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[:] = [str(Path(argv[0]).resolve().parent), *python_path, *_LIBRARY_PATH]
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


# The server's sys.path after its own directory and PYTHONPATH.
_LIBRARY_PATH: list[str] = []


def _serve(control: socket.socket, read: set[str]) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a child for each request on ``control`` and report each child's
    exit; returns in a child (its request and streams), None when ``control``
    closes."""
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    control.send(json.dumps({"environment_read": sorted(read)}).encode())
    while True:
        for key, _ in selector.select():
            if key.fileobj is wake_read:
                with contextlib.suppress(BlockingIOError):
                    wake_read.recv(4096)
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    if pid in children:
                        with children.pop(pid) as status_socket, contextlib.suppress(OSError):
                            status_socket.send(str(status).encode())
                continue
            message, fds, _flags, _address = socket.recv_fds(control, MESSAGE_SIZE, 4)
            if not message:
                return None
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                selector.close()
                for sock in (control, wake_read, wake_write, *children.values()):
                    sock.close()
                os.close(fds[3])
                return json.loads(message), fds[:3]
            for fd in set(fds[:3]):
                os.close(fd)
            children[pid] = socket.socket(fileno=fds[3])
            control.send(str(pid).encode())


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    own_path = {path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path}
    _LIBRARY_PATH[:] = [path for path in sys.path[1:] if path not in own_path]
    read = _preload(_harvest())
    # What was imported stays as it is in every child: out of the garbage
    # collector's sight, whose passes would otherwise write to (and so copy)
    # the pages of every object the server holds.
    gc.freeze()
    child = _serve(control, read)
    if child is not None:
        _become(*child)


if __name__ == "__main__":
    main()
