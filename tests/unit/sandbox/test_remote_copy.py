"""What a hostile output archive may not do to the host (the docker backend's copy transfer).

The archive comes from the engine, which a step controls the output folder of (and a remote
engine may itself be compromised): names, links, devices and sizes are all attacker-chosen.
Each test builds the attack as a real tar stream and asserts the HOST afterwards.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.exceptions import ConfigError
from choir.sandbox.docker import resolve_transfer
from choir.sandbox.remote_copy import pack_tree, safe_relative, unpack_out


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> Iterator[bytes]:
    """A tar stream in small chunks, as the API's streamed response delivers it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    for i in range(0, len(raw), 1000):
        yield raw[i:i + 1000]


def member(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE,
           link: str = "", size: int | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o4755 if kind == tarfile.REGTYPE else 0o755
    if data is not None:
        info.size = len(data) if size is None else size
    return info, data


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its kind, links not followed."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else (
                "file" if path.is_file() else "other")
            found[str(path.relative_to(root))] = kind
    return found


def test_links_to_host_files_are_never_created(tmp_path: Path) -> None:
    """A step's symlink to /etc/shadow or hard link to the signing key stays in the container."""
    dest = tmp_path / "out"
    dest.mkdir()
    done = unpack_out(archive(member("out/", kind=tarfile.DIRTYPE),
                              member("out/shadow", kind=tarfile.SYMTYPE, link="/etc/shadow"),
                              member("out/key", kind=tarfile.LNKTYPE, link="/root/.ssh/id"),
                              member("out/ok.txt", b"fine")),
                      dest, prefix="out", cap=1 << 20)
    assert tree(dest) == {"ok.txt": "file"}
    assert (dest / "ok.txt").read_bytes() == b"fine"
    assert len(done.refused) == 2 and "/etc/shadow" in done.refused[0]
    assert not os.stat(dest / "ok.txt").st_mode & 0o6000  # no set-id bit reaches the host


def test_names_leaving_the_folder_are_refused(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "out"
    dest.mkdir(parents=True)
    done = unpack_out(archive(member("out/../escaped", b"x"), member("/etc/evil", b"x"),
                              member("out/sub/../../up", b"x"), member("other/x", b"x"),
                              member("out/in/ok", b"x")),
                      dest, prefix="out", cap=1 << 20)
    assert tree(tmp_path / "a") == {"out": "dir", "out/in": "dir", "out/in/ok": "file"}
    assert len(done.refused) == 4
    assert not Path("/etc/evil").exists()


def test_devices_and_fifos_are_not_created(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    dev = member("out/sda", kind=tarfile.BLKTYPE)
    dev[0].devmajor, dev[0].devminor = 8, 0
    done = unpack_out(archive(dev, member("out/pipe", kind=tarfile.FIFOTYPE),
                              member("out/null", kind=tarfile.CHRTYPE)),
                      dest, prefix="out", cap=1 << 20)
    assert tree(dest) == {}
    assert len(done.refused) == 3


def test_a_huge_file_stops_at_the_cap_and_host_receives_at_most_the_cap(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    cap = 64 * 1024
    done = unpack_out(archive(member("out/small", b"s" * 1000),
                              member("out/huge", b"h" * (cap * 4))),
                      dest, prefix="out", cap=cap)
    assert done.exceeded
    assert not (dest / "huge").exists()
    assert sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) <= cap


def test_a_file_where_a_folder_was_planted_is_refused(tmp_path: Path) -> None:
    """Duplicate names cannot be used to write through something made earlier."""
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(OSError):
        unpack_out(archive(member("out/a", b"1"), member("out/a", b"2")),
                   dest, prefix="out", cap=1 << 20)
    with pytest.raises(OSError):
        unpack_out(archive(member("out/f", b"1"), member("out/f/x", b"2")),
                   dest, prefix="out", cap=1 << 20)


def test_safe_relative() -> None:
    assert str(safe_relative("out/a/b", "out")) == "a/b"
    assert str(safe_relative("out", "out")) == "."
    assert str(safe_relative("./out/./a", "out")) == "a"
    for bad in ("/out/a", "out/../x", "x/out", "out/a\\..\\b", "", "out/a\x00"):
        assert safe_relative(bad, "out") is None


def test_pack_tree_never_follows_links_and_drops_write_bits(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text("x = 1\n")
    (root / "secret").write_text("s")
    os.chmod(root / "secret", 0o600)
    (root / "link").symlink_to("/etc/shadow")
    os.mkfifo(root / "fifo")
    buf = io.BytesIO()
    pack_tree(root, buf, uid=0, gid=0, writable=False, name="repo")
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"repo", "repo/pkg", "repo/pkg/m.py", "repo/secret", "repo/link"}
    assert members["repo/link"].issym() and members["repo/link"].size == 0
    assert members["repo/secret"].mode == 0o444  # readable by the step user, writable by nobody
    assert all(m.uid == 0 and not m.mode & 0o222 for m in members.values())


def test_transfer_is_copy_for_a_remote_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHOIR_DOCKER_TRANSFER", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert resolve_transfer(None) == "copy"
    assert resolve_transfer("bind") == "bind"
    monkeypatch.setenv("DOCKER_HOST", "ssh://builder@ci")
    assert resolve_transfer("auto") == "copy"
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert resolve_transfer(None) == "bind"
    assert resolve_transfer("copy") == "copy"
    with pytest.raises(ConfigError, match="sandbox.transfer"):
        resolve_transfer("rsync")


STEPS = 'verification: {steps: [{name: t, command: "exit 0"}]}\n'


def test_a_bad_transfer_in_choir_yaml_names_the_line(tmp_path: Path) -> None:
    from choir.config import load_repo_config

    (tmp_path / "choir.yaml").write_text("sandbox:\n  backend: docker\n  transfer: rsync\n"
                                         + STEPS)
    with pytest.raises(ConfigError) as err:
        load_repo_config(tmp_path)
    assert err.value.line == 3 and "transfer" in str(err.value)
    (tmp_path / "choir.yaml").write_text("sandbox: {backend: docker, transfer: copy}\n"
                                         + STEPS)
    assert load_repo_config(tmp_path).sandbox.transfer == "copy"


def test_the_transfer_option_reaches_docker_only() -> None:
    """``sandbox: {transfer: copy}`` with bwrap (or auto falling back to it) is not a crash."""
    from choir.sandbox import get_sandbox

    bwrap = get_sandbox("bwrap", transfer="copy", binds=())
    assert bwrap.name == "bwrap"
    assert get_sandbox("local", transfer="copy").name == "local"
    docker = get_sandbox("docker", transfer="copy")
    assert docker.transfer == "copy"  # type: ignore[attr-defined]
    docker.close()


def test_a_flood_of_members_stops_past_out_files(tmp_path: Path) -> None:
    """Review 21b: empty files and folders cost no bytes; the copy stops past ``files`` of
    each (refused members count as folders do: each is kept as a note)."""
    dest = tmp_path / "out"
    dest.mkdir()
    done = unpack_out(archive(*(member(f"out/e{n}", b"") for n in range(30))),
                      dest, prefix="out", cap=1 << 20, files=10)
    assert done.exceeded and done.files == 10 and len(list(dest.iterdir())) == 10
    dest = tmp_path / "out2"
    dest.mkdir()
    done = unpack_out(archive(*(member(f"out/d{n}/", kind=tarfile.DIRTYPE) for n in range(30)),
                              *(member(f"out/l{n}", kind=tarfile.SYMTYPE, link="/x")
                                for n in range(30))),
                      dest, prefix="out", cap=1 << 20, files=10)
    assert done.exceeded and len(list(dest.iterdir())) <= 10 and len(done.refused) <= 10
    dest = tmp_path / "out3"
    dest.mkdir()
    done = unpack_out(archive(*(member(f"out/e{n}", b"") for n in range(10))),
                      dest, prefix="out", cap=1 << 20, files=10)
    assert not done.exceeded and done.files == 10
