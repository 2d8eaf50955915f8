"""Incremental snapshots: a round's sealed tree is built from the one parked before it, and
nothing done to a parked tree or to the store between rounds is used.

Each attack has its control: the same attack with the defence turned off gets its bytes
into the snapshot (the defence is what stops it, not luck). Every test runs twice: with the
base checked in process before the scan (a small tree), and checked by a child process
beside the scan, its answer reconciled after (a big tree: ``choir.evidence.stamps``).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from choir.evidence import stamps, statcache
from choir.evidence import store as store_module
from choir.evidence._table import Table
from choir.evidence.sealer import Sealer
from choir.evidence.store import Store
from choir.evidence.tree import inspect_tree, remove_snapshot, snapshot
from tests.unit.evidence.conftest import BUGGY, FORGED


@pytest.fixture(autouse=True)
def _no_racy_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statcache, "RACY_NS", 0)


@pytest.fixture(autouse=True, params=["checked first", "checked beside the scan"])
def check_where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "checked beside the scan":
        monkeypatch.setattr(stamps, "SPAWN_ROWS", 0)
    return str(request.param)


def checked_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A control that turns ``Sealer.check`` off: the check runs in process, before."""
    monkeypatch.setattr(stamps, "SPAWN_ROWS", 10**9)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "choir-home" / "artifacts" / "trees"


def parked(store_dir: Path) -> Path:
    [tree] = list((store_dir / "pool").iterdir())
    return tree


def round_trip(repo: Path, root: Path, **kw: Any) -> tuple[str, dict[str, bytes], Path]:
    """Snapshot, read every file of it, park it again; the tree hash, the bytes, the path."""
    snap = snapshot(repo, root, **kw)
    assert snap.path is not None
    files = {str(p.relative_to(snap.path)): p.read_bytes() for p in snap.path.rglob("*")
             if p.is_file() and not p.is_symlink()}
    remove_snapshot(root)
    return snap.tree_hash, files, snap.path


def tamper(path: Path, data: bytes) -> None:
    """Write ``data`` into a sealed file the way its owner can, then cover it up: the mode
    and the mtime put back."""
    before = path.stat()
    os.chmod(path, 0o644)
    path.write_bytes(data)
    os.chmod(path, before.st_mode & 0o777)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_second_round_builds_on_the_parked_tree(repo: Path, tmp_path: Path,
                                                  store_dir: Path) -> None:
    root = tmp_path / "snaps"
    snap = snapshot(repo, root)
    assert snap.path is not None
    inodes = {p.name: p.lstat().st_ino for p in snap.path.rglob("*")}
    assert (snap.path / "calc.py").stat().st_mode & 0o777 == 0o444
    assert (snap.path / "run.sh").stat().st_mode & 0o777 == 0o555
    assert (snap.path / "pkg").stat().st_mode & 0o777 == 0o555
    assert os.readlink(snap.path / "link.py") == "pkg/m1.py"
    # never a link to the live file: a write to the repo in place reaches no snapshot
    assert (snap.path / "calc.py").stat().st_ino != (repo / "calc.py").stat().st_ino
    remove_snapshot(root)
    assert not (root / snap.tree_hash).exists() and len(list((store_dir / "pool").iterdir())) == 1
    (repo / "calc.py").write_bytes(FORGED)
    (repo / "pkg" / "m3.py").unlink()
    (repo / "pkg" / "new").mkdir()
    (repo / "pkg" / "new" / "n.py").write_text("n = 1\n")
    again = snapshot(repo, root)
    assert again.path is not None and again.tree_hash == inspect_tree(repo).tree_hash
    now = {p.name: p.lstat().st_ino for p in again.path.rglob("*")}
    assert now["m1.py"] == inodes["m1.py"] and now["leaf.py"] == inodes["leaf.py"]
    assert now["calc.py"] != inodes["calc.py"]
    assert (again.path / "calc.py").read_bytes() == FORGED
    assert "m3.py" not in now and (again.path / "pkg" / "new" / "n.py").read_text() == "n = 1\n"
    assert (again.path / "pkg" / "new").stat().st_mode & 0o777 == 0o555
    remove_snapshot(root)
    (repo / "calc.py").write_bytes(BUGGY)
    (repo / "pkg" / "m3.py").write_text("x = 0003\n")
    (repo / "pkg" / "new" / "n.py").unlink()
    (repo / "pkg" / "new").rmdir()
    assert round_trip(repo, root)[0] == snap.tree_hash  # back: the first tree again


def test_an_in_place_write_to_the_live_repo_never_reaches_a_snapshot(
        repo: Path, tmp_path: Path) -> None:
    snap = snapshot(repo, tmp_path / "snaps")
    assert snap.path is not None
    with open(repo / "calc.py", "r+b") as fh:  # in place: same inode
        fh.write(b"#")
    assert (snap.path / "calc.py").read_bytes() == BUGGY


def test_an_object_written_between_rounds_is_detected_not_used(
        repo: Path, tmp_path: Path, store_dir: Path) -> None:
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    tamper(parked(store_dir) / "calc.py", FORGED)
    second, files, _ = round_trip(repo, root)
    assert files["calc.py"] == BUGGY and second == first == inspect_tree(repo).tree_hash
    # the store's own copy was written too (the same inode): it is never linked again
    obj = next((store_dir / "objects" / "f").rglob("*"), None)
    assert obj is not None


def test_control_without_the_check_the_written_object_is_used(
        repo: Path, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "snaps"
    round_trip(repo, root)
    tamper(parked(store_dir) / "calc.py", FORGED)
    checked_first(monkeypatch)
    monkeypatch.setattr(Sealer, "check", lambda self: None)
    _, files, _ = round_trip(repo, root)
    assert files["calc.py"] == FORGED


def test_control_beside_the_scan_without_the_reconcile_the_written_object_is_used(
        repo: Path, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan takes every base entry whose digest matches as kept while the check runs
    beside it: ``reconcile`` is what sets a written one right."""
    root = tmp_path / "snaps"
    round_trip(repo, root)
    tamper(parked(store_dir) / "calc.py", FORGED)
    monkeypatch.setattr(stamps, "SPAWN_ROWS", 0)
    monkeypatch.setattr(Sealer, "reconcile", lambda self: None)
    _, files, _ = round_trip(repo, root)
    assert files["calc.py"] == FORGED


def test_a_check_beside_the_scan_that_gives_no_answer_is_made_in_process(
        repo: Path, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that fails (here: it is not Python at all) decides nothing: the same check
    runs in process, and the written object is still refused."""
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    tamper(parked(store_dir) / "calc.py", FORGED)
    monkeypatch.setattr(stamps, "SPAWN_ROWS", 0)
    monkeypatch.setattr(stamps.sys, "executable", "/bin/false")
    second, files, _ = round_trip(repo, root)
    assert files["calc.py"] == BUGGY and second == first


@pytest.mark.parametrize("other", ["gone", "same rows, restamped"])
def test_a_check_beside_the_scan_that_read_another_record_is_not_used(
        repo: Path, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch,
        other: str) -> None:
    """The child prints which record it read (the files' own checks) and how many rows:
    its answer about another record is not taken, and the check runs in process. "gone":
    nothing is off an empty record. "same rows, restamped": a record of as many rows, the
    written file's stamp put in it, so nothing is off it either: only which record was read
    tells the answers apart."""
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    tree = parked(store_dir)
    tamper(tree / "calc.py", FORGED)
    elsewhere = store_dir / "other-record"
    if other != "gone":
        rows = Store(store_dir).record(tree.name).rows.as_dict()
        rows["calc.py"] = (*store_module.stamp_of(os.lstat(tree / "calc.py")),
                           *rows["calc.py"][5:])
        Table(elsewhere, store_module.RECORD).replace(rows)
    monkeypatch.setattr(stamps, "SPAWN_ROWS", 0)
    real = stamps.Beside.__init__

    def redirected(self: stamps.Beside, root: Path, record: Path, loaded: str,
                   rows: int) -> None:
        real(self, root, elsewhere, loaded, rows)

    monkeypatch.setattr(stamps.Beside, "__init__", redirected)
    second, files, _ = round_trip(repo, root)
    assert files["calc.py"] == BUGGY and second == first


CUT = ("import sys, io; sys.path.insert(0, sys.argv[1]); "
       "from choir.evidence import stamps; out = io.BytesIO(); "
       "sys.stdout = io.TextIOWrapper(out); stamps.main(sys.argv[2:]); "
       "sys.__stdout__.buffer.write(out.getvalue()[:-len(b'calc.py' + bytes(1) + b'end')])")


# an answer for the very record read, naming nothing off it, and ending in a field "end":
# what one cut short after a path named "end" looked like (the end mark alone took it)
CUT_AT_END = ("import sys, io; sys.path.insert(0, sys.argv[1]); "
              "from choir.evidence import stamps; out = io.BytesIO(); "
              "sys.stdout = io.TextIOWrapper(out); stamps.main(sys.argv[2:]); "
              "sys.__stdout__.buffer.write(bytes(1).join("
              "out.getvalue().split(bytes(1))[:2] + [b'end']))")


@pytest.mark.parametrize("child", ["cut short", "cut after a path named end", "stopped"])
def test_a_check_beside_the_scan_whose_answer_is_cut_or_late_is_not_used(
        repo: Path, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch,
        child: str) -> None:
    """An answer without its end mark (here the written file's path cut off it) is not
    taken; nor is one still not given after ``WAIT_S`` (a child stopped): the child is
    killed, and the check runs in process."""
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    tamper(parked(store_dir) / "calc.py", FORGED)
    monkeypatch.setattr(stamps, "SPAWN_ROWS", 0)
    if child == "cut short":
        monkeypatch.setattr(stamps, "_CHILD", CUT)
    elif child == "cut after a path named end":
        monkeypatch.setattr(stamps, "_CHILD", CUT_AT_END)
    else:
        monkeypatch.setattr(stamps, "_CHILD", "import time; time.sleep(600)")
        monkeypatch.setattr(stamps, "WAIT_S", 0.5)
    began = time.monotonic()
    second, files, _ = round_trip(repo, root)
    assert files["calc.py"] == BUGGY and second == first
    assert time.monotonic() - began < 60  # not the stopped child's ten minutes


def test_the_check_beside_the_scan_answers_as_the_check_in_process(
        repo: Path, tmp_path: Path, store_dir: Path) -> None:
    """The child's answer is used, not only its fallback: the same paths as in process."""
    round_trip(repo, tmp_path / "snaps")
    tree = parked(store_dir)
    tamper(tree / "calc.py", FORGED)
    os.chmod(tree / "pkg", 0o755)  # a folder off its record too
    os.chmod(tree / "pkg", 0o555)
    table = Store(store_dir).record(tree.name)
    here = stamps.off_record(tree, table.rows)
    beside = stamps.Beside(tree, table.path, table.loaded, len(table.rows)).result()
    assert beside == here and "calc.py" in here and "pkg" in here


@pytest.mark.parametrize("where", ["pkg/deep", ""])
def test_a_file_planted_in_a_parked_tree_is_removed(repo: Path, tmp_path: Path,
                                                    store_dir: Path, where: str) -> None:
    """In a folder, or at the top of the parked tree with nothing else changed (review 18d
    F1: the root is in no record row, and the unchanged tree's shortcut skipped the
    cleaning: a planted top-level file rode into the next round's sealed tree)."""
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    folder = parked(store_dir) / where
    os.chmod(folder, 0o755)
    (folder / "conftest.py").write_bytes(b"import calc\ncalc.add = lambda a, b: a + b\n")
    os.chmod(folder, 0o555)
    second, files, path = round_trip(repo, root)
    planted = f"{where}/conftest.py".lstrip("/")
    assert planted not in files and second == first
    assert not os.path.lexists(path / planted)


def test_control_without_the_folder_check_the_planted_file_stays(
        repo: Path, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "snaps"
    round_trip(repo, root)
    folder = parked(store_dir) / "pkg" / "deep"
    os.chmod(folder, 0o755)
    (folder / "conftest.py").write_bytes(b"planted")
    os.chmod(folder, 0o555)
    checked_first(monkeypatch)
    monkeypatch.setattr(Sealer, "_clean_dirs", lambda self, *a: None)
    _, files, _ = round_trip(repo, root)
    assert files["pkg/deep/conftest.py"] == b"planted"


def test_a_link_swapped_for_another_file_is_detected(repo: Path, tmp_path: Path,
                                                     store_dir: Path) -> None:
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    folder = parked(store_dir)
    os.chmod(folder, 0o755)
    (folder / "calc.py").unlink()
    (folder / "calc.py").write_bytes(FORGED)
    os.chmod(folder / "calc.py", 0o444)
    os.chmod(folder, 0o555)
    second, files, _ = round_trip(repo, root)
    assert files["calc.py"] == BUGGY and second == first


def test_a_folder_swapped_for_a_symlink_is_never_followed(repo: Path, tmp_path: Path,
                                                          store_dir: Path) -> None:
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "leaf.py").write_text("stolen = 1\n")
    folder = parked(store_dir) / "pkg"
    os.chmod(folder, 0o755)
    os.chmod(folder / "deep", 0o755)
    for name in os.listdir(folder / "deep"):
        (folder / "deep" / name).unlink()
    (folder / "deep").rmdir()
    (folder / "deep").symlink_to(outside)
    os.chmod(folder, 0o555)
    second, files, path = round_trip(repo, root)
    assert files["pkg/deep/leaf.py"] == b"leaf = 1\n" and second == first


def test_paranoid_is_immune_to_a_forged_record(repo: Path, tmp_path: Path,
                                               store_dir: Path) -> None:
    """The stamps the check compares live in the store too: a process with the caller's uid
    can write the object and then the record to match (the residual docs/security.md
    names). ``full`` hashes the finished tree whole and trusts neither."""
    root = tmp_path / "snaps"
    first, _, _ = round_trip(repo, root)
    tree = parked(store_dir)
    tamper(tree / "calc.py", FORGED)
    record = Store(store_dir).record(tree.name)
    row = record.rows["calc.py"]
    record.save({"calc.py": (*store_module.stamp_of(os.lstat(tree / "calc.py")), *row[5:])})
    _, fooled, _ = round_trip(repo, root)
    assert fooled["calc.py"] == FORGED  # what the stat checks cannot see
    tamper(parked(store_dir) / "calc.py", FORGED)
    second, files, _ = round_trip(repo, root, full=True)
    assert files["calc.py"] == BUGGY and second == first


def test_a_store_object_written_between_rounds_is_not_linked_into_a_fresh_tree(
        repo: Path, tmp_path: Path, store_dir: Path) -> None:
    held = snapshot(repo, tmp_path / "held")  # lent, not parked: the next tree has no base
    [obj] = [p for p in (store_dir / "objects" / "f").iterdir() if p.read_bytes() == BUGGY]
    tamper(obj, FORGED)
    second, files, _ = round_trip(repo, tmp_path / "snaps")
    assert files["calc.py"] == BUGGY and second == held.tree_hash


def test_an_evicted_tree_leaves_no_object_behind(repo: Path, tmp_path: Path,
                                                 store_dir: Path) -> None:
    round_trip(repo, tmp_path / "snaps")
    assert list((store_dir / "objects" / "f").iterdir())
    Store(store_dir).evict(parked(store_dir).name)
    assert not list((store_dir / "objects" / "f").iterdir())
    assert not list((store_dir / "pool").iterdir())


def test_a_tree_lent_to_a_process_that_died_is_parked_by_the_next_claim(
        repo: Path, tmp_path: Path, store_dir: Path) -> None:
    root = tmp_path / "snaps"
    code = textwrap.dedent(f"""\
        import os, pathlib
        from choir.evidence import stamps, statcache
        from choir.evidence.tree import snapshot
        statcache.RACY_NS = 0
        snap = snapshot(pathlib.Path({str(repo)!r}), pathlib.Path({str(root)!r}))
        print(snap.path)
        os._exit(0)  # gone without giving the tree back
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=os.environ)
    left = Path(proc.stdout.strip())
    assert left.is_dir() and not list((store_dir / "pool").iterdir())
    again = snapshot(repo, tmp_path / "other")
    assert again.path is not None and again.tree_hash == left.name
    assert not left.exists()  # taken back, checked and reused, not copied again
    assert len(list((store_dir / "notes").iterdir())) == 1


def test_the_pool_keeps_at_most_pool_max_trees(repo: Path, tmp_path: Path, store_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "POOL_MAX", 2)
    held = [snapshot(repo, tmp_path / f"s{n}") for n in range(4)]  # four lent at once
    for n in range(4):
        remove_snapshot(tmp_path / f"s{n}")
    assert len(list((store_dir / "pool").iterdir())) == 2
    assert len(list((store_dir / "notes").iterdir())) == 2
    assert all(h.tree_hash == held[0].tree_hash for h in held)


def test_an_object_linked_the_most_times_allowed_is_copied(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.link
    calls = {"n": 0}

    def link(src: Any, dst: Any, **kw: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.EMLINK, "Too many links")
        real(src, dst, **kw)

    monkeypatch.setattr(os, "link", link)
    tree_hash, files, _ = round_trip(repo, tmp_path / "snaps")
    assert tree_hash == inspect_tree(repo).tree_hash and files["calc.py"] == BUGGY


def test_a_snapshot_root_on_another_file_system_is_copied(repo: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("CHOIR_TREE_STORE", "off")
    snap = snapshot(repo, tmp_path / "snaps")
    assert snap.path is not None and snap.tree_hash == inspect_tree(repo).tree_hash
    assert (snap.path / "calc.py").stat().st_nlink == 1
    assert not (tmp_path / "choir-home" / "artifacts" / "trees").exists()


def test_a_tree_whose_objects_another_tree_let_go_is_checked_by_its_bytes_and_kept(
        repo: Path, tmp_path: Path, store_dir: Path) -> None:
    """Unlinking an object from one tree changes its ctime in every tree that links it:
    the next claim finds those entries off their record, re-hashes them, keeps them (the
    same inodes) and records them again, so the round after reads nothing."""
    first = snapshot(repo, tmp_path / "a")  # two trees of the same files, both lent
    second = snapshot(repo, tmp_path / "b")
    assert first.path is not None and second.path is not None
    inode = (second.path / "pkg" / "m1.py").stat().st_ino
    remove_snapshot(tmp_path / "a")
    remove_snapshot(tmp_path / "b")
    pool = sorted((store_dir / "pool").iterdir(), key=lambda p: p.stat().st_mtime)
    Store(store_dir).evict(pool[0].name)  # its links go: the other tree's ctimes move
    again = snapshot(repo, tmp_path / "c")
    assert again.path is not None and again.tree_hash == first.tree_hash
    assert (again.path / "pkg" / "m1.py").stat().st_ino == inode
    remove_snapshot(tmp_path / "c")
    sealer = Sealer(Store(store_dir), statcache.repo_key(repo.resolve()), "")  # refreshed
    try:
        assert sealer.base is not None
        sealer.check()
        assert sealer._bad == set()
    finally:
        sealer.close()


def _children() -> set[int]:
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def test_a_snapshot_that_fails_leaves_no_git_process_running(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git's listing starts before the store readies the base; a failure before the scan
    asked for it left git running with its pipe open (a CI run's ResourceWarning: a
    subprocess still running, an unclosed reader)."""
    import choir.evidence.tree as tree_module

    def broken(*_args: Any, **_kw: Any) -> Any:
        raise RuntimeError("the store could not be readied")

    before = _children()
    monkeypatch.setattr(tree_module, "Sealer", broken)
    with pytest.raises(RuntimeError):
        snapshot(repo, tmp_path / "snaps")
    left = _children() - before
    assert not left, f"processes left running or unreaped: {left}"
