"""One request, in a process of its own, standing where a cold command would.

The service forks each worker before any request reaches it (``choir.serve.server``), so a
request pays no fork and no import: the worker waits with Choir imported, its own signing
broker (a copy of the service's, ``choir.trusted.adopt``) and launchers armed in its own
cgroup pairs (``choir.sandbox._cgroups.prearm``). It then answers exactly one request and
exits, so nothing one request did (a module-level cache, a thread, an open store, a change
of directory or environment) is there for the next: each starts from the service's clean
state, as each cold command starts from a clean interpreter.

Before the command runs, the worker checks the request (``choir.serve.wire``), where the
client stands: its root must be the service's own (a client in another mount namespace or a
chroot means other files by the same names), and the working directory is the descriptor it
sent, which the path it sent must name; then it takes the client's environment whole (and
nothing of the service's), its resource limits, umask and that directory, and checks that
the service is not stale for this client (``choir.serve.stale``: its stores, code, start-up
variables and process standing, which a worker inherits from the service and cannot take
from the client). Then it takes its stdin, stdout and stderr, and runs the same function
the cold command runs: what the client's terminal shows, the live view included, is
what the command prints cold, because it is the same code printing on the same descriptors.
The client gets the exit code. A client that goes away is treated the way the command treats
an interruption, and nothing more is written to its terminal: ``verify`` has its sandboxes
killed until it concludes on what they did (like ``choir mcp``, so every run it sealed is
attested and ``choir audit`` stays clean), a ``run`` is interrupted like Ctrl-C (its
checkpoints let ``choir run --resume`` finish it).
"""

from __future__ import annotations

import _thread
import atexit
import json
import os
import resource
import signal
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from choir._core import frames
from choir._core.paths import artifact_dir, choir_home
from choir.sandbox.stop import stop_steps
from choir.serve import place, stale
from choir.serve.wire import MAX_REQUEST, Context, Envelope, Request
from choir.trusted import adopt

REQUEST_WAIT_S = 10.0  # a client that connects and says nothing frees its worker
STOP_EVERY_S = 0.2
PREARM = 2  # launchers armed while idle: a round's first verifiers start without a wait
REASON_MAX = 2000
PLACE_FDS = 3  # the client's working directory, root and mount namespace, with the request
STDIO_FDS = 3  # its stdin, stdout and stderr, once the request is taken
PARSED = "parsed"  # in the service's folder: the configuration files the last request read
PARSED_BYTES = 1 << 16
MODELS = "models"  # in the service's folder: a request used a model client (litellm), and
# whether its worker imported it (``imported``) or had it from the service (``inherited``)
_inherited = {"litellm": False}  # set by ``warm_idle``: what the service had imported


@dataclass(frozen=True)
class Command:
    """How the service runs one command: ``run(request)`` returns its exit code (the
    function the cold command runs, printing on the client's descriptors, its usage errors
    said and turned into exit 2 as the CLI's entry point does); ``interrupt``
    says what a client that goes away means (Ctrl-C, or ``choir mcp``'s way: stop the
    sandboxes and conclude)."""

    run: Callable[[Any], int]
    interrupt: bool = False


@dataclass(frozen=True)
class Service:
    """What every worker is forked knowing: the service's own standing."""

    home: Path
    version: str
    code: str
    start_env: Mapping[str, str]
    root: tuple[int, int]
    commands: Mapping[str, Command]
    artifacts: Path = Path()  # the artifact folder its brokers check (``artifact_dir()``)
    mounts: tuple[int, int] = (0, 0)  # the mount namespace it was started in
    standing: Mapping[str, str] = field(default_factory=dict)  # ``stale.standing()``


@dataclass
class _Link:
    """The connection to the client, shared by the command's thread and the watcher."""

    conn: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)
    gone: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    # held to set ``done`` and to interrupt the command: a run is interrupted only while
    # its command runs, never once it has ended (``_watch``)
    ending: threading.Lock = field(default_factory=threading.Lock)

    def send(self, message: dict[str, Any]) -> None:
        with self.lock:
            if self.gone:
                return
            try:
                frames.send(self.conn, json.dumps(message).encode())
            except OSError:
                self.gone = True


def warm_idle(service: Service) -> None:
    """What an idle worker readies before its request: the bwrap probe every sandbox choice
    asks for (answers a cold process finds the same way), then launchers in cgroup pairs,
    then the interpreters' caches that requests saved since the service read them (its memo
    is older than a file a worker saved: each request parsed it again, 5 ms before its step),
    then the configuration files the last requests read (``choir.yaml``'s parse was 14 ms of
    a request's path to its step, beside the snapshot and sharing its interpreter lock).

    The probe first: it runs in a pair of its own, and one it took from those armed for the
    request (a single-use pool's are not armed again) left the request one short, so its
    first step started while a spare was armed beside it (about ten processes on its path
    to the step)."""
    from choir.sandbox import _cgroups, _interpreter, rewritten
    from choir.sandbox.bwrap import BwrapSandbox

    _inherited["litellm"] = "litellm" in sys.modules
    rewritten.collect()  # what this request's steps miss is made once it has answered
    rewritten.tail()
    BwrapSandbox.available()
    _cgroups.prearm(PREARM, single_use=True)
    _interpreter.preload()  # the caches the last requests saved: the service's memo is older
    _parse_ahead(service)


def _parse_ahead(service: Service) -> None:
    """Parse the configuration files the service's last requests read (``_after`` notes
    them), so that a request for the same bytes finds them parsed."""
    from choir.config import _yaml

    try:
        fd = os.open(place.folder(service.home) / PARSED,
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            paths = json.loads(fh.read(PARSED_BYTES + 1)[:PARSED_BYTES])
    except (OSError, ValueError):
        return
    if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
        _yaml.parse_ahead(paths)


def _note_parsed(service: Service) -> None:
    """Note the configuration files this request read, for the next idle workers."""
    from choir.config import _yaml

    paths = _yaml.parsed()
    if not paths:
        return
    data = json.dumps(paths).encode()
    if len(data) <= PARSED_BYTES:
        _write_note(service, PARSED, data)


def _write_note(service: Service, name: str, data: bytes) -> None:
    """Replace the note ``name`` in the service's folder with ``data`` (0600, whole)."""
    where = place.folder(service.home)
    temp = where / f".{name}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(temp, where / name)


def run(service: Service, ctl: socket.socket, broker: tuple[int, socket.socket]) -> None:
    """Wait for one connection from the service, answer it, return (the caller exits).

    The service hands the connection over ``ctl``; its end closing first means the service
    stopped before this worker was needed. ``broker`` is this worker's own (pid, channel).
    """
    data, fds = frames.recv_with_fds(ctl, 64, 1)
    ctl.close()
    if data is None or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return
    with socket.socket(fileno=fds[0]) as conn:
        answer(service, conn, broker)


def _refusal(exc: ValidationError) -> str:
    """A bounded account of what was wrong, naming fields, never echoing their values."""
    parts = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
    return ("not a request: " + "; ".join(parts))[:REASON_MAX]


def answer(service: Service, conn: socket.socket, broker: tuple[int, socket.socket]) -> None:
    """Read, check and answer the request on ``conn``.

    The client's standard streams come only once the request is taken (``ready``): had
    they come with it, a service that never reads it (stopped, or stuck) would hold the
    client's stdout open after the client gave up on it and ran cold, and a pipe reading
    that stdout (``choir verify | tee``) would never end.
    """
    conn.settimeout(REQUEST_WAIT_S)
    # the whole request, not each read: a client that trickles a byte at a time held the
    # worker for as long as it liked (SIGALRM ends this worker, which has done nothing yet)
    signal.alarm(int(REQUEST_WAIT_S))
    try:
        data, fds = frames.recv_with_fds(conn, MAX_REQUEST, PLACE_FDS)
    except (OSError, ValueError):
        return
    link = _Link(conn)
    try:
        why, envelope = _check(service, data, fds)
        if envelope is None:
            link.send(why)
            return
        why_not = (_stand(envelope.context, fds[0]) or _elsewhere(service)
                   or _stale(service, envelope.context))
        if why_not:
            link.send({"stale": why_not})
            return
        # signing goes through this worker's broker, under the home as the client names it
        if not adopt(choir_home().absolute(), *broker).usable():
            link.send({"stale": "the signing key changed since the service started (`choir "
                                "keys rotate`): `choir serve --stop`, then start it again"})
            return
    finally:
        for fd in fds:
            os.close(fd)
    link.send({"ready": {}})
    try:
        data, stdio = frames.recv_with_fds(conn, 64, STDIO_FDS)
    except (OSError, ValueError):
        return
    try:
        if data is None or len(stdio) != STDIO_FDS:
            link.send({"refused": "a request is followed by three descriptors: the client's "
                                  "stdin, stdout and stderr"})
            return
        _take_streams(stdio)
    finally:
        for fd in stdio:
            os.close(fd)
    signal.alarm(0)
    conn.settimeout(None)
    _run(service, service.commands[envelope.request.command], envelope.request, link)


def _elsewhere(service: Service) -> str:
    """Why the stores this client names are not the service's ('' when they are): its
    ``CHOIR_HOME``, or its artifact folder (the worker's broker checks the service's, and
    refused to sign what the client's run stored elsewhere)."""
    if choir_home().resolve() != service.home.resolve():
        return f"the service is for CHOIR_HOME={service.home}; this client's is {choir_home()}"
    if artifact_dir().resolve() != service.artifacts.resolve():
        return (f"the service's artifact folder is {service.artifacts}; this client's is "
                f"{artifact_dir()}")
    return ""


def _check(service: Service, data: bytes | None,
           fds: list[int]) -> tuple[dict[str, str], Envelope | None]:
    """The request, or the answer that refuses it."""
    if data is None:
        return {"refused": f"no request, or one over {MAX_REQUEST} bytes"}, None
    try:
        envelope = Envelope.model_validate_json(data)
    except ValidationError as exc:
        return {"refused": _refusal(exc)}, None
    if len(fds) != PLACE_FDS:
        return {"refused": "a request carries three descriptors: the client's working "
                           "directory, its root and its mount namespace"}, None
    why = _standing(service, envelope.context, *fds)
    if why:
        return {"refused": why}, None
    return {}, envelope


def _stale(service: Service, context: Context) -> str:
    """Why this service would not answer as the client's cold command would ('' when it
    would)."""
    if context.version != service.version:
        return f"the service runs Choir {service.version}; this client is {context.version}"
    if context.code != service.code:
        return ("the service's code differs from this client's (Choir's files, the "
                "interpreter or the installed packages changed since it started)")
    names = stale.differences(service.start_env, stale.start_env(context.environ))
    if names:
        return ("the interpreter's start-up variables differ from the service's: "
                + ", ".join(names)[:REASON_MAX])
    if context.standing is None or context.rlimits is None:
        return "this client sends no process standing (an older Choir)"
    names = stale.differences(service.standing, context.standing)
    if names:  # the parts' names only: a value may be long (a label), and is the user's
        return ("the client's process standing differs from the service's: "
                + ", ".join(names)[:200] + " (capabilities, no_new_privs, seccomp, LSM "
                "label or groups; a worker has the service's, whatever the client's are): "
                "start `choir serve` from where the commands run (the same shell, unit or "
                "container)")
    return ""


def _standing(service: Service, context: Context, cwd_fd: int, root_fd: int,
              mounts_fd: int) -> str:
    """Why the client cannot be served where it stands ('' when it can)."""
    try:
        root, here, mounts = os.fstat(root_fd), os.fstat(cwd_fd), os.fstat(mounts_fd)
    except OSError as exc:
        return f"the descriptors sent are unusable: {exc.strerror}"
    if (root.st_dev, root.st_ino) != service.root:
        return ("the client's root is not the service's (another mount namespace, a "
                "container or a chroot): the same paths would name other files")
    if (mounts.st_dev, mounts.st_ino) != service.mounts:
        return ("the client is in another mount namespace than the one the service was "
                "started in (`unshare -m`, a container sharing the root): the same paths may "
                "name other files")
    if not os.path.isabs(context.cwd):
        return "the working directory must be an absolute path"
    try:
        named = os.stat(context.cwd)
    except OSError:
        named = None
    if named is None or (named.st_dev, named.st_ino) != (here.st_dev, here.st_ino):
        return ("the working directory the client names is not the one it sent (a path "
                "and a descriptor that disagree)")
    return ""


def _stand(context: Context, cwd_fd: int) -> str:
    """Take the client's directory, environment (all of it, none of the service's), umask
    and resource limits, as its own cold process would have had them; why not ('' when
    taken: a hard limit above the service's, which it may not raise, is not)."""
    os.fchdir(cwd_fd)
    os.environ.clear()
    os.environ.update(context.environ)
    os.umask(context.umask)
    tempfile.tempdir = None  # the idle worker's probe cached the service's TMPDIR
    for name, limits in (context.rlimits or {}).items():
        which = getattr(resource, name, None)  # the client's Python has it: so has this one
        if which is None:
            continue
        try:
            resource.setrlimit(which, limits)
        except (ValueError, OSError):
            return (f"the client's {name} cannot be set here (a hard limit above the "
                    "service's): start `choir serve` with limits at least the client's")
    return ""


def _take_streams(stdio: list[int]) -> None:
    """The client's stdin, stdout and stderr become this process's."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    # the interpreter buffers stdout by line on a terminal only; stderr always by line
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=os.isatty(1))


def _silence() -> None:
    """Nothing more for the client's terminal: its streams become /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for target in (0, 1, 2):
            os.dup2(null, target)
    finally:
        os.close(null)


def _run(service: Service, command: Command, request: Request, link: _Link) -> None:
    link.send({"started": {"pid": os.getpid()}})
    threading.Thread(target=_watch, args=(link, command.interrupt), name="choir-serve-watch",
                     daemon=True).start()
    try:
        code = command.run(request)
    except KeyboardInterrupt:
        code = 130  # the client went away and this was a run: interrupted as Ctrl-C would
    except Exception:  # noqa: BLE001 - the command crashed: shown as a cold crash is
        traceback.print_exc()
        code = 1
    finally:
        with link.ending:
            link.done.set()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    _silence()  # the client's streams let go before it exits: a pipe reading them ends
    link.send({"exit": code})
    _after(service)


def _after(service: Service) -> None:
    """Work for the next requests, once this one has answered and nothing of it can reach
    the client: the configuration files it read, noted for the next idle workers; the
    bytecode its steps found none for (``choir.sandbox.rewritten``), made by Choir."""
    try:
        _note_parsed(service)
    except OSError:  # a note not written costs the next request a parse
        pass
    try:
        _note_models(service)
    except OSError:  # the next requests import litellm themselves, as this one did
        pass
    try:
        from choir.sandbox import rewritten

        rewritten.fill()
    except Exception:  # noqa: BLE001 - a cache not filled costs the next step a rewrite
        pass


def _note_models(service: Service) -> None:
    """Note that this request used litellm (a model: an executor's, the Director's, a
    reporter's), for the service to import it once for the workers it forks next: its
    import takes seconds (4-5 s here), which every such request paid in its own worker."""
    if "litellm" in sys.modules:
        _write_note(service, MODELS, b"inherited" if _inherited["litellm"] else b"imported")


def _watch(link: _Link, interrupt: bool) -> None:
    """Read what the client sends while the command runs: ``stop``, or the end of the
    connection. Either way the command's sandboxes are stopped until it concludes (a run
    is interrupted instead, when the client is gone)."""
    try:
        reader = link.conn.dup()
    except OSError:
        return
    with reader:
        while not link.done.is_set():
            try:
                data = frames.recv(reader, 1024)
                message = json.loads(data) if data is not None else None
            except (OSError, ValueError):
                message = None
            if message is None:
                link.gone = True
                _silence()
            elif not (isinstance(message, dict) and message.get("op") == "stop"):
                continue  # nothing else is understood; the command goes on
            if interrupt and link.gone:
                # the client leaves once it has the exit code too: a KeyboardInterrupt
                # then hit the worker's work after its answer (the notes for the next
                # requests, the bytecode fill) and ended it with status 1
                with link.ending:
                    if not link.done.is_set():
                        _thread.interrupt_main()
                return
            _stop_until(link)
            return


def _stop_until(link: _Link) -> None:
    while not link.done.is_set():
        stop_steps()
        link.done.wait(STOP_EVERY_S)


def finish() -> None:
    """What a cold process does at exit (close its broker, remove its cgroups, ...): the
    handlers registered by the code the worker ran."""
    run_exit = getattr(atexit, "_run_exitfuncs", None)
    if run_exit is not None:
        run_exit()


__all__ = ["Command", "Service", "answer", "finish", "run", "warm_idle"]
