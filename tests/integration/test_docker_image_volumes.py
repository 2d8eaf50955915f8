"""An image's ``VOLUME`` (review 23b's doubt, confirmed): Docker gives each container an
anonymous volume there, on the engine's disk, writable by whoever the folder lets write.
With a world-writable ``VOLUME /data`` a step wrote 344 MB to the host's disk past every cap
(``$CHOIR_OUT``'s, ``/tmp``'s 256 MiB tmpfs), as many files as it liked. Such a folder is now
a tmpfs of ``/tmp``'s size (Docker refuses a read-only anonymous volume), counted in the
step's memory."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.sandboxes import docker_or_skip

pytestmark = pytest.mark.docker

IMAGE = "choir-test-volume:1"


def _image() -> None:
    """The host-/usr image with a world-writable ``/data``, declared ``VOLUME /data``."""
    import docker

    from choir.sandbox._host_image import host_rootfs

    client: Any = docker.from_env()
    try:
        client.images.get(IMAGE)
        return
    except docker.errors.ImageNotFound:
        pass
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(host_rootfs())) as src, \
            tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        folder = tarfile.TarInfo("data")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o1777
        dst.addfile(folder)
    repository, _, tag = IMAGE.rpartition(":")
    client.api.import_image_from_data(out.getvalue(), repository=repository, tag=tag,
                                      changes=["VOLUME /data"])


def test_an_image_volume_holds_no_more_than_tmp(tmp_path: Path) -> None:
    from choir.models import Limits
    from choir.sandbox.docker import DockerSandbox

    docker_or_skip()
    _image()
    box = DockerSandbox(image=IMAGE, host_usr=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    said: list[bytes] = []
    try:
        result = box.exec(
            "head -c 300000000 /dev/zero > /data/big && echo WROTE || echo CAPPED; "
            "grep ' /data ' /proc/mounts", repo=repo, out_dir=tmp_path / "out", env={},
            timeout_s=60, limits=Limits(), network=False, sink=said.append)
    finally:
        box.close()
    text = b"".join(said).decode()
    assert result.infra_error is None, result
    assert "CAPPED" in text and "WROTE" not in text, text
    assert "tmpfs /data tmpfs" in text, text  # not the engine's disk
