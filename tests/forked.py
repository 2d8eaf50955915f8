"""The suite's ``choir`` commands, forked from a process that has Choir's imports done.

``run([sys.executable, "-m", "choir", ...], ...)`` is ``subprocess.run`` of that command: the
command is a process of its own (its pid, its standard streams, environment, working folder,
exit code and signals), started as ``python -m choir`` starts it, but forked from a server
that imported what a command imports once per test worker, where each cold command paid its
imports again (0.5 s of CPU for a cold ``choir gate``, 2.3 s for a ``choir run`` with
langgraph's, here), as ``choir serve``'s workers share theirs. A command whose start could
differ is started cold: any argv other than ``python -m choir``, a ``PYTHON*`` variable
(which Python reads at its start) set otherwise than when the server started, a folder that
is not there (``subprocess.run``'s error), or all of them with ``CHOIR_TESTS_COLD=1``.

What a cold start is for (``import choir`` stays light, a command's first import of a
module, a process's argv) is tested by tests that start their own interpreter, never
through here; so are the end-to-end scripts' commands.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Sequence
from typing import IO, Any

CHOIR = [sys.executable, "-m", "choir"]
_BASE_ENV = dict(os.environ)  # the environment the server starts with (read at import)
_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], socket.socket] | None = None

# What the server imports: what `choir serve` warms (choir.cli.serve.WARM_MODULES), the
# command line (not litellm: four commands of the suite import it, at 4-5 s each server).
_EXTRA_MODULES = ("choir.cli",)


def run(argv: Sequence[str], *, capture_output: bool = False, text: bool = False,
        timeout: float | None = None, env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None, input: str | bytes | None = None,
        check: bool = False) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, ...)`` with these arguments, a ``choir`` command forked warm."""
    argv = [os.fspath(a) for a in argv]
    environ = dict(os.environ if env is None else env)
    folder = os.fspath(cwd) if cwd is not None else None
    if argv[:3] != CHOIR or not _starts_alike(environ) or (folder and not os.path.isdir(folder)):
        # (a folder that is not there: subprocess.run's own error, raised here)
        return subprocess.run(argv, capture_output=capture_output, text=text, timeout=timeout,
                              env=env, cwd=cwd, input=input, check=check)
    request = {"args": argv[3:], "env": environ,
               "cwd": os.path.abspath(folder or os.getcwd())}
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, \
            tempfile.TemporaryFile() as stderr:
        if input is not None:
            stdin.write(input.encode() if isinstance(input, str) else input)
            stdin.seek(0)
        fds = [stdin.fileno() if input is not None else 0,
               stdout.fileno() if capture_output else 1,
               stderr.fileno() if capture_output else 2]
        try:
            code = _started(request, fds, timeout)
        finally:
            out, err = (_read(stdout, text), _read(stderr, text)) if capture_output else (None,
                                                                                         None)
    if code is None:
        raise subprocess.TimeoutExpired(argv, timeout or 0, out, err)
    done = subprocess.CompletedProcess(argv, code, out, err)
    if check:
        done.check_returncode()
    return done


def _starts_alike(env: dict[str, str]) -> bool:
    """No variable Python reads at its start differs from the server's (bytecode writing
    excepted: the command sets ``sys.dont_write_bytecode`` from it, as Python's start does)."""
    if os.environ.get("CHOIR_TESTS_COLD") == "1":
        return False
    names = {k for k in (*env, *_BASE_ENV) if k.startswith("PYTHON")}
    return all(env.get(k) == _BASE_ENV.get(k) for k in names - {"PYTHONDONTWRITEBYTECODE"})


def _started(request: dict[str, Any], fds: list[int], timeout: float | None) -> int | None:
    """The forked command's exit code; None when it ran past ``timeout`` (killed then)."""
    mine, theirs = socket.socketpair()
    with mine:
        with _lock:
            _send(json.dumps(request).encode(), [*fds, theirs.fileno()])
        theirs.close()
        said = b""
        while b"\n" not in said:  # the pid, said at once as the command is forked
            said += _recv(mine)
        pid, _, said = said.partition(b"\n")
        mine.settimeout(timeout)
        try:
            while not said.endswith(b"\n"):
                said += _recv(mine)
        except TimeoutError:
            os.kill(int(pid), signal.SIGKILL)  # as subprocess.run kills its child, and waits
            mine.settimeout(None)
            while not said.endswith(b"\n"):
                said += _recv(mine)
            return None
        return int(said)


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(64)
    if not chunk:
        raise RuntimeError("the forked command's handler ended before it said its exit code")
    return chunk


def _read(f: IO[bytes], text: bool) -> str | bytes:
    f.seek(0)
    data = f.read()
    if not text:
        return data
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")  # as text=True reads


def _send(request: bytes, fds: list[int]) -> None:
    """To the server, started at the first request and again if it has ended. Whether it
    runs is asked of its socket, not of its pid: a test that reaps every child of its
    process (``choir.serve.server`` run in the test's own) takes the server's exit status."""
    global _server
    for _ in range(2):
        if _server is None:
            _server = _started_server()
        try:
            socket.send_fds(_server[1], [request], fds)
            return
        except (BrokenPipeError, ConnectionResetError):
            _server[1].close()
            _server = None
    raise RuntimeError("the forked commands' server ended at once twice: see its stderr")


def _started_server() -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    code = ("import runpy, sys; del sys.path[0]; "
            f"runpy.run_path({__file__!r}, run_name='forked_server')['serve']({its.fileno()})")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[its.fileno()],
                            env=_BASE_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    its.close()
    atexit.register(ours.close)  # the server reads the end of its requests, and ends
    return proc, ours


# --- the server (its own process) ---------------------------------------------------------

def serve(fd: int) -> None:
    """Import, then fork a handler per request: it forks the command, says its pid, waits
    for it and says its exit code."""
    import importlib

    from choir.cli.serve import WARM_MODULES
    from choir.models._base import build_deferred

    control = socket.socket(fileno=fd)
    for name in (*WARM_MODULES, *_EXTRA_MODULES):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    build_deferred()
    assert threading.active_count() == 1, "a thread in the server would be lost in its forks"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers: reaped by the kernel
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
        if not message:
            os._exit(0)
        if os.fork() == 0:
            try:
                control.close()
                _handle(json.loads(message), fds)
            finally:
                os._exit(1)  # never back into this loop, whatever happened
        for each in fds:
            os.close(each)


def _handle(request: dict[str, Any], fds: list[int]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    *streams, result = fds
    pid = os.fork()
    if pid == 0:
        try:
            os.close(result)
            _command(request, streams)
        except BaseException:  # noqa: BLE001 - said on the command's stderr, exit 1
            traceback.print_exc()
        finally:
            os._exit(1)  # never back into the handler, whatever happened
    for each in streams:
        os.close(each)
    with socket.socket(fileno=result) as reply:
        reply.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        reply.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _command(request: dict[str, Any], streams: list[int]) -> None:
    """``python -m choir ARGS``, in this forked process: its streams, folder, environment,
    path and argv, then the module run as ``__main__`` and the interpreter's exit."""
    import runpy

    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    for fd in set(streams) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    sys.path.insert(0, request["cwd"])  # `python -m` puts the working folder first
    sys.argv = ["-m", *request["args"]]
    code: int = 0
    try:
        runpy.run_module("choir", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - printed and exit 1, as the interpreter does
        traceback.print_exc()
        code = 1
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # non-daemon threads are waited for, as at the interpreter's exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
