"""The vouch for a venv in the repo reuses its last digest when one ``find -newerct`` finds
no path changed since the rows were read: it must catch every change the rows would (the
attack: a file rewritten to the same size, its mtime set back), never answer for a change
within the clock's tick of the read (git's racy rule, here and in the per-file cache), and
give the digest the rows give."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from choir.sandbox import _interpreter
from choir.sandbox._toolchain import Toolchain


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Toolchain]:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_interpreter, "_MEMO", {})
    monkeypatch.setattr(_interpreter, "_MEMO_STAT", {})
    repo = tmp_path / "repo"
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (repo / ".venv" / "bin").mkdir()
    python = repo / ".venv" / "bin" / "python3"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (repo / ".venv" / "bin" / "python").symlink_to("python3")
    (site / "pkg.py").write_text("VALUE = 1\n")
    (site / "pkg.pth").write_text("import os\n")
    (repo / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    venv = str(repo / ".venv")
    return repo, Toolchain(binds=(), path_head=(f"{venv}/bin",), venv=venv)


def _settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are older than the racy window (they were made just now: no wait of 2 s)."""
    time.sleep(0.05)
    monkeypatch.setattr(_interpreter, "RACY_S", 0.01)


def _measured_by_rows(monkeypatch: pytest.MonkeyPatch, tools: Toolchain, repo: Path,
                      digest: str) -> None:
    """The next measure gives ``digest`` from the rows, not from the record."""
    made: list[str] = []
    rows = _interpreter._tree_rows
    monkeypatch.setattr(_interpreter, "_tree_rows",
                        lambda *a, **k: made.append("rows") or rows(*a, **k))
    assert _interpreter.measure(tools, repo).digest == digest
    assert made == ["rows"]


def _rows_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> list[str]:
        raise AssertionError("the rows were made again")

    monkeypatch.setattr(_interpreter, "_tree_rows", refuse)


def test_an_unchanged_venv_is_vouched_from_its_listing_with_the_rows_digest(
        venv: tuple[Path, Toolchain], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, tools = venv
    _settle(monkeypatch)
    first = _interpreter.measure(tools, repo)
    assert first.in_repo and first.files > 5
    assert _interpreter.measure(tools, repo, full=True).digest == first.digest
    _rows_refused(monkeypatch)
    again = _interpreter.measure(tools, repo)
    assert (again.digest, again.files) == (first.digest, first.files)


@pytest.mark.parametrize("change", ["same-size-mtime-back", "planted-pth", "mode", "relinked",
                                    "removed"])
def test_any_change_to_the_venv_misses_the_listing(venv: tuple[Path, Toolchain],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  change: str) -> None:
    repo, tools = venv
    _settle(monkeypatch)
    first = _interpreter.measure(tools, repo)
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    time.sleep(0.02)  # past the clock tick of the files' making
    if change == "same-size-mtime-back":  # what an executor can do: mtime yes, ctime no
        before = os.stat(site / "pkg.py")
        (site / "pkg.py").write_text("VALUE = 2\n")
        os.utime(site / "pkg.py", ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(site / "pkg.py").st_size == before.st_size
    elif change == "planted-pth":
        (site / "zz.pth").write_text("import evil\n")
    elif change == "mode":
        (site / "pkg.py").chmod(0o777)
    elif change == "relinked":
        (repo / ".venv" / "bin" / "python").unlink()
        (repo / ".venv" / "bin" / "python").symlink_to("/bin/sh")
    else:
        (site / "pkg.pth").unlink()
    after = _interpreter.measure(tools, repo)
    assert after.digest != first.digest
    assert after.digest == _interpreter.measure(tools, repo, full=True).digest


def test_a_tree_changed_within_the_racy_window_is_never_answered_from_the_record(
        venv: tuple[Path, Toolchain], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, tools = venv  # its files were made just now: inside the default 2 s
    first = _interpreter.measure(tools, repo)
    cache = _interpreter._load_cache(_interpreter._cache_file(os.path.realpath(tools.venv or "")))
    assert not [p for p in cache if not p.startswith("\0")], "hashes of racy files were kept"
    _measured_by_rows(monkeypatch, tools, repo, first.digest)


def test_without_find_the_rows_decide(venv: tuple[Path, Toolchain],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    repo, tools = venv
    _settle(monkeypatch)
    with_find = _interpreter.measure(tools, repo).digest
    monkeypatch.setattr(_interpreter, "_MEMO", {})
    monkeypatch.setattr(_interpreter, "FIND", str(repo / "no-find-here"))
    home = Path(os.environ["CHOIR_HOME"])
    for cached in (home / "cache" / "interpreters").glob("*.json"):
        cached.unlink()
    assert not _interpreter._unchanged([str(repo / ".venv")], [], 0.0)
    assert _interpreter.measure(tools, repo).digest == with_find


def test_a_second_write_in_the_tick_of_the_read_is_never_served_from_the_per_file_cache(
        tmp_path: Path) -> None:
    """A file read and cached, then rewritten (same size, mtime set back) before the
    kernel's clock ticks: its stat is the one cached, its bytes are not. The old cache
    answered the first bytes' hash (a ``.pth`` swapped under a vouch ran unchecked).

    This kernel stamps a change after a ``stat`` finely (multigrain timestamps, Linux 6.13),
    so the race cannot be staged here; on a coarse clock (older kernels, other file systems)
    the second ``lstat`` returns the first one's fields, which is what is passed below."""
    path = tmp_path / "evil.pth"
    path.write_text("import os  # A\n")
    st = os.lstat(path)
    cache: dict[str, list[int | str]] = {}
    first = _interpreter._file_hash(str(path), st, cache, False)
    path.write_text("import os  # B\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.lstat(path).st_size == st.st_size
    assert _interpreter._file_hash(str(path), st, cache, False) != first
    assert not cache  # nothing this recent is kept


def test_a_settled_file_is_cached_and_any_later_write_misses_it(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    path = tmp_path / "ok.pth"
    path.write_text("import os  # A\n")
    time.sleep(0.05)
    monkeypatch.setattr(_interpreter, "RACY_S", 0.01)
    st = os.lstat(path)
    cache: dict[str, list[int | str]] = {}
    first = _interpreter._file_hash(str(path), st, cache, False)
    assert list(cache) == [str(path)]
    path.write_text("import os  # B\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _interpreter._file_hash(str(path), os.lstat(path), cache, False) != first


def test_a_folder_of_the_venv_that_cannot_be_listed_is_refused_not_skipped(
        venv: tuple[Path, Toolchain], monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder with mode 0311 (review 14's suspicion): Python still imports the names it
    knows from it, but the walk could not list it and left what it holds out of the digest,
    so a module in it could change unseen. Root reads any folder, so the denial is staged."""
    from choir.exceptions import UserError
    from choir.sandbox import base

    repo, tools = venv
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "hidden").mkdir()
    (site / "hidden" / "mod.py").write_text("X = 1\n")
    real = os.scandir

    def scandir(path: str) -> object:
        if str(path).endswith("/hidden"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(base.os, "scandir", scandir)
    with pytest.raises(UserError, match="hidden cannot be listed.*chmod u\\+rx"):
        _interpreter.measure(tools, repo, full=True)


def test_a_clock_set_back_since_the_record_makes_the_rows_again(
        venv: tuple[Path, Toolchain], monkeypatch: pytest.MonkeyPatch) -> None:
    """A change's ctime is wall-clock time: after the clock is set back (an NTP step, a
    resumed VM), a later write could be stamped before the moment recorded and pass
    ``find -newerct`` unseen (review 15's suspicion). The wall clock must have run as the
    boot clock did since the record."""
    repo, tools = venv
    _settle(monkeypatch)
    first = _interpreter.measure(tools, repo)
    real = time.time
    monkeypatch.setattr(_interpreter.time, "time", lambda: real() - 10)
    _measured_by_rows(monkeypatch, tools, repo, first.digest)
