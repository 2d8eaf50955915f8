"""The default Docker image, built by Choir itself: offline, in milliseconds, on first use.

No registry may be reachable, so the default image is an almost empty root file system that
borrows the engine host's ``/usr`` (the docker backend binds it read-only): the symlinks
``bin``/``lib``/``lib64``/``sbin`` into ``usr``, an ``/etc/passwd`` and ``/etc/group`` that
name ``nobody``, a sticky ``/tmp``, and the mount points. It is imported from a tar made in
memory (a few kB), so a user with an engine and no image gets a working ``docker`` sandbox
instead of a 404; any other image is the user's to pull or build.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import threading
from typing import Any

log = logging.getLogger("choir.sandbox")
_LOCK = threading.Lock()


def host_rootfs() -> bytes:
    """The image's root file system as a tar (also what a remote engine is given)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for folder in ("usr", "etc", "tmp", "repo", "choir", "choir/out", "proc", "sys", "dev"):
            add(folder, tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755)
        for name in ("bin", "lib", "sbin") + (("lib64",) if os.path.exists("/lib64") else ()):
            add(name, tarfile.SYMTYPE, 0o777, link=f"usr/{name}")
        add("etc/passwd", tarfile.REGTYPE, 0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\nnogroup:x:65534:\n")
    return buf.getvalue()


def ensure_host_image(client: Any, name: str) -> None:
    """Import the host-/usr image as ``name`` (``repo:tag``) unless the engine has it.

    Raises:
        docker.errors.APIError: the engine refused the import.
    """
    with _LOCK:
        try:
            client.images.get(name)
            return
        except Exception:
            pass
        repository, _, tag = name.rpartition(":") if ":" in name else (name, "", "latest")
        log.warning("choir: building the Docker image %s from this host's /usr "
                    "(once, offline, a few kB)", name)
        client.api.import_image_from_data(host_rootfs(), repository=repository, tag=tag)
