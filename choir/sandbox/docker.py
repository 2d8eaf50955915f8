"""``docker``: a fresh container per command, always removed (never reused).

The repo is bind-mounted read-only and is the working directory; the run's output folder is
the only writable mount; no network unless the policy allows it; all capabilities dropped,
no-new-privileges, uid 65534, read-only root with a tmpfs /tmp (and one of the same size on
each ``VOLUME`` the image declares, which Docker would make a writable volume on its own
disk), memory/pids/CPU limits from the policy.

Leftovers: a Choir process killed with SIGKILL never reaches its ``finally`` and its container
keeps running. Every container is labelled ``choir.managed=1`` plus its owner (host and PID
namespace identity, PID and that PID's start time, which together name one process even after
PID reuse) and the time after which no live owner can still need it (``choir.expires``: the
run deadline plus the log drain plus a grace). The first time a process uses the docker
backend it removes Choir's containers whose owner is gone or that are past ``choir.expires``;
it never touches unlabelled containers, nor containers of a live owner within their time.

Remote engines (``transfer: copy``): an engine reached over ``tcp://`` or ``ssh://`` cannot
see this machine's folders, so no bind carries the repo or the output. The sealed snapshot is
copied once per sandbox into a volume (through a loader container that is created, never
started) and mounted read-only at ``/repo`` by every step; ``$CHOIR_OUT`` is ``/choir/vol/out``
in an anonymous volume, filled from the host folder before the start and copied back after
the step ends through ``remote_copy`` (names, links, devices and size checked: see there).
Containment is the same: no network, all caps dropped, no-new-privileges, uid 65534,
read-only root, memory/pids/CPU limits, the ``fsize`` ulimit per file; the output's total is
capped when it is copied back (the host never receives more than ``limits.out_mb``). Binds are
kept only for an image that borrows the engine host's ``/usr`` (the toolchain). The mode is
recorded in the manifest (``platform.transfer``).

Output: the step's stdout and stderr are read through an attach made before the start, and
the container has no log driver, so the engine keeps no copy. With the default ``json-file``
driver a step printing 200 MB of short lines had the engine write gigabytes of JSON to its
own disk, and following that file took minutes; attached, the same stream takes under a
second and the host stores only what the pipeline keeps (``limits.out_mb``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from choir.exceptions import ConfigError, MissingExtraError
from choir.models import AppliedLimits, Limits
from choir.sandbox import _toolchain, egress, stop
from choir.sandbox._host_image import ensure_host_image
from choir.sandbox.base import (
    TMP_MB,
    ExecResult,
    OutWatch,
    Sandbox,
    Sink,
    prepare_out,
    register_sandbox,
    step_env,
)
from choir.sandbox.egress import EgressProxy

DEFAULT_IMAGE = "choir-test:host"
LABEL = "choir.managed"
OWNER_HOST = "choir.owner.host"
OWNER_PID = "choir.owner.pid"
OWNER_START = "choir.owner.start"
DEADLINE = "choir.deadline"
EXPIRES = "choir.expires"
GRACE_S = 120.0
OUT = "/choir/out"
NOBODY = 65534
REPO = "/repo"
COPY_ROOT = "/choir/vol"  # copy mode: a volume whose root stays root's; $CHOIR_OUT inside it
COPY_OUT = f"{COPY_ROOT}/out"
REPO_VOLUME_TTL_S = 6 * 3600.0  # a cached repo volume's expiry label (removed by close())
TRANSFERS = ("auto", "bind", "copy")

_SWEEP_LOCK = threading.Lock()
_SWEPT_IN: int | None = None  # the PID that swept already: once per process, again after fork


def _client(timeout: float = 10) -> Any:
    try:
        import docker
    except ImportError as exc:
        raise MissingExtraError("the docker sandbox needs: pip install 'choir[docker]'") from exc
    return docker.from_env(timeout=int(timeout))


def _unix_ping(path: str, *, timeout: float) -> bool:
    """``GET /_ping`` on the engine's unix socket; the socket is closed on every path."""
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith(b"HTTP/1.") and reply[9:12] == b"200"


@register_sandbox("docker")
class DockerSandbox(Sandbox):
    isolation = "container"
    auto_rank = 0

    def __init__(self, image: str | None = None, host_usr: bool | None = None,
                 python: str | None = None, binds: tuple[str, ...] = (),
                 transfer: str | None = None) -> None:
        """``python``/``binds`` (``choir.yaml``) matter only for an image borrowing host /usr.

        ``transfer``: ``bind`` (bind mounts, a local engine), ``copy`` (through the API, for a
        remote engine) or ``auto`` (copy when ``DOCKER_HOST`` is ``tcp://`` or ``ssh://``).

        Raises:
            ConfigError: a bind would expose CHOIR_HOME, the artifact store or $HOME, or the
                transfer is unknown.
        """
        self.transfer = resolve_transfer(transfer)
        self.image = image or os.environ.get("CHOIR_DOCKER_IMAGE") or DEFAULT_IMAGE
        self._python = python
        self._binds = tuple(_toolchain.check_bind(b, origin=_toolchain.BINDS_ORIGIN,
                                                  pinned=True) for b in binds)
        # the locally built test image carries no toolchain: it borrows the host's /usr
        self.host_usr = host_usr if host_usr is not None else self.image == DEFAULT_IMAGE
        self._client: Any = None
        self._repo_volumes: dict[str, str] = {}  # snapshot fingerprint -> volume (copy mode)
        self._declared: dict[str, tuple[str, ...]] = {}  # image -> the VOLUMEs it declares
        self._load_lock = threading.Lock()

    @classmethod
    def available(cls) -> bool:
        """True when an engine answers ``/_ping``; leaves no socket open either way."""
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        if host.startswith("unix://"):
            # The SDK's unix transport does not close a socket whose connect() failed, and
            # under filterwarnings=error that ResourceWarning broke later tests: ask directly.
            return _unix_ping(host[len("unix://"):], timeout=2.0)
        try:
            client = _client(timeout=2)
        except Exception:
            return False
        try:
            client.ping()
        except Exception:
            return False
        finally:
            client.close()
        return True

    @classmethod
    def unavailable_reason(cls) -> str:
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        return f"no Docker engine answered at {host}"

    def limits_enforceable(self) -> bool:
        """Always: the engine applies memory, pids and CPU limits itself, fsize by ulimit."""
        return True

    def toolchain(self, repo: Path) -> _toolchain.Toolchain | None:
        """The host's interpreter for an image that borrows host /usr; else the image's own."""
        return _toolchain.choose(repo, self._python, self._binds) if self.host_usr else None

    def has_image(self) -> bool:
        """True when the configured image is present locally (no registry is assumed). The
        default image is built here when it is missing (``_host_image``): a user with an
        engine and nothing pulled still gets a working sandbox."""
        try:
            self.client().images.get(self.image)
        except Exception:
            return False
        return True

    def missing_image_fix(self) -> str:
        """What to do about a configured image the engine does not have."""
        return (f"the Docker engine has no image '{self.image}' and Choir pulls nothing; fix: "
                f"`docker pull {self.image}` (or build it), or remove sandbox.image / "
                f"CHOIR_DOCKER_IMAGE to use the image Choir builds from this host's /usr")

    def client(self) -> Any:
        if self._client is None:
            self._client = _client(timeout=60)
            _sweep_once(self._client)
            if self.image == DEFAULT_IMAGE:  # first use on a new engine: build it, offline
                try:
                    ensure_host_image(self._client, self.image)
                except Exception:
                    pass  # the run then fails with the engine's own error (INCONCLUSIVE)
        return self._client

    def describe(self) -> dict[str, str | None]:
        try:
            image = self.client().images.get(self.image)
        except Exception:
            return {"image": self.image, "image_digest": None, "transfer": self.transfer}
        digests = image.attrs.get("RepoDigests") or []
        return {"image": self.image, "image_digest": digests[0] if digests else image.id,
                "transfer": self.transfer}

    def _volumes(self, repo: Path, out_dir: Path, repo_writable: bool = False,
                 repo_volume: str | None = None) -> dict[str, dict[str, str]]:
        volumes: dict[str, dict[str, str]] = {}
        if repo_volume:  # copy mode: a volume on the engine, never a bind of this machine's
            volumes[repo_volume] = {"bind": REPO, "mode": "ro"}
        else:
            volumes[str(repo)] = {"bind": REPO, "mode": "rw" if repo_writable else "ro"}
            volumes[str(out_dir)] = {"bind": OUT, "mode": "rw"}
        if self.host_usr:
            # the project's interpreter, never Choir's own venv, never $HOME
            tools = _toolchain.choose(repo, self._python, self._binds)
            for path in ("/usr", "/etc/alternatives", *tools.binds):
                if os.path.isdir(path):
                    volumes[path] = {"bind": path, "mode": "ro"}
        return volumes

    def _image_volumes(self, client: Any, taken: set[str]) -> list[str]:
        """The ``VOLUME`` folders the image declares, but where Choir mounts something
        itself: each gets a tmpfs of ``/tmp``'s size. Docker would give each container a
        writable anonymous volume there, on the engine's disk and outside every cap, and a
        step filled the host's disk through one (review 23b); Docker refuses a read-only
        anonymous volume. What the image holds in such a folder is hidden, as a new volume
        would start empty for most images' data folders anyway."""
        declared = self._declared.get(self.image)
        if declared is None:
            config = client.images.get(self.image).attrs.get("Config") or {}
            declared = self._declared[self.image] = tuple(sorted(config.get("Volumes") or ()))
        return [path for path in declared if path not in taken]

    def _environment(self, repo: Path, env: Mapping[str, str]) -> dict[str, str]:
        variables = step_env(COPY_OUT if self.transfer == "copy" else OUT, env)
        for var in ("PYENV_ROOT", "PYENV_VERSION", "CONDA_PREFIX", "VIRTUAL_ENV"):
            variables.pop(var, None)  # the host's toolchain is not in the container
        if self.host_usr and "PATH" not in env:
            tools = _toolchain.choose(repo, self._python, self._binds)
            variables["PATH"] = ":".join((*tools.path_head, "/usr/local/bin", "/usr/bin",
                                          "/bin"))
            if tools.venv:
                variables["VIRTUAL_ENV"] = tools.venv
        elif "PATH" not in env:
            variables["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return variables

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink,
             repo_writable: bool = False, hosts: Sequence[str] = ()) -> ExecResult:
        copy = self.transfer == "copy"
        if copy and repo_writable:
            return ExecResult(-1, 0, infra_error="the docker sandbox's copy transfer (remote "
                              "engine) brings no change to the repo back: an executor needs "
                              "sandbox.transfer: bind and a local engine")
        if copy and hosts:
            return ExecResult(-1, 0, infra_error="a host list (hosts:) needs the egress "
                              "proxy's socket bound into the container: a remote engine "
                              "(transfer: copy) cannot bind it; use a local engine or bwrap")
        return egress.with_egress(hosts, sink, lambda proxy: self._exec(
            command, repo=repo, out_dir=out_dir, env=env, timeout_s=timeout_s, limits=limits,
            network=network, sink=sink, repo_writable=repo_writable, proxy=proxy))

    def _exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
              timeout_s: float, limits: Limits, network: bool, sink: Sink,
              repo_writable: bool, proxy: EgressProxy | None) -> ExecResult:
        copy = self.transfer == "copy"
        try:  # the container user must be able to write; links a step left are not followed
            prepare_out(out_dir, owner=None if copy else (NOBODY, NOBODY))
        except OSError as exc:
            return ExecResult(-1, 0, infra_error=f"could not prepare the output folder: {exc}")
        watch = OutWatch.of(out_dir, limits)
        start = time.monotonic()
        labels = run_labels(time.time(), timeout_s)
        repo_volume: str | None = None
        client: Any = None
        container: Any = None
        try:
            from docker.types import LogConfig, Mount, Ulimit

            client = self.client()
            if copy:
                repo_volume = self._repo_volume(client, repo.resolve())
            shell = ["/bin/sh", "-c", command]
            volumes = self._volumes(repo.resolve(), out_dir.resolve(), repo_writable,
                                    repo_volume)
            if proxy is not None:  # the only way out: the proxy's socket, read-only
                volumes[str(proxy.socket_dir)] = {"bind": egress.MOUNT, "mode": "ro"}
            # copy mode: an anonymous volume, removed with the container
            mounts = [Mount(COPY_ROOT, None, type="volume")] if copy else []
            scratch = {path: f"rw,nosuid,size={TMP_MB}m" for path in (
                "/tmp", *self._image_volumes(client, {
                    "/tmp", *(v["bind"] for v in volumes.values()),
                    *(m["Target"] for m in mounts)}))}
            container = client.containers.create(
                self.image, shell if proxy is None else egress.wrap(
                    proxy, shell, egress.SYSTEM_PYTHON if self.host_usr else "python3"),
                working_dir=REPO, environment=self._environment(repo.resolve(), env),
                volumes=volumes, mounts=mounts or None,
                network_disabled=proxy is not None or not network, read_only=True,
                tmpfs=scratch,
                cap_drop=["ALL"], security_opt=["no-new-privileges"], user=f"{NOBODY}:{NOBODY}",
                mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
                pids_limit=limits.pids, nano_cpus=int(limits.cpus * 1e9),
                labels=labels, detach=True, log_config=LogConfig(type="none"),
                ulimits=[Ulimit(name="fsize", soft=watch.cap, hard=watch.cap)],
            )
            if copy:  # into the volume (the root is read-only); the step user owns out/
                _put_tree(container, out_dir, COPY_OUT, uid=NOBODY, writable=True)
        except MissingExtraError:
            raise
        except Exception as exc:
            _remove_quietly(client, container)
            return ExecResult(-1, int((time.monotonic() - start) * 1000),
                              infra_error=f"docker could not create a container: {exc}")
        total = 0
        stream: Any = None
        try:
            applied = engine_limits(container.attrs.get("HostConfig") or {}, limits)
            if self.require_limits and (applied.memory_mb is None or applied.pids is None):
                return ExecResult(-1, int((time.monotonic() - start) * 1000),
                                  infra_error="the docker engine dropped the memory/pids "
                                  "limits and the mood requires limits")
            # attached before the start, so no byte is missed; no engine-side copy is kept
            stream = container.attach(stdout=True, stderr=True, stream=True, logs=False)
            container.start()
            if not copy:  # in copy mode the output is capped when it comes back
                watch.start(lambda: _kill_quietly(container))
            lock, closed = threading.Lock(), False

            def pump() -> None:
                nonlocal total
                try:
                    for chunk in stream:
                        with lock:
                            if closed:  # exec returned: its sink is no longer ours to write
                                return
                            total += len(chunk)
                            sink(chunk)
                except OSError:  # the stream closed under it (exec gave up waiting)
                    return

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            timed_out = False
            try:  # stoppable as a child step is (``choir.sandbox.stop``)
                with stop.container(lambda: _kill_quietly(container)):
                    status = container.wait(timeout=timeout_s)
                code = int(status.get("StatusCode", -1))
            except Exception:  # requests' "Read timed out", not a TimeoutError
                timed_out = True
                container.kill()
                code = 124
            # The log stream can lag the container's exit by seconds for large outputs: drain
            # it to the end. A stream that does not end is reported, never silently cut.
            reader.join(timeout=max(60.0, timeout_s))
            with lock:
                closed = True
            incomplete = reader.is_alive()
            oom = False
            if code == 137 and not timed_out:  # SIGKILL: ask the engine whether it was OOM
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            if copy:
                watch.exceeded = _take_out(container, out_dir, watch.cap, watch.files, sink)
            result = ExecResult(code, int((time.monotonic() - start) * 1000),
                                timed_out=timed_out, oom_killed=oom, output_bytes=total,
                                limits_applied=applied,
                                infra_error="docker log stream did not finish: output incomplete"
                                if incomplete else None)
            return watch.verdict(result, sink)
        except Exception as exc:
            return ExecResult(-1, int((time.monotonic() - start) * 1000),
                              infra_error=f"docker failed: {exc}")
        finally:
            watch.stop()
            _close_quietly(stream)
            _remove_quietly(client, container)

    def _repo_volume(self, client: Any, repo: Path) -> str:
        """A volume holding ``repo`` (the sealed snapshot), made once per snapshot and reused
        by every step and verifier of this sandbox until ``close``.

        Keyed by a fingerprint of the tree (every path's type, mode, size, mtime and inode),
        so a tree changed in place gets a new volume. Filled through a loader container that
        is created and never started (the API refuses to extract into a read-only mount); the
        steps mount it read-only, and its files are root's with no write bits, so uid 65534
        could not change them through any mount.
        """
        key = _fingerprint(repo)
        with self._load_lock:
            name = self._repo_volumes.get(key)
            if name is not None:
                try:
                    client.volumes.get(name)
                    return name
                except Exception:  # noqa: BLE001 - removed meanwhile: load it again
                    del self._repo_volumes[key]
            labels = run_labels(time.time(), REPO_VOLUME_TTL_S)
            name = str(client.volumes.create(labels=labels).name)
            loader: Any = None
            try:
                loader = client.containers.create(
                    self.image, ["/bin/true"], network_disabled=True, labels=labels,
                    volumes={name: {"bind": REPO, "mode": "rw"}})
                _put_tree(loader, repo, REPO, uid=0, writable=False)
            except BaseException:
                _remove_quietly(client, loader, name)
                raise
            _remove_quietly(client, loader)
            self._repo_volumes[key] = name
            return name

    def close(self) -> None:
        if self._client is not None and self._repo_volumes:
            _remove_quietly(self._client, None, *self._repo_volumes.values())
        self._repo_volumes.clear()
        if self._client is not None:
            self._client.close()
            self._client = None


def resolve_transfer(transfer: str | None) -> str:
    """``bind`` or ``copy``: ``auto`` (the default) copies when the engine is remote.

    Raises:
        ConfigError: an unknown transfer.
    """
    transfer = transfer or os.environ.get("CHOIR_DOCKER_TRANSFER") or "auto"
    if transfer not in TRANSFERS:
        raise ConfigError(f"unknown docker transfer '{transfer}'",
                          hint=f"sandbox.transfer must be one of: {', '.join(TRANSFERS)}")
    if transfer == "auto":
        host = os.environ.get("DOCKER_HOST") or ""
        return "copy" if host.startswith(("tcp://", "ssh://", "http://", "https://")) else "bind"
    return transfer


def _put_tree(container: Any, root: Path, dest: str, *, uid: int, writable: bool) -> None:
    """Copy ``root`` to ``dest`` in ``container`` through the API, streamed from a temp file."""
    import tempfile

    from choir.sandbox.remote_copy import pack_tree

    parent = PurePosixPath(dest)
    with tempfile.TemporaryFile() as fh:
        pack_tree(root, fh, uid=uid, gid=uid, writable=writable, name=parent.name)
        fh.seek(0)
        if not container.put_archive(str(parent.parent), fh):
            raise RuntimeError(f"the engine refused the copy into {dest}")


def _take_out(container: Any, out_dir: Path, cap: int, files: int, sink: Sink) -> bool:
    """Replace ``out_dir``'s contents with the container's ``$CHOIR_OUT``; True when the
    copy stopped at ``cap`` bytes or ``files`` members. What was refused (links, devices,
    bad names) is noted in the step log, never written."""
    from choir.sandbox.remote_copy import clear_folder, unpack_out

    chunks, _ = container.get_archive(COPY_OUT)
    clear_folder(out_dir)
    done = unpack_out(chunks, out_dir, prefix=PurePosixPath(COPY_OUT).name, cap=cap,
                      files=files)
    for what in done.refused[:20]:
        sink(f"\n[choir] not copied from the container: {what}\n".encode())
    if len(done.refused) > 20:
        sink(f"[choir] ... and {len(done.refused) - 20} more not copied\n".encode())
    return done.exceeded


def _fingerprint(root: Path) -> str:
    """A hash of every path under ``root`` with its type, mode, size, mtime and inode."""
    from choir._core.canonical import blake3_hex

    rows: list[str] = [str(root)]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rows.append(f"{path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}")
    return blake3_hex("\n".join(rows).encode())


def _remove_quietly(client: Any, container: Any, *volumes: str) -> None:
    """Remove a container with its anonymous volumes, then named volumes; never raise."""
    if container is not None:
        try:
            container.remove(force=True, v=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    for volume in volumes if client is not None else ():
        try:
            client.volumes.get(volume).remove(force=True)
        except Exception:  # noqa: BLE001 - already gone; the sweep takes what is left
            pass


def engine_limits(host_config: Mapping[str, Any], limits: Limits) -> AppliedLimits:
    """The limits the engine kept for a container, from its inspected ``HostConfig``.

    An engine on a kernel without a controller drops that limit with only a warning (its
    ``HostConfig`` then shows 0): what is recorded is what the engine kept, not what was asked.
    """
    memory = int(host_config.get("Memory") or 0)
    pids = int(host_config.get("PidsLimit") or 0)
    nano = int(host_config.get("NanoCpus") or 0)
    return AppliedLimits(
        memory_mb=memory // (1024 * 1024) if memory > 0 else None,
        pids=pids if pids > 0 else None,
        cpus=nano / 1e9 if nano > 0 else None,
        out_mb=limits.out_mb,  # Choir's own watchdog (OutWatch) plus the fsize ulimit
    )


def _close_quietly(stream: Any) -> None:
    """Close an attach stream's socket (the SDK leaves it open once read to the end)."""
    if stream is None:
        return
    for close in (stream.close, stream._response.close):  # the socket, then its file
        try:
            close()
        except Exception:  # noqa: BLE001 - closed already
            pass


def _kill_quietly(container: Any) -> None:
    try:
        container.kill()
    except Exception:  # noqa: BLE001 - it ended meanwhile
        pass


def host_identity() -> str:
    """Which process table our PIDs belong to: this boot of this kernel, this PID namespace."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}/{os.readlink('/proc/self/ns/pid')}"


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # field 22; the command name (field 2) may hold spaces and parentheses, so split after it
    return stat[stat.rindex(")") + 2:].split()[19]


def run_labels(now: float, timeout_s: float) -> dict[str, str]:
    """The labels of a container started ``now`` for a run of at most ``timeout_s``."""
    pid = os.getpid()
    deadline = now + timeout_s
    return {
        LABEL: "1",
        OWNER_HOST: host_identity(),
        OWNER_PID: str(pid),
        OWNER_START: process_start(pid) or "",
        DEADLINE: f"{deadline:.0f}",
        # the log drain may take up to max(60, timeout) after the deadline (see exec)
        EXPIRES: f"{deadline + max(60.0, timeout_s) + GRACE_S:.0f}",
    }


def is_leftover(labels: Mapping[str, str], *, now: float, host: str) -> bool:
    """True when no live Choir process can still need a container with these labels.

    Containers without owner labels (not Choir's, or from an older Choir) are never leftovers:
    whoever made them decides.
    """
    if labels.get(LABEL) != "1" or not labels.get(OWNER_PID, "").isdigit():
        return False
    try:
        if now > float(labels[EXPIRES]):
            return True
    except (KeyError, ValueError):
        return False
    if labels.get(OWNER_HOST) != host:
        return False  # another machine's or namespace's process: only its deadline tells
    return process_start(int(labels[OWNER_PID])) != labels.get(OWNER_START)


def cleanup_leftovers(client: Any | None = None) -> int:
    """Remove Choir's containers whose owner is gone or whose time is up; returns how many.

    Safe with concurrent Choir processes: a live owner's container within its time stays,
    and one another process removes meanwhile is skipped. The listing is taken as the engine
    gives it (``sparse``: labels included), never inspected container by container: a
    container removed between the listing and its inspection made the whole sweep fail.
    """
    own = client is None
    client = client or _client()
    try:
        now, host = time.time(), host_identity()
        removed = 0
        for container in client.containers.list(all=True, filters={"label": f"{LABEL}=1"},
                                                sparse=True):
            if is_leftover(container.attrs.get("Labels") or {}, now=now, host=host):
                try:
                    container.remove(force=True, v=True)
                    removed += 1
                except Exception:  # noqa: BLE001 - removed by someone else meanwhile
                    pass
        # copy mode's repo volumes (a volume still in use is refused by the engine: kept)
        for volume in client.volumes.list(filters={"label": f"{LABEL}=1"}):
            if is_leftover(volume.attrs.get("Labels") or {}, now=now, host=host):
                try:
                    volume.remove(force=True)
                except Exception:  # noqa: BLE001 - in use or removed meanwhile
                    pass
        return removed
    finally:
        if own:
            client.close()


def _sweep_once(client: Any) -> None:
    """Clean leftovers the first time this process talks to the engine; never fail a run."""
    global _SWEPT_IN
    with _SWEEP_LOCK:
        if os.getpid() == _SWEPT_IN:
            return
        _SWEPT_IN = os.getpid()
        try:
            cleanup_leftovers(client)
        except Exception:  # noqa: BLE001 - an engine hiccup must not cost the run
            pass
