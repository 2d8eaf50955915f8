"""The Sandbox contract and its registry by name (``choir._core.registry.SANDBOXES``).

A sandbox runs one shell command against a read-only repo with one writable output folder
(``$CHOIR_OUT``), streams combined stdout/stderr to a sink chunk by chunk (never accumulating
it), and kills the whole process tree on timeout. A sandbox that cannot start reports
``infra_error``: the pipeline turns that into INCONCLUSIVE, never into a failing step.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import inspect
import os
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import ClassVar, Literal

from choir._core import fsopen
from choir._core.registry import SANDBOXES
from choir.exceptions import UnknownNameError
from choir.models import AppliedLimits, Interpreter, Limits
from choir.sandbox._toolchain import Toolchain

Isolation = Literal["container", "namespace", "none"]
Sink = Callable[[bytes], None]
CHUNK = 1 << 16


@dataclass(frozen=True)
class ExecResult:
    """How one command ended. ``infra_error`` set means the sandbox itself failed."""

    exit_code: int
    duration_ms: int
    timed_out: bool = False
    oom_killed: bool = False
    infra_error: str | None = None
    output_bytes: int = 0
    limit_exceeded: str | None = None  # set when an enforced limit (the out cap) stopped it
    # the limits this backend actually enforced on the run (None: it never started)
    limits_applied: AppliedLimits | None = None


# the private /tmp of every isolated step: outside $CHOIR_OUT, so the out cap does not watch
# it, and a tmpfs is memory (without cgroups, as an unprivileged bwrap runs, the host's)
TMP_MB = 256


@functools.cache
def pytest_source() -> str:
    """The source of ``choir.sandbox.pytest_junit``, run inside a sandbox by ``$CHOIR_PYTEST``."""
    return (resources.files("choir.sandbox") / "pytest_junit.py").read_text("utf-8")


# ``$CHOIR_PYTEST``: the wrapper's source as a text constant (which costs its compile next to
# nothing), run from the copy Choir compiled when the step's folder holds one for exactly
# that text (``choir.sandbox.rewritten``; its header's hash is checked here, as the import
# system checks a module's), else compiled here, as ``python3 -c SOURCE`` would: compiling
# the whole wrapper was 5-11 ms of every pytest step. Not under ``-O`` (the copy keeps its
# asserts). Every name it sets starts with ``_choir_``.
PYTEST_STUB = """\
_choir_source = SOURCE
_choir_code = None
try:
    import _imp as _choir_imp, marshal as _choir_marshal, os as _choir_os, sys as _choir_sys
    from importlib import _bootstrap_external as _choir_boot
    _choir_folder = _choir_os.environ.get("CHOIR_PYTEST_PYC", "")
    if _choir_folder and not _choir_sys.flags.optimize:
        _choir_tag = _choir_sys.implementation.cache_tag
        with open(f"{_choir_folder}/.choir/pytest.{_choir_tag}.pyc", "rb") as _choir_fh:
            _choir_data = _choir_fh.read()
        _choir_magic = _choir_boot.MAGIC_NUMBER
        if (_choir_data[:4] == _choir_magic and _choir_data[4:8] == b"\\3\\0\\0\\0"
                and _choir_data[8:16] == _choir_imp.source_hash(
                    int.from_bytes(_choir_magic, "little"), _choir_source.encode())):
            _choir_code = _choir_marshal.loads(_choir_data[16:])
except Exception:
    _choir_code = None
exec(_choir_code if _choir_code is not None else compile(_choir_source, "<string>", "exec"))
"""


# the variables that name a folder of Choir's bytecode to the preset's wrapper
# (``choir.sandbox.rewritten``): set by the bubblewrap backend for a step it made one for,
# absent everywhere else, whatever a verifier's ``env:`` says (a folder of the tree, with
# code planted in it, would be run in place of the sources the attestation names)
BYTECODE_VARS = ("CHOIR_PYTEST_PYC", "CHOIR_PYTEST_ROOT")
NO_BYTECODE = dict.fromkeys(BYTECODE_VARS, "")


@functools.cache
def pytest_command() -> str:
    """``$CHOIR_PYTEST`` (``PYTEST_STUB`` with the wrapper's source in it)."""
    return PYTEST_STUB.replace("SOURCE", repr(pytest_source()), 1)


def step_env(out_dir: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment inside a sandbox: temp, caches and home all under ``$CHOIR_OUT``."""
    tmp = f"{out_dir}/tmp"
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "CHOIR_OUT": out_dir,
        "TMPDIR": tmp, "TEMP": tmp, "TMP": tmp,
        "HOME": f"{out_dir}/home",
        "XDG_CACHE_HOME": f"{out_dir}/cache",
        # tools that would write a cache into the read-only repo: pytest's cache
        # plugin warns there, and filterwarnings=error turns that into a failure. pytest's
        # cache is switched off rather than moved: `-o cache_dir=` is an unknown option once a
        # command says `-p no:cacheprovider`, which --strict-config projects refuse, and a
        # fresh $CHOIR_OUT per run would keep nothing for a next run anyway
        "RUFF_CACHE_DIR": f"{out_dir}/cache/ruff",
        "MYPY_CACHE_DIR": f"{out_dir}/cache/mypy",
        "PYTEST_ADDOPTS": "-p no:cacheprovider",
        "COVERAGE_FILE": f"{out_dir}/cache/coverage",
        "HYPOTHESIS_STORAGE_DIRECTORY": f"{out_dir}/cache/hypothesis",
        # no PYTHONPYCACHEPREFIX: it would hide the stdlib's bytecode too and make every
        # interpreter recompile its imports (measured: 376 ms instead of 128 ms)
        "PYTHONDONTWRITEBYTECODE": "1",
        "TEST_DB_PATH": f"{out_dir}/db",
        "SNAPSHOT_DIR": f"{out_dir}/snapshots",
        # the pytest preset's step: `python3 -c "$CHOIR_PYTEST" ARGS` is pytest with ARGS
        # and a light JUnit writer (choir/sandbox/pytest_junit.py, which says why)
        "CHOIR_PYTEST": pytest_command(),
    }
    # the user's toolchain, so `python3 -m pytest` resolves as it does outside
    for var in ("VIRTUAL_ENV", "PYENV_ROOT", "PYENV_VERSION", "CONDA_PREFIX"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    env.update(extra)
    for name in BYTECODE_VARS:
        env.pop(name, None)
    return env


def prepare_out(out_dir: Path, owner: tuple[int, int] | None = None) -> None:
    """Make ``$CHOIR_OUT`` and its temp/home/cache folders, owned by ``owner`` if given.

    Never follows a link: an earlier step of the same run may have replaced ``tmp`` with a
    symlink to the signing key or any host file, and a ``chown`` through it would hand that
    file to the sandbox user. Anything at those names that is not a real
    folder is removed and the folder made afresh; ownership is changed with ``lchown`` on
    exactly the folders made here, never on what a step left in them.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if os.path.islink(out_dir) or not out_dir.is_dir():
        raise OSError(f"{out_dir} is not a real folder")
    for sub in ("tmp", "home", "cache"):
        path = out_dir / sub
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISDIR(mode):
            path.unlink()  # a symlink, FIFO or file planted by a step: drop it, never follow
        path.mkdir(exist_ok=True)
    if owner is not None:
        for path in (out_dir, out_dir / "tmp", out_dir / "home", out_dir / "cache"):
            os.chown(path, *owner, follow_symlinks=False)


def walk(root: str, *, ordered: bool = False,
         strict: bool = False) -> Iterator[tuple[str, os.stat_result | None]]:
    """Every path under ``root`` with its ``lstat`` (None: it vanished meanwhile), links never
    followed; ``ordered``: each folder's entries by name (a stable order to hash).

    Raises:
        OSError: ``strict`` and a folder that exists cannot be listed (its mode lets Python
            open the names it knows in it, but nobody can see what they are).
    """
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        except OSError:
            if strict:
                raise
            continue
        if ordered:
            entries.sort(key=lambda e: e.name)
        for entry in entries:
            try:
                st: os.stat_result | None = entry.stat(follow_symlinks=False)
            except OSError:
                st = None
            yield entry.path, st
            if st is not None and stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)


# the most files (and, apart, folders) and the deepest nesting a configuration may allow
# (``Limits.out_files``, ``Limits.out_depth``): the watchdog's bounds when none is given
OUT_FILES = 20_000
OUT_DEPTH = 128
# what the scratch folders under ``$CHOIR_OUT`` (tmp, home, the caches: discarded, never
# collected, so ``limits.out_files`` does not bound them) may hold beside the files, while
# the step runs: a large project's mypy cache or pytest's temporary trees hold tens of
# thousands; an empty-file flood (4 million a run, review 21b) is stopped at this
SCRATCH_ENTRIES = 100_000


@dataclass
class OutTally:
    """One pass over ``$CHOIR_OUT``: what it counted, and the first bound it passed."""

    bytes: int = 0
    files: int = 0
    folders: int = 0
    over: str | None = None


def out_tally(out_dir: Path, *, cap_mb: int, files: int = OUT_FILES,
              depth: int = OUT_DEPTH) -> OutTally:
    """Count ``out_dir`` by descriptor, stopping at the first bound it passes.

    A step controls this tree. Walked by full path, a folder deeper than PATH_MAX (nested by
    ``chdir``) failed with ENAMETOOLONG and everything below it went uncounted (review 21b),
    so it is walked as ``choir._core.fsopen.walk`` walks (each folder opened from its
    parent's descriptor, ``O_NOFOLLOW``), unordered: entries stream as the kernel lists
    them. Bytes are the larger of apparent size and blocks (a sparse file counts whole: the
    artifact store would copy it whole). Files and folders are each held to ``files``: an
    empty one costs an inode and no bytes. A folder that exists but cannot be listed, or
    lies deeper than ``depth``, is over (fail closed: what it holds is unknown). The pass
    keeps only the names of folders still to enter (at most ``files``) and one descriptor
    per level (at most ``depth``), whatever the step made.
    """
    tally = OutTally()
    cap = cap_mb << 20
    try:
        with contextlib.closing(fsopen.walk(out_dir, max_depth=depth, ordered=False)) as found:
            for entry in found:
                st = entry.st
                tally.bytes += max(st.st_size, st.st_blocks * 512)
                if stat.S_ISDIR(st.st_mode):
                    tally.folders += 1
                else:
                    tally.files += 1
                if tally.bytes > cap:
                    tally.over = f"$CHOIR_OUT exceeded its cap of {cap_mb} MiB (limits.out_mb)"
                elif tally.files > files or tally.folders > files:
                    kind = "files" if tally.files > files else "folders"
                    tally.over = f"$CHOIR_OUT holds more than {files} {kind} (limits.out_files)"
                if tally.over:
                    break
    except FileNotFoundError:  # no out/ (yet)
        pass
    except fsopen.TooDeep:
        tally.over = f"$CHOIR_OUT nests folders deeper than {depth} folders (limits.out_depth)"
    except OSError as exc:
        tally.over = (f"$CHOIR_OUT holds a folder that cannot be listed "
                      f"({str(exc.filename or '.')[:64]}: {exc.strerror or exc}); what it "
                      f"holds is unknown, so it counts as over its cap of {cap_mb} MiB "
                      "(limits.out_mb)")
    return tally


def out_usage(out_dir: Path) -> int:
    """Bytes under ``out_dir`` as ``out_tally`` counts them, with no bound but the byte
    count itself (a folder it cannot list counts nothing here; ``out_tally`` says so)."""
    return out_tally(out_dir, cap_mb=1 << 40, files=1 << 62, depth=1 << 30).bytes


class OutWatch:
    """Stops a step whose ``$CHOIR_OUT`` grows past its caps.

    Two layers: the kernel's RLIMIT_FSIZE (``fsize_blocks``, set by each backend) stops any
    single file at the byte cap exactly; this watchdog counts the whole folder every
    ``interval`` seconds (``out_tally``: bytes, files and folders each up to ``files``,
    nesting up to ``OUT_DEPTH``) and calls ``kill`` once it is over, so host disk use (bytes
    and inodes) stays within the caps plus what the step can write in one interval.
    """

    @classmethod
    def of(cls, out_dir: Path, limits: Limits) -> OutWatch:
        """The watch for a step run under ``limits``: its byte cap, and its files with the
        scratch folders' allowance (``SCRATCH_ENTRIES``) counted while it runs; collection
        holds what stays to ``limits.out_files`` exactly."""
        return cls(out_dir, limits.out_mb, files=limits.out_files + SCRATCH_ENTRIES)

    def __init__(self, out_dir: Path, cap_mb: int, interval: float = 0.1,
                 files: int = OUT_FILES) -> None:
        self.out_dir = out_dir
        self.cap = cap_mb * 1024 * 1024
        self.cap_mb = cap_mb
        self.files = files
        self.interval = interval
        self.exceeded = False
        self._why: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def fsize_blocks(self) -> int:
        """The cap in 512-byte blocks, for ``ulimit -f``."""
        return max(1, self.cap // 512)

    def reason(self) -> str:
        return self._why or f"$CHOIR_OUT exceeded its cap of {self.cap_mb} MiB (limits.out_mb)"

    def _over(self) -> bool:
        why = out_tally(self.out_dir, cap_mb=self.cap_mb, files=self.files).over
        if why is not None:
            self._why = why
            self.exceeded = True
        return why is not None

    def start(self, kill: Callable[[], None]) -> None:
        def watch() -> None:
            while not self._stop.wait(self.interval):
                if self._over():
                    kill()
                    return

        self._thread = threading.Thread(target=watch, name="choir-out-watch", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stop watching; True when a cap was exceeded (checked once more at the end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.exceeded:
            self._over()
        return self.exceeded

    def verdict(self, result: ExecResult, sink: Sink) -> ExecResult:
        """``result`` marked as stopped by the cap (never a PASS), with a note in the log."""
        if not self.stop():
            return result
        sink(f"\n[choir] {self.reason()}: the step was stopped\n".encode())
        code = result.exit_code if result.exit_code != 0 else 125
        return replace(result, exit_code=code, limit_exceeded=self.reason())


def run_process(argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None,
                timeout_s: float, sink: Sink, watch: OutWatch | None = None) -> ExecResult:
    """Run ``argv`` in a new session, stream its output, kill the group on timeout."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return ExecResult(-1, 0, infra_error=f"could not start: {exc}")
    return stream_process(proc, start=start, timeout_s=timeout_s, sink=sink, watch=watch)


def stream_process(proc: subprocess.Popen[bytes], *, start: float, timeout_s: float,
                   sink: Sink, watch: OutWatch | None = None) -> ExecResult:
    """Stream a started process's combined output to ``sink``; kill its group on timeout.

    ``proc`` must lead its own session (``start_new_session=True``) so that one ``killpg``
    reaches every descendant; ``start`` is the ``time.monotonic()`` the run began at, so a
    caller that spent time before the spawn (joining cgroups) is charged for it.
    """
    from choir.sandbox import stop

    stop.started(proc.pid)
    try:
        return _stream(proc, start=start, timeout_s=timeout_s, sink=sink, watch=watch)
    finally:
        stop.ended(proc.pid)


def _stream(proc: subprocess.Popen[bytes], *, start: float, timeout_s: float,
            sink: Sink, watch: OutWatch | None) -> ExecResult:
    assert proc.stdout is not None
    if watch is not None:
        watch.start(lambda: _kill_group(proc))
    deadline = start + timeout_s
    timed_out = False
    total = 0
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if not sel.select(timeout=min(remaining, 0.5)):
                continue
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                break
            total += len(chunk)
            sink(chunk)
    if timed_out:
        _kill_group(proc)
    try:
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()) if not timed_out else 5)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        code = proc.wait(timeout=5)
    _kill_group(proc)  # leftovers that daemonised inside the group
    proc.stdout.close()
    result = ExecResult(
        exit_code=124 if timed_out else code,
        duration_ms=int((time.monotonic() - start) * 1000),
        timed_out=timed_out,
        output_bytes=total,
    )
    return watch.verdict(result, sink) if watch is not None else result


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Sandbox(abc.ABC):
    """Where a verifier's commands run. One instance may serve many ``exec`` calls."""

    name: ClassVar[str]
    isolation: ClassVar[Isolation]
    # ``auto`` tries backends in this order (lowest first); None: never picked by ``auto``
    auto_rank: ClassVar[int | None] = None
    # set by ``open_sandbox`` for a mood that requires limits: a backend that finds at run
    # time that it cannot apply them fails the step as infra_error (INCONCLUSIVE, never PASS)
    require_limits: bool = False
    # why this backend runs: set by ``auto`` (what it tried and why each was passed over),
    # else "named in choir.yaml or --sandbox"
    chosen_because: str = "named in choir.yaml or --sandbox"
    # set by ``open_sandbox``: the interpreter the steps run, vouched for against the digest
    # trusted for the repo (``_interpreter.vouch``); recorded in every run's manifest.
    # ``vouching``: that vouch, while it runs in a thread of its own
    # (``open_sandbox(beside=True)``); every run waits for it (``vouched``) before it starts
    interpreter: Interpreter | None = None
    vouching: Future[Interpreter] | None = None
    _binds: tuple[str, ...] = ()  # the host folders bound beside the system's (checked)

    @property
    def binds(self) -> tuple[str, ...]:
        """The host folders bound beside the system's (``choir.yaml``'s binds and resource
        folders, resolved): recorded in the manifest, so the attestation says what the
        steps could see and connect to besides the repo (review 23b)."""
        return self._binds

    def vouched(self) -> Interpreter | None:
        """``interpreter``, once a vouch still running holds (waits for it).

        Raises:
            UserError: the vouch refused the interpreter; again on every call, so no run of
                this sandbox starts after a refusal.
        """
        if self.vouching is not None:
            self.interpreter = self.vouching.result()
        return self.interpreter

    @classmethod
    def available(cls) -> bool:
        """True when this backend can run here."""
        return True

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why ``available()`` is false here, in a few words for the person choosing."""
        return "not available here"

    @abc.abstractmethod
    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink,
             repo_writable: bool = False, hosts: Sequence[str] = ()) -> ExecResult:
        """Run ``sh -c command`` with cwd = ``repo`` (read-only) and ``out_dir`` writable.

        ``repo_writable`` is for executors only (they change the tree); verifiers never set it.
        ``hosts``: the only ``host:port`` endpoints the step may reach, through Choir's egress
        proxy (``choir.sandbox.egress``); an isolating backend keeps the network off
        otherwise, whatever ``network`` says.

        Raises:
            Nothing for command failures (they are the exit code); start-up failures are
            returned as ``ExecResult.infra_error``.
        """

    def limits_enforceable(self) -> bool:
        """True when this backend enforces the memory, pids and ``$CHOIR_OUT`` caps here.

        A mood that requires limits (PARANOID's ``require_limits``) refuses a sandbox that
        says False. The default is False: a backend must prove it can.
        """
        return False

    def toolchain(self, repo: Path) -> Toolchain | None:
        """The host interpreter the steps in ``repo`` run; None when they run none of the
        host's (an image's own Python: the image digest records it)."""
        del repo
        return None

    def describe(self) -> dict[str, str | None]:
        """Image and digest, for the manifest and attestation."""
        return {"image": None, "image_digest": None}

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release anything held between runs."""


def register_sandbox(name: str) -> Callable[[type[Sandbox]], type[Sandbox]]:
    """Class decorator: name a backend and register it in this process."""

    def decorate(cls: type[Sandbox]) -> type[Sandbox]:
        cls.name = name
        registered: type[Sandbox] = SANDBOXES.register(name)(cls)
        return registered

    return decorate


def sandbox_names() -> list[str]:
    """Every backend name, ``auto`` included, without importing any backend."""
    return SANDBOXES.names()


def get_sandbox(name: str, **options: object) -> Sandbox:
    """A sandbox by name; ``auto`` picks the strongest available backend (``auto_rank``).

    Raises:
        UnknownNameError: no backend has that name.
    """
    if name == "auto":
        return resolve_auto(**options)
    cls: type[Sandbox] = SANDBOXES.get(name)
    return cls(**accepted(cls, options))


def accepted(cls: type[Sandbox], options: Mapping[str, object]) -> dict[str, object]:
    """The ``options`` ``cls`` takes: one backend's option (docker's ``transfer``) is not
    passed to another (``auto`` falling back to bwrap, a worker resolving its own)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {key: value for key, value in options.items() if key in params}


def resolve_auto(**options: object) -> Sandbox:
    """The available backend with the lowest ``auto_rank``; a backend without isolation only
    with a warning, since every attestation then records ``none``."""
    import warnings

    backends: list[type[Sandbox]] = [SANDBOXES.get(n) for n in sandbox_names() if n != "auto"]
    ranked = sorted((cls for cls in backends if cls.auto_rank is not None),
                    key=lambda cls: cls.auto_rank or 0)
    passed_over: list[str] = []
    for cls in ranked:
        if not cls.available():
            passed_over.append(f"{cls.name}: {cls.unavailable_reason()}")
            continue
        sandbox = cls(**accepted(cls, options))
        if not getattr(sandbox, "has_image", lambda: True)():
            sandbox.close()  # an engine without the image would make every run INCONCLUSIVE
            passed_over.append(f"{cls.name}: {sandbox.missing_image_fix()}")  # type: ignore[attr-defined]
            continue
        if cls.isolation == "none":
            warnings.warn(
                f"no isolating sandbox available: verifiers run UNSANDBOXED in '{cls.name}' "
                "(isolation 'none' is recorded in every attestation)", RuntimeWarning,
                stacklevel=2)
        sandbox.chosen_because = "; ".join(
            [f"auto chose {cls.name} ({cls.isolation} isolation, the strongest that works "
             "here)", *(f"passed over {why}" for why in passed_over)])
        return sandbox
    raise UnknownNameError("no sandbox backend is available here; "
                           f"known: {', '.join(sandbox_names())}")


resolve_sandbox = get_sandbox
