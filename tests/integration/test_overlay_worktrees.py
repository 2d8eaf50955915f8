"""Worktrees from the store (``choir.evidence.worktrees``): an overlay of a sealed checkout,
made only in Choir's own mount namespace. Each case runs in a child confined as every
``choir`` command is (``choir.trusted.separate``), so no mount reaches the host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import forked

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="overlays are mounted as root"),
              pytest.mark.slow]  # CI's slow stage: the README's command stays under five minutes


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    for n in range(200):
        folder = path / f"pkg{n % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{n}.py").write_text(f"X = {n}\n")
    (path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(path / "run.sh", 0o755)
    (path / "link").symlink_to("pkg0/m0.py")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    return path


def confined(code: str, *, private: bool = True) -> dict[str, object]:
    """Run ``code`` (it fills ``out``) in a child, confined as ``choir`` commands are, or
    not (then in the host's mount namespace)."""
    head = "from choir.trusted import separate\nassert separate() == 'mount-namespace'\n"
    script = (head if private else "") + "import json, os, pathlib, subprocess\nout = {}\n" \
        + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def landed(plan: Path, repo: Path, plan_id: str) -> set[str]:
    """``choir plan run PLAN`` (it must succeed): the files on its integration branch."""
    ran = forked.run([sys.executable, "-m", "choir", "plan", "run", str(plan), "--json"],
                     capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return set(git(repo, "ls-tree", "--name-only", f"choir/plan/{plan_id}/integration").split())


MAKE = """
from choir.evidence.git import locate
from choir.evidence import worktrees
repo = pathlib.Path({repo!r})
git = locate(repo)
def make(name, branch, start="main"):
    return git.add_worktree(pathlib.Path({root!r}) / name, branch, start)
"""


def test_a_worktree_is_an_overlay_of_the_sealed_checkout(repo: Path, tmp_path: Path) -> None:
    out = confined(MAKE.format(repo=str(repo), root=str(tmp_path / "trees")) + """
a = make("a", "choir/a")
b = make("b", "choir/b")
out["mounted"] = [worktrees._mounted(a.root), worktrees._mounted(b.root)]
subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=True)  # records it keeps
listed = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"],
                        capture_output=True, text=True).stdout
head = git.rev("main")
out["listed"] = [f"worktree {w.root}\\nHEAD {head}\\nbranch refs/heads/choir/{n}" in listed
                 for n, w in (("a", a), ("b", b))]
out["clean"] = subprocess.run(["git", "-C", str(a.root), "status", "--porcelain"],
                              capture_output=True, text=True).stdout
out["files"] = sorted(str(p.relative_to(a.root)) for p in a.root.rglob("*")
                      if p.is_file() and ".git" not in p.parts)
out["mode"] = oct(os.stat(a.root / "run.sh").st_mode & 0o777)
out["link"] = os.readlink(a.root / "link")
with open(a.root / "pkg0" / "m0.py", "r+") as fh:  # in place: copied up, never the store's
    fh.write("Y")
out["b_sees"] = (b.root / "pkg0" / "m0.py").read_text()
a.write("add", "-A")
a.write("commit", "-qm", "item a")
out["committed"] = subprocess.run(["git", "-C", str(repo), "show", "choir/a:pkg0/m0.py"],
                                  capture_output=True, text=True).stdout
store = pathlib.Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "trees"
out["objects_intact"] = all(
    subprocess.run(["git", "hash-object", str(p)], capture_output=True, text=True
                   ).stdout.strip() == p.name
    for kind in ("F", "X") for p in (store / "objects" / kind).iterdir())
git.write("worktree", "remove", "--force", str(a.root))
out["removed"] = not a.root.exists() and not worktrees._mounted(a.root)
""")
    assert out["mounted"] == [True, True] and out["listed"] == [True, True]
    assert out["clean"] == ""
    assert len(out["files"]) == 202  # type: ignore[arg-type]  # 200 modules, run.sh, link
    assert out["mode"] == "0o755" and out["link"] == "pkg0/m0.py"
    assert out["b_sees"] == "X = 0\n"
    assert out["committed"] == "Y = 0\n"
    assert out["objects_intact"] is True and out["removed"] is True


def test_every_mount_and_unmount_of_a_worktree_is_counted(repo: Path, tmp_path: Path) -> None:
    """What the sandbox's launchers compare besides the mount table (review 16d: a
    remount over the same layers reads the same there; ``test_cgroup_pool``)."""
    out = confined(MAKE.format(repo=str(repo), root=str(tmp_path / "trees")) + """
from choir._core import mounts
start = mounts.generation()
a = make("a", "choir/a")
out["made"] = mounts.generation() - start
worktrees.release(a.root)
out["released"] = mounts.generation() - start
""")
    assert out == {"made": 1, "released": 2}


def test_outside_a_private_mount_namespace_a_worktree_is_a_checkout(repo: Path,
                                                                    tmp_path: Path) -> None:
    out = confined(MAKE.format(repo=str(repo), root=str(tmp_path / "trees")) + """
a = make("a", "choir/a")
out["mounted"] = worktrees._mounted(a.root)
out["count"] = len(list(a.root.rglob("*.py")))
""", private=False)
    assert out == {"mounted": False, "count": 200}


def test_a_resumed_process_mounts_the_worktree_again(repo: Path, tmp_path: Path) -> None:
    roots = str(tmp_path / "trees")
    first = confined(MAKE.format(repo=str(repo), root=roots) + """
a = make("a", "choir/a")
(a.root / "pkg1" / "new.py").write_text("new = 1\\n")
out["ok"] = True
""")
    assert first == {"ok": True}
    assert sorted(os.listdir(tmp_path / "trees" / "a")) == [".git"]  # the host sees no mount
    again = confined(MAKE.format(repo=str(repo), root=roots) + f"""
a = git.worktree_at(pathlib.Path({roots!r}) / "a")
out["new"] = (a.root / "pkg1" / "new.py").read_text()
out["old"] = (a.root / "pkg1" / "m1.py").read_text()
""")
    assert again == {"new": "new = 1\n", "old": "X = 1\n"}


def test_a_lower_written_between_worktrees_is_built_again(repo: Path, tmp_path: Path) -> None:
    """A process with the caller's uid writes the sealed checkout (and covers it up): the
    next worktree made from it sees the record's stamps differ and gets a new one; while a
    worktree still stands on it, it is left under that worktree, and the next one is a
    plain checkout from git's objects instead."""
    out = confined(MAKE.format(repo=str(repo), root=str(tmp_path / "trees")) + """
a = make("a", "choir/a")
store = pathlib.Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "trees"
[lower] = [p for p in (store / "lowers").iterdir() if p.is_dir()]
target = lower / "pkg2" / "m2.py"
before = target.stat()
target.write_text("X = 9\\n")  # the same size
os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
held = make("held", "choir/held")
out["held"] = [worktrees._mounted(held.root), (held.root / "pkg2" / "m2.py").read_text()]
out["a"] = len(os.listdir(a.root / "pkg2"))
git.write("worktree", "remove", "--force", str(a.root))
b = make("b", "choir/b")
out["b"] = (b.root / "pkg2" / "m2.py").read_text()
""")
    assert out == {"held": [False, "X = 2\n"], "a": 40, "b": "X = 2\n"}


def test_a_lower_another_lower_links_to_stays_under_its_worktrees(repo: Path,
                                                                  tmp_path: Path) -> None:
    """A lower built for a new commit links the last one's files: every shared inode's ctime
    moves. The last lower is still the one the worktrees made from it stand on: the next
    worktree of its commit re-reads what moved and keeps it (the same folder), where it once
    rebuilt it and removed the old one under the live overlays (their files vanished, and
    their items committed nothing)."""
    out = confined(MAKE.format(repo=str(repo), root=str(tmp_path / "trees")) + """
store = pathlib.Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "trees"
def lowers():
    return {p.name: p.stat().st_ino for p in (store / "lowers").iterdir() if p.is_dir()}
a = make("a", "choir/a")
(a.root / "pkg1" / "mine.py").write_text("mine = 1\\n")
first = lowers()
b = make("b", "choir/b")
(b.root / "pkg3" / "m3.py").write_text("X = 33\\n")
b.write("commit", "-qam", "item b")
head = b.rev("HEAD")
c = make("c", "choir/c", head)  # a second lower: links to the first one's files
d = make("d", "choir/d")  # the first lower again
out["first_kept"] = all(lowers().get(name) == ino for name, ino in first.items())
out["a"] = len(os.listdir(a.root / "pkg1"))  # its 40 modules and its own
out["mine"] = (a.root / "pkg1" / "mine.py").read_text()
out["c"] = (c.root / "pkg3" / "m3.py").read_text()
out["d"] = (d.root / "pkg3" / "m3.py").read_text()
""")
    assert out == {"first_kept": True, "a": 41,
                   "mine": "mine = 1\n", "c": "X = 33\n", "d": "X = 3\n"}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_choir_plan_run_makes_its_worktrees_from_the_store(tmp_path: Path,
                                                           choir_home: Path) -> None:
    """The real CLI runs confined, so its worktrees are overlays: the sealed checkout is
    in the store after the plan, and the merged tree is the items' work. ``c`` waits for
    ``a``: its worktree is mounted after the sandbox launchers were armed (a launcher's
    private copy of the mounts lacked it, and c's executor found an empty folder)."""
    from tests.team import team_repo, write_plan

    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "ov", """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: c
          goal: write c
          executor: {kind: command, command: 'echo C > c.txt'}
          depends_on: [a]
        """)
    assert {"a.txt", "c.txt"} <= landed(plan, tmp_path / "repo", "ov")
    lowers = choir_home / "artifacts" / "trees" / "lowers"
    assert [p for p in lowers.iterdir() if p.is_dir()], "no worktree came from the store"
    # the plan's end removed its worktrees: no mount, no upper layer left behind
    assert not list((tmp_path / ".repo.choir-plans" / "ov").rglob("*.txt"))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_items_side_by_side_keep_their_work_while_others_land(tmp_path: Path,
                                                              choir_home: Path) -> None:
    """``choir plan run`` with items side by side: ``a`` lands while ``s`` still runs, and
    ``e`` starts on the base meanwhile. ``a``'s head got a lower linked from the base's,
    and ``e``'s worktree once found the base's lower changed (its files' ctimes), rebuilt it
    and removed the old one under ``s``'s overlay: ``s`` committed an empty tree and failed
    at its gate. Every item must land with its own file."""
    from tests.team import team_repo, write_plan

    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "side", """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: s
          goal: write s, slowly
          executor: {kind: command, command: 'sleep 3 && echo S > s.txt'}
        - id: e
          goal: write e
          executor: {kind: command, command: 'echo E > e.txt'}
        """)
    assert {"a.txt", "s.txt", "e.txt"} <= landed(plan, tmp_path / "repo", "side")


def test_another_process_never_removes_a_lower_a_worktree_stands_on(repo: Path,
                                                                    tmp_path: Path) -> None:
    """Two ``choir`` processes on one store (two plans at once): each mounts in a namespace
    of its own, so the other's mounts are not in its mount table. The second one trims the
    store's lowers (here: keeping none) after building one of its own; the first one's
    worktree must keep its files, and its lower must stay."""
    roots = str(tmp_path / "trees")
    ready, done = tmp_path / "ready", tmp_path / "done"
    git(repo, "checkout", "-qb", "other")
    (repo / "pkg3" / "m3.py").write_text("X = 33\n")
    git(repo, "commit", "-qam", "other")
    git(repo, "checkout", "-q", "main")
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        from choir.trusted import separate
        assert separate() == 'mount-namespace'
        import json, os, pathlib, time
        """) + MAKE.format(repo=str(repo), root=roots) + textwrap.dedent(f"""
        a = make("a", "choir/a")
        pathlib.Path({str(ready)!r}).write_text("")
        while not pathlib.Path({str(done)!r}).exists():
            time.sleep(0.05)
        print(json.dumps(len(os.listdir(a.root / "pkg1"))))
        """)], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        for _ in range(600):
            if ready.exists() or first.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), "the first process made no worktree"
        second = confined(MAKE.format(repo=str(repo), root=roots) + """
worktrees.LOWER_MAX = 0  # keep no lower that is not in use
c = make("c", "choir/c", "other")  # a lower of its own, then the trim
out["c"] = (c.root / "pkg3" / "m3.py").read_text()
""")
        assert second == {"c": "X = 33\n"}
    finally:
        done.write_text("")
        seen, _ = first.communicate(timeout=120)
    assert json.loads(seen) == 40, "the first process's worktree lost its files"


@pytest.mark.parametrize("last", [".git", "gitdir"])
def test_a_worktree_killed_while_its_record_was_written_is_made_again(
        repo: Path, tmp_path: Path, last: str) -> None:
    """The process making a worktree is killed as it writes one of the record's last files
    (``last``): the half-written record is one ``git worktree prune`` removes, so the next
    process makes the worktree there again, on its branch (a ``locked`` file left behind, as
    git's own ``worktree add`` leaves one, kept the record and its branch forever)."""
    roots = str(tmp_path / "trees")
    make = MAKE.format(repo=str(repo), root=roots) + 'make("a", "choir/a")\n'
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from choir.trusted import separate
        assert separate() == 'mount-namespace'
        import json, os, pathlib
        written = pathlib.Path.write_text
        def dying(self, *args, **kwargs):
            if self.name == LAST:
                os._exit(9)
            return written(self, *args, **kwargs)
        pathlib.Path.write_text = dying
        """).replace("LAST", repr(last)) + make],
        capture_output=True, text=True, timeout=120, env=os.environ)
    assert killed.returncode == 9, killed.stderr[-2000:]
    out = confined(MAKE.format(repo=str(repo), root=roots) + """
a = make("a", "choir/a")
out["a"] = (a.root / "pkg1" / "m1.py").read_text()
subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=True)
listed = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"],
                        capture_output=True, text=True).stdout
out["records"] = listed.count("branch refs/heads/choir/a")
""")
    assert out == {"a": "X = 1\n", "records": 1}


def _with_submodule(repo: Path) -> None:
    """``repo``'s next commit holds a submodule entry at ``sub`` (never cloned here)."""
    git(repo, "update-index", "--add", "--cacheinfo", "160000," + "1" * 40 + ",sub")
    (repo / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n'
                                      '\turl = https://example.invalid/sub\n')
    git(repo, "add", ".gitmodules")
    git(repo, "commit", "-qm", "submodule")


COMMIT = MAKE + """
from types import SimpleNamespace
from choir.team.moves import Moves
moves = Moves()
moves.git, moves.trees = git, pathlib.Path({root!r})
work = git.add_worktree(moves.item_tree("x"), "choir/plan/p/item/x", "main")
def commit():
    try:
        return moves._commit("x", SimpleNamespace(goal="g", base=git.rev("main")))
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
"""


def test_a_repository_planted_in_an_overlay_worktree_runs_nothing_when_committed(
        repo: Path, tmp_path: Path) -> None:
    """The base's submodule folder made a repository with no commit, whose config names a
    clean filter for a file whose stat alone changed: the driver's ``git add -A`` asked it
    whether it was dirty, and its ``git status`` ran the filter as Choir (a review found it).
    Found in the overlay's upper layer before any git runs: nothing runs, nothing is
    committed."""
    _with_submodule(repo)
    marker = tmp_path / "pwned"
    out = confined(COMMIT.format(repo=str(repo), root=str(tmp_path / "trees")) + f"""
(work.root / "a.txt").write_text("legit\\n")
sub = work.root / "sub"
sub.mkdir(exist_ok=True)
def nested(*args):
    subprocess.run(["git", "-C", str(sub), *args], check=True, capture_output=True)
nested("init", "-q")
(sub / "f").write_text("abc\\n")
nested("add", "f")
nested("config", "filter.evil.clean", "sh -c 'touch {marker}; cat'")
(sub / ".gitattributes").write_text("f filter=evil\\n")
os.utime(sub / "f", (1, 1))
out["commit"] = commit()
out["branch"] = git.rev("choir/plan/p/item/x") == git.rev("main")
""")
    assert not marker.exists(), "a planted repository's filter ran as Choir"
    assert out["commit"].startswith("UserError") and "sub/.git" in out["commit"], out
    assert out["branch"] is True  # nothing committed


def test_a_submodule_folder_is_in_an_overlay_worktree_as_in_a_checkout(
        repo: Path, tmp_path: Path) -> None:
    """A repo with a submodule: the checkout git makes holds its folder, empty; the store's
    did not, so every item's ``git add -A`` recorded the submodule deleted and the item
    failed at the submodule check, whatever it changed."""
    _with_submodule(repo)
    out = confined(COMMIT.format(repo=str(repo), root=str(tmp_path / "trees")) + """
out["sub"] = sorted(os.listdir(work.root / "sub"))
(work.root / "a.txt").write_text("legit\\n")
made = commit()
out["kept"] = moves._outside_tree(made, git.rev("main"))
out["status"] = subprocess.run(["git", "-C", str(work.root), "status", "--porcelain"],
                               capture_output=True, text=True).stdout
""")
    assert out == {"sub": [], "kept": "", "status": ""}


def test_a_worktree_under_a_path_with_a_space_is_mounted_once_and_released(
        repo: Path, tmp_path: Path) -> None:
    """The mount table writes a space as ``\\040``: a worktree under a folder with a space
    in its name was never found mounted, so every lookup mounted another overlay on it and
    its release unmounted none (while letting go of its lower's pin)."""
    out = confined(MAKE.format(repo=str(repo), root=str(tmp_path / "my trees")) + """
a = make("a b", "choir/a")
for _ in range(3):
    git.worktree_at(a.root)
def overlays():
    with open("/proc/self/mountinfo") as fh:
        return sum(1 for line in fh if " - overlay " in line and "my\\\\040trees" in line)
out["mounted"] = [worktrees._mounted(a.root), overlays()]
worktrees.release(a.root)
out["released"] = [worktrees._mounted(a.root), overlays()]
""")
    assert out == {"mounted": [True, 1], "released": [False, 0]}
