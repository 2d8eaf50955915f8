"""``bwrap``: Linux namespaces via bubblewrap, for machines without a Docker engine.

Holes measured on these machines are closed (docs/security.md): the process
never keeps capabilities (``--unshare-all --cap-drop ALL``), so it cannot remount the repo
read-write;
``/``, ``/run`` and ``/var/run`` are never bound, so the Docker socket is not reachable; as
root, bwrap runs as host ``nobody`` (see ``command``), so the step's uid is unprivileged on
the host too; and only ``/usr``, ``/etc`` and the project's interpreter (``_toolchain``) are
bound, read-only, at the same paths, so ``python3 -m pytest`` works unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from choir.exceptions import ConfigError
from choir.models import AppliedLimits, Limits
from choir.models import Limits as _Limits
from choir.sandbox import _toolchain, egress, rewritten
from choir.sandbox._cgroups import (
    STAGE,
    STAGE_PYTHON,
    STAGE_SLOTS,
    CgroupLimits,
    prestaged_python,
    reachable,
    stage_mount,
)
from choir.sandbox.base import (
    BYTECODE_VARS,
    NO_BYTECODE,
    TMP_MB,
    ExecResult,
    OutWatch,
    Sandbox,
    Sink,
    prepare_out,
    register_sandbox,
    run_process,
    step_env,
    stream_process,
)
from choir.sandbox.egress import EgressProxy

NOBODY = 65534
MASK_BYTES = 4096  # a mask is an empty read-only tmpfs: nothing is ever written there


def _traversable(path: str) -> bool:
    """True when an unprivileged user can reach ``path`` (every ancestor has o+x)."""
    return reachable(path)


@contextlib.contextmanager
def _rewritten(command: str, repo: Path,
               repo_writable: bool) -> Iterator[tuple[dict[str, str], list[Path]]]:
    """For a step of the pytest preset on a sealed tree: the folder of its test modules'
    rewrites that Choir's pytest made (``choir.sandbox.rewritten``), bound read-only, and
    the variables that name it to the preset's wrapper. Always set, for every step (empty
    when there is no folder), so a variable of the configuration never names another."""
    if repo_writable or "CHOIR_PYTEST" not in command:
        yield dict(NO_BYTECODE), []
        return
    tree = repo.resolve()
    with rewritten.for_step(tree) as folder:
        if folder is None:
            yield dict(NO_BYTECODE), []
        else:
            yield {"CHOIR_PYTEST_PYC": str(folder), "CHOIR_PYTEST_ROOT": str(tree)}, [folder]


def _drops_privilege() -> bool:
    """As root, bwrap's user namespace would map the step to host root: drop to nobody."""
    return os.geteuid() == 0


@register_sandbox("bwrap")
class BwrapSandbox(Sandbox):
    isolation = "namespace"
    auto_rank = 10

    def __init__(self, image: str | None = None, python: str | None = None,
                 binds: tuple[str, ...] = ()) -> None:
        """``image`` is docker's and ignored here; ``python``/``binds``: ``choir.yaml``'s.

        Raises:
            ConfigError: a bind would expose CHOIR_HOME, the artifact store or $HOME.
        """
        del image
        self._bwrap = shutil.which("bwrap") or "bwrap"
        self._python = python
        self._binds = tuple(_toolchain.check_bind(b, origin=_toolchain.BINDS_ORIGIN,
                                                  pinned=True) for b in binds)

    _usable: ClassVar[tuple[str | None, bool] | None] = None  # (the bwrap probed, works)

    @classmethod
    def available(cls) -> bool:
        """True when a real run works here: the probe is the very argv a verifier gets.

        Kept per bwrap found on ``PATH``: a warm worker probes with the service's
        environment before its request, then takes the client's, whose ``PATH`` may find
        another bwrap or none (review 18d: a service started without bwrap on its ``PATH``
        ran every warm request's steps unsandboxed under ``auto``, where the same command
        run cold chose bwrap)."""
        found = shutil.which("bwrap")
        if cls._usable is None or cls._usable[0] != found:
            works = False
            if found:
                import tempfile

                with tempfile.TemporaryDirectory(prefix="choir-bwrap-probe-") as tmp:
                    os.chmod(tmp, 0o755)  # the step runs as nobody: its repo must be readable
                    result = cls().exec("true", repo=Path(tmp), out_dir=Path(tmp) / "out",
                                        env={}, timeout_s=10, limits=_Limits(),
                                        network=False, sink=lambda _: None)
                works = result.exit_code == 0 and result.infra_error is None
            cls._usable = (found, works)
        return cls._usable[1]

    @classmethod
    def unavailable_reason(cls) -> str:
        if not shutil.which("bwrap"):
            return "bwrap is not installed (apt-get install bubblewrap)"
        return "bwrap is installed but a probe run failed (user namespaces refused?)"

    def toolchain(self, repo: Path) -> _toolchain.Toolchain:
        return _toolchain.choose(repo, self._python, self._binds)

    def limits_enforceable(self) -> bool:
        """True when a real probe places a group pair under the cgroup controllers here.

        Without them (not root, cgroups read-only, a cgroup-v2-only host) a step would run
        with the out cap only, and its manifest records memory and pids as null.
        """
        cgroup = CgroupLimits(Limits())
        try:
            return cgroup.applied
        finally:
            cgroup.close()

    def argv(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             network: bool, staged: Mapping[str, str] | None = None,
             repo_writable: bool = False, readable: Sequence[Path] = (),
             hidden: Sequence[Path] = (), read_only: Sequence[Path] = (),
             tools: _toolchain.Toolchain | None = None,
             proxy: EgressProxy | None = None) -> list[str]:
        """The bwrap command line; ``staged`` maps a host path to where the launcher bound it
        (a path an unprivileged bwrap can reach), for sources behind a 0700 folder.
        ``proxy``: the step's egress (``hosts:``): its socket folder is bound read-only at
        ``egress.MOUNT`` and the command runs under the forwarder; the network stays off.
        ``repo_writable``, ``readable``, ``read_only`` and ``hidden`` serve executors
        (choir.executors): the repo read-write, extra read-only binds, folders inside the repo
        kept read-only (the verifiers' interpreter), then paths masked (an empty tmpfs, or
        /dev/null for a file). ``tools``: the toolchain when the caller chose it already.

        Raises:
            ConfigError: the chosen interpreter or a bind would expose a secret.
        """
        staged = staged or {}
        tools = tools or _toolchain.choose(repo, self._python, self._binds)
        args = [self._bwrap, "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        # bwrap's / and its /dev (so /dev/shm) are tmpfs mounts with no size: half the
        # host's memory each, which nothing reclaims and, without cgroups, nothing bounds
        # (review 21b). /dev/shm gets /tmp's size; / and /dev are made read-only last.
        args += ["--ro-bind", "/etc", "/etc", "--dev", "/dev",
                 "--size", str(TMP_MB << 20), "--tmpfs", "/dev/shm", "--proc", "/proc",
                 "--size", str(TMP_MB << 20), "--tmpfs", "/tmp"]  # before any bind under /tmp,
        # or it would hide them
        for tool in tools.binds:
            args += ["--ro-bind", staged.get(tool, tool), tool]
        for path in readable:
            args += ["--ro-bind", staged.get(str(path), str(path)), str(path)]
        args += ["--bind" if repo_writable else "--ro-bind", staged.get(str(repo), str(repo)),
                 str(repo), "--bind", staged.get(str(out_dir), str(out_dir)), str(out_dir)]
        for path in read_only:  # after the repo, so they stay read-only inside a writable repo
            args += ["--ro-bind", str(path), str(path)]
        for path in hidden:
            args += ["--size", str(MASK_BYTES), "--tmpfs", str(path)] if path.is_dir() else \
                ["--ro-bind", "/dev/null", str(path)]
        for path in hidden:  # read-only once all are made: a mask may hold another's point
            args += ["--remount-ro", str(path)] if path.is_dir() else []
        if proxy is not None:
            sockets = str(proxy.socket_dir)
            args += ["--ro-bind", staged.get(sockets, sockets), egress.MOUNT]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]  # every mount point made
        args += ["--unshare-all", "--uid", str(NOBODY), "--gid", str(NOBODY),
                 "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv"]
        if network and proxy is None:
            args.append("--share-net")
        variables = step_env(str(out_dir), env)
        # ``exec``'s own (``_rewritten``, which sets both for every step, empty when it made
        # no folder, over what a configuration set): ``step_env`` drops them
        variables.update({name: env[name] for name in BYTECODE_VARS if env.get(name)})
        for var in ("PYENV_ROOT", "PYENV_VERSION", "CONDA_PREFIX", "VIRTUAL_ENV"):
            variables.pop(var, None)  # the host's toolchain is not bound: only the chosen one
        if tools.venv:
            variables["VIRTUAL_ENV"] = tools.venv
        if "PATH" not in env:
            variables["PATH"] = ":".join((*tools.path_head, "/usr/local/bin", "/usr/bin",
                                          "/bin"))
        for key, value in variables.items():
            args += ["--setenv", key, value]
        shell = ["/bin/sh", "-c", command]
        python = egress.SYSTEM_PYTHON if os.path.exists(egress.SYSTEM_PYTHON) else "python3"
        args += ["--chdir", str(repo),
                 *(egress.wrap(proxy, shell, python) if proxy else shell)]
        return args

    def _staging(self, tools: _toolchain.Toolchain, repo: Path, out_dir: Path,
                 proxy: EgressProxy | None = None,
                 readable: Sequence[Path] = ()) -> list[str]:
        """Host paths an unprivileged bwrap could not reach: bound under STAGE first."""
        sockets = (str(proxy.socket_dir),) if proxy is not None else ()
        return [p for p in (*tools.binds, str(repo), str(out_dir), *sockets,
                            *map(str, readable)) if not _traversable(p)]

    def command(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
                network: bool, repo_writable: bool = False, readable: Sequence[Path] = (),
                hidden: Sequence[Path] = (), read_only: Sequence[Path] = (),
                proxy: EgressProxy | None = None) -> tuple[str, list[str]]:
        """(shell setup, argv) that a root launcher runs as ``setup; exec argv``.

        As root, bwrap's own user namespace maps the step's uid to host root (it read
        /etc/shadow). So the launcher, alone in a private mount namespace, binds the
        sources a non-root user cannot reach (the pyenv Python under a 0700 /root, a repo in
        a 0700 temp folder) under STAGE, then runs bwrap as ``nobody`` with no groups: bwrap
        makes an unprivileged user namespace whose uid maps to host ``nobody``.
        """
        if repo_writable or not _drops_privilege():
            # An executor must write the (caller-owned) repo: it keeps the caller's uid, with
            # every capability dropped; what it must not see is masked (``hidden``), see
            # docs/security.md.
            return "", self.argv(command, repo=repo, out_dir=out_dir, env=env,
                                 network=network, repo_writable=repo_writable,
                                 readable=readable, hidden=hidden, read_only=read_only,
                                 proxy=proxy)
        tools = _toolchain.choose(repo, self._python, self._binds)  # once per step
        staged: dict[str, str] = {}
        setup = []
        todo = self._staging(tools, repo, out_dir, proxy, readable)
        python = prestaged_python()
        if python in todo:  # bound by the launcher when it was armed, off this path
            staged[python] = STAGE_PYTHON
            todo.remove(python)
        for number, path in enumerate(todo):
            target = f"{STAGE}/{number}"
            staged[path] = target
            make = f"mkdir {target} && " if number >= STAGE_SLOTS else ""
            setup.append(f"{make}mount --bind {shlex.quote(path)} {target} && ")
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                *self.argv(command, repo=repo, out_dir=out_dir, env=env, network=network,
                           staged=staged, tools=tools, proxy=proxy, readable=readable)]
        return "".join(setup), argv

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink,
             repo_writable: bool = False, readable: Sequence[Path] = (),
             hidden: Sequence[Path] = (), read_only: Sequence[Path] = (),
             hosts: Sequence[str] = ()) -> ExecResult:
        with _rewritten(command, repo, repo_writable) as (more_env, more_readable):
            return egress.with_egress(hosts, sink, lambda proxy: self._exec(
                command, repo=repo, out_dir=out_dir, env={**env, **more_env},
                timeout_s=timeout_s, limits=limits, network=network, sink=sink,
                repo_writable=repo_writable, readable=[*readable, *more_readable],
                hidden=hidden, read_only=read_only, proxy=proxy))

    def _exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
              timeout_s: float, limits: Limits, network: bool, sink: Sink,
              repo_writable: bool, readable: Sequence[Path], hidden: Sequence[Path],
              read_only: Sequence[Path], proxy: EgressProxy | None) -> ExecResult:
        drops = _drops_privilege() and not repo_writable
        owner = (NOBODY, NOBODY) if drops else None
        try:
            prepare_out(out_dir, owner=owner)
            setup, argv = self.command(command, repo=repo.resolve(), out_dir=out_dir.resolve(),
                                       env=env, network=network, repo_writable=repo_writable,
                                       readable=readable, hidden=hidden, read_only=read_only,
                                       proxy=proxy)
        except (OSError, ConfigError) as exc:
            return ExecResult(-1, 0, infra_error=f"bwrap could not prepare the run: {exc}")
        watch = OutWatch.of(out_dir, limits)
        setup = f"ulimit -f {watch.fsize_blocks} && {setup}"  # no single file beyond the cap
        cgroup = CgroupLimits(limits)
        # what holds for this run: the out cap always (ulimit -f plus the watchdog), memory
        # and pids only inside the cgroups; bwrap has no CPU limit of its own
        applied = AppliedLimits(out_mb=limits.out_mb,
                                memory_mb=limits.memory_mb if cgroup.applied else None,
                                pids=limits.pids if cgroup.applied else None)
        try:
            if not cgroup.applied:
                if self.require_limits:
                    return ExecResult(-1, 0, infra_error="bwrap could not place the run in its "
                                      "memory/pids cgroups and the mood requires limits")
                shell = ["/bin/sh", "-c"]
                if drops:
                    os.makedirs(STAGE, mode=0o755, exist_ok=True)
                    shell = ["unshare", "--mount", "--propagation", "private", *shell]
                    setup = f"{stage_mount()} && {setup}"
                result = run_process([*shell, f"{setup}exec {shlex.join(argv)}"],
                                     env={"PATH": "/usr/bin:/bin"}, cwd=None,
                                     timeout_s=timeout_s, sink=sink, watch=watch)
                return result if result.infra_error else replace(result,
                                                                 limits_applied=applied)
            start = time.monotonic()
            try:
                proc = cgroup.spawn(argv, setup=setup)
            except OSError as exc:
                return ExecResult(-1, int((time.monotonic() - start) * 1000),
                                  infra_error=f"bwrap could not start inside its limits: {exc}")
            result = stream_process(proc, start=start, timeout_s=timeout_s, sink=sink,
                                    watch=watch)
            if result.exit_code != 0 and cgroup.oom_killed():
                result = replace(result, oom_killed=True)
            return replace(result, limits_applied=applied)
        finally:
            cgroup.close()
