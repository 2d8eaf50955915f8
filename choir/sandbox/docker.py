"""``docker``: a fresh container per command, always removed (seed 001: no reuse).

The repo is bind-mounted read-only and is the working directory; the run's output folder is
the only writable mount; no network unless the policy allows it; all capabilities dropped,
no-new-privileges, uid 65534, read-only root with a tmpfs /tmp, memory/pids/CPU limits from
the policy. Containers carry the label ``choir.managed=1`` so leftovers can be cleaned.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from choir.exceptions import MissingExtraError
from choir.models import Limits
from choir.sandbox.base import ExecResult, Sandbox, Sink, prepare_out, register_sandbox, step_env

DEFAULT_IMAGE = "choir-test:host"
LABEL = "choir.managed"
OUT = "/choir/out"


def _client(timeout: float = 10) -> Any:
    try:
        import docker
    except ImportError as exc:
        raise MissingExtraError("the docker sandbox needs: pip install 'choir[docker]'") from exc
    return docker.from_env(timeout=int(timeout))


@register_sandbox("docker")
class DockerSandbox(Sandbox):
    isolation = "container"

    def __init__(self, image: str | None = None, host_usr: bool | None = None) -> None:
        self.image = image or os.environ.get("CHOIR_DOCKER_IMAGE") or DEFAULT_IMAGE
        # the locally built test image carries no toolchain: it borrows the host's /usr
        self.host_usr = host_usr if host_usr is not None else self.image == DEFAULT_IMAGE
        self._client: Any = None

    @classmethod
    def available(cls) -> bool:
        try:
            client = _client(timeout=2)
            client.ping()
            client.close()
        except Exception:
            return False
        return True

    def has_image(self) -> bool:
        """True when the configured image is present locally (no registry is assumed)."""
        try:
            self.client().images.get(self.image)
        except Exception:
            return False
        return True

    def client(self) -> Any:
        if self._client is None:
            self._client = _client(timeout=60)
        return self._client

    def describe(self) -> dict[str, str | None]:
        try:
            image = self.client().images.get(self.image)
        except Exception:
            return {"image": self.image, "image_digest": None}
        digests = image.attrs.get("RepoDigests") or []
        return {"image": self.image, "image_digest": digests[0] if digests else image.id}

    def _volumes(self, repo: Path, out_dir: Path) -> dict[str, dict[str, str]]:
        volumes = {str(repo): {"bind": "/repo", "mode": "ro"},
                   str(out_dir): {"bind": OUT, "mode": "rw"}}
        if self.host_usr:
            import sys

            for path in {"/usr", "/etc/alternatives", sys.base_prefix, sys.prefix}:
                if os.path.isdir(path):
                    volumes[path] = {"bind": path, "mode": "ro"}
        return volumes

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink) -> ExecResult:
        prepare_out(out_dir)
        for path in [out_dir, *out_dir.rglob("*")]:
            os.chown(path, 65534, 65534)  # the container user must be able to write
        start = time.monotonic()
        try:
            client = self.client()
            container = client.containers.create(
                self.image, ["/bin/sh", "-c", command],
                working_dir="/repo", environment=step_env(OUT, env),
                volumes=self._volumes(repo.resolve(), out_dir.resolve()),
                network_disabled=not network, read_only=True,
                tmpfs={"/tmp": "rw,nosuid,size=256m"},
                cap_drop=["ALL"], security_opt=["no-new-privileges"], user="65534:65534",
                mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
                pids_limit=limits.pids, nano_cpus=int(limits.cpus * 1e9),
                labels={LABEL: "1"}, detach=True,
            )
        except MissingExtraError:
            raise
        except Exception as exc:
            return ExecResult(-1, int((time.monotonic() - start) * 1000),
                              infra_error=f"docker could not create a container: {exc}")
        total = 0
        try:
            container.start()
            stream = container.logs(stream=True, follow=True, stdout=True, stderr=True)

            def pump() -> None:
                nonlocal total
                for chunk in stream:
                    total += len(chunk)
                    sink(chunk)

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            timed_out = False
            try:
                status = container.wait(timeout=timeout_s)
                code = int(status.get("StatusCode", -1))
            except Exception:  # requests' "Read timed out" (PLATFORM.md), not a TimeoutError
                timed_out = True
                container.kill()
                code = 124
            # The log stream can lag the container's exit by seconds for large outputs: drain
            # it to the end. A stream that does not end is reported, never silently cut.
            reader.join(timeout=max(60.0, timeout_s))
            incomplete = reader.is_alive()
            oom = False
            if code == 137 and not timed_out:  # SIGKILL: ask the engine whether it was OOM
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            return ExecResult(code, int((time.monotonic() - start) * 1000), timed_out=timed_out,
                              oom_killed=oom, output_bytes=total,
                              infra_error="docker log stream did not finish: output incomplete"
                              if incomplete else None)
        except Exception as exc:
            return ExecResult(-1, int((time.monotonic() - start) * 1000),
                              infra_error=f"docker failed: {exc}")
        finally:
            try:
                container.remove(force=True)
            except Exception:
                pass

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def cleanup_leftovers() -> int:
    """Remove every container Choir labelled; returns how many."""
    client = _client()
    found = client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
    for container in found:
        container.remove(force=True)
    return len(found)
