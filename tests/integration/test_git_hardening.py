"""git is data, not code: plants in ``.git`` cannot make Choir bind a commit to another tree.

Each plant is made the way an executor would (it can write anything under the repo, ``.git``
included), shown live with plain git (the control), and then shown to have no effect on what
Choir records: the tree's commit, ``gate --commit``'s tree, or the repository it reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zlib
from pathlib import Path

import pytest

from choir.evidence.tree import commit_tree_hash, inspect_tree, resolve_commit, snapshot, tree_hash
from choir.exceptions import UserError
from tests import forked
from tests.workitems import BUGGY, FIXED, PY, calc_repo


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, text=True, env=env).stdout


def buggy_repo(path: Path) -> tuple[Path, str, str]:
    """A committed buggy tree: (repo, commit B, the tree hash of B's checkout)."""
    path.mkdir(parents=True)
    (path / "calc.py").write_text(BUGGY)
    (path / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n"
                                       "    assert add(2, 3) == 5\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "buggy")
    return path, git(path, "rev-parse", "HEAD").strip(), tree_hash(path)


def fix_and_commit(repo: Path) -> str:
    (repo / "calc.py").write_text(FIXED)
    git(repo, "commit", "-qam", "fix")
    return git(repo, "rev-parse", "HEAD").strip()


def test_a_replace_ref_cannot_make_commit_b_read_as_the_fix(tmp_path: Path) -> None:
    repo, b, buggy = buggy_repo(tmp_path / "repo")
    f = fix_and_commit(repo)
    fixed = tree_hash(repo)
    git(repo, "replace", b, f)
    git(repo, "reset", "-q", "--soft", b)
    # the control: plain git now reads B as F
    assert git(repo, "rev-parse", f"{b}^{{tree}}") == git(repo, "rev-parse", f"{f}^{{tree}}")
    seen = inspect_tree(repo)
    assert seen.tree_hash == fixed
    assert seen.commit_sha is None, "a commit was named for a tree it does not hold"
    assert commit_tree_hash(repo, b) == buggy
    assert commit_tree_hash(repo, f) == fixed


def test_a_planted_loose_object_cannot_make_commit_b_read_as_the_fix(tmp_path: Path) -> None:
    """Without replace refs: F's commit bytes written under B's name (git does not re-hash a
    loose object it reads), then HEAD moved back to B."""
    repo, b, buggy = buggy_repo(tmp_path / "repo")
    f = fix_and_commit(repo)
    git(repo, "reset", "-q", "--soft", b)
    forged = subprocess.run(["git", "-C", str(repo), "cat-file", "commit", f],
                            capture_output=True, check=True).stdout
    loose = repo / ".git" / "objects" / b[:2] / b[2:]
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"commit %d\0" % len(forged) + forged))
    # the control: plain git reads B as F
    assert git(repo, "cat-file", "-p", b).splitlines()[0] == \
        git(repo, "cat-file", "-p", f).splitlines()[0]
    assert inspect_tree(repo).commit_sha is None
    assert commit_tree_hash(repo, b) is None  # a planted object is no commit at all
    assert buggy != tree_hash(repo)


def test_a_graft_cannot_rewrite_history_for_choir(tmp_path: Path) -> None:
    repo, b, _ = buggy_repo(tmp_path / "repo")
    f = fix_and_commit(repo)
    (repo / ".git" / "info" / "grafts").write_text(f"{f}\n")  # F without parents
    # the control: plain git honours the graft
    plain = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", "HEAD^"],
                           capture_output=True, text=True)
    assert plain.returncode != 0, "the graft plant is not live"
    assert resolve_commit(repo, "HEAD^") == b
    assert inspect_tree(repo).commit_sha == f


def _other_repo(tmp_path: Path) -> Path:
    other = tmp_path / "other"
    other.mkdir()
    (other / "calc.py").write_text(FIXED)
    git(other, "init", "-q")
    git(other, "add", "-A")
    git(other, "commit", "-qm", "elsewhere")
    return other


def test_alternates_outside_the_repo_are_refused(tmp_path: Path) -> None:
    repo, _b, _ = buggy_repo(tmp_path / "repo")
    other = _other_repo(tmp_path)
    elsewhere = git(other, "rev-parse", "HEAD").strip()
    (repo / ".git" / "objects" / "info" / "alternates").write_text(
        str(other / ".git" / "objects") + "\n")
    # the control: plain git reads a commit that lives only outside the repo
    assert git(repo, "cat-file", "-t", elsewhere).strip() == "commit"
    with pytest.raises(UserError, match="borrows objects"):
        inspect_tree(repo)
    with pytest.raises(UserError, match="borrows objects"):
        snapshot(repo, tmp_path / "snaps")


def test_a_dot_git_file_pointing_elsewhere_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(FIXED)
    other = _other_repo(tmp_path)
    (repo / ".git").write_text(f"gitdir: {other / '.git'}\n")
    # the control: plain git takes the other repository as this one's, clean at its HEAD
    assert git(repo, "rev-parse", "HEAD") == git(other, "rev-parse", "HEAD")
    assert git(repo, "status", "--porcelain") == ""
    with pytest.raises(UserError, match="not a worktree"):
        inspect_tree(repo)
    (repo / ".git").unlink()
    os.symlink(other / ".git", repo / ".git")
    assert git(repo, "rev-parse", "HEAD") == git(other, "rev-parse", "HEAD")
    with pytest.raises(UserError, match="symlink"):
        inspect_tree(repo)


def test_a_commondir_in_a_plain_dot_git_is_refused(tmp_path: Path) -> None:
    repo, _b, _ = buggy_repo(tmp_path / "repo")
    other = _other_repo(tmp_path)
    (repo / ".git" / "commondir").write_text(str(other / ".git") + "\n")
    assert git(repo, "rev-parse", "HEAD") == git(other, "rev-parse", "HEAD")  # live
    with pytest.raises(UserError, match="commondir"):
        inspect_tree(repo)


def test_a_linked_worktree_is_read_and_its_commit_recorded(tmp_path: Path) -> None:
    repo, b, buggy = buggy_repo(tmp_path / "repo")
    git(repo, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "side")
    seen = inspect_tree(tmp_path / "wt")
    assert (seen.tree_hash, seen.commit_sha) == (buggy, b)


def test_core_worktree_and_global_config_do_not_change_the_listing(tmp_path: Path) -> None:
    repo, b, buggy = buggy_repo(tmp_path / "repo")
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "decoy.py").write_text("x = 1\n")
    git(repo, "config", "core.worktree", str(decoy))
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[core]\n\texcludesFile = " + str(home / "ignore") + "\n")
    (home / "ignore").write_text("calc.py\n")
    env = dict(os.environ, HOME=str(home))
    # the control: plain git lists the decoy folder as the work tree
    assert "decoy.py" in git(repo, "ls-files", "--others", env=env)
    os.environ["HOME"], saved = str(home), os.environ["HOME"]
    try:
        seen = inspect_tree(repo)
    finally:
        os.environ["HOME"] = saved
    assert (seen.tree_hash, seen.commit_sha) == (buggy, b)


REPLACE = """\
import pathlib, subprocess
git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
b = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
pathlib.Path("calc.py").write_text({fixed!r})
subprocess.run([*git, "commit", "-qam", "fix"], check=True)
f = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
subprocess.run([*git, "replace", b, f], check=True)
subprocess.run([*git, "reset", "-q", "--soft", b], check=True)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_an_executor_cannot_get_a_buggy_commit_through_the_gate_with_a_replace_ref(
        tmp_path: Path, choir_home: Path) -> None:
    """End to end: the executor fixes the tree, then makes the buggy commit B read as the
    fix. The ASSERT is for the fixed tree; B must not pass ``gate --commit``."""
    repo = calc_repo(tmp_path / "repo", canary="CANARY-git-hardening", sandbox="bwrap")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "buggy")
    b = git(repo, "rev-parse", "HEAD").strip()
    (tmp_path / "replace.py").write_text(REPLACE.format(fixed=FIXED))
    item = tmp_path / "item.yaml"
    item.write_text(textwrap.dedent(f"""\
        id: replace
        goal: add must add
        repo: ./repo
        max_attempts: 1
        executor:
          kind: command
          command: {PY} {tmp_path / 'replace.py'}
        """))
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--json"],
                      capture_output=True, text=True, timeout=300)
    assert git(repo, "rev-parse", "HEAD").strip() == b, proc.stderr  # the plant is in place
    assert git(repo, "replace", "-l").strip() == b
    assert json.loads(proc.stdout)["status"] == "asserted", proc.stdout + proc.stderr
    atts = [json.loads(p.read_text()) for p in (choir_home / "attestations").rglob("*.json")]
    assert atts and all(a["body"]["target"]["commit_sha"] != b for a in atts)
    gate = forked.run([PY, "-m", "choir", "gate", "replace", "--commit", b],
                      capture_output=True, text=True, cwd=repo, timeout=120)
    assert gate.returncode == 1, gate.stdout + gate.stderr
    ok = forked.run([PY, "-m", "choir", "gate", "replace"], capture_output=True, text=True,
                    cwd=repo, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the fixed tree itself did pass


def test_the_hypothesis_reads_changed_files_without_running_the_repos_git_config(
        tmp_path: Path) -> None:
    # the governance loop listed changed files with plain `git -C repo diff`: a repo config's
    # core.fsmonitor ran as Choir, outside any sandbox
    import subprocess

    from choir.graph.adjudicate import changed_files

    repo = tmp_path / "repo"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a],  # noqa: E731
                                    cwd=repo, check=True, capture_output=True)
    run("init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    run("add", "-A")
    run("commit", "-qm", "c")
    marker = tmp_path / "ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    hook.chmod(0o755)
    run("config", "core.fsmonitor", str(hook))
    (repo / "a.py").write_text("x = 2\n")
    (repo / "b.py").write_text("y = 1\n")
    subprocess.run(["git", "-C", str(repo), "status"], capture_output=True)
    assert marker.exists()  # control: the plant is live for plain git
    marker.unlink()
    assert changed_files(repo, None) == ["a.py", "b.py"]
    assert not marker.exists()


def _write_through_filter(repo: Path, name: str) -> None:
    """A driver write that checks files out (``read-tree -u``), so a smudge filter
    the config names would run on them."""
    from choir.evidence.git import locate

    found = locate(repo)
    assert found is not None
    (repo / f"{name}.txt").write_text(name)
    found.write("add", "-A")
    found.write("commit", "-qm", name)
    (repo / f"{name}.txt").unlink()
    found.write("checkout", "--", f"{name}.txt")


@pytest.mark.parametrize("through_include", [False, True])
def test_a_filter_planted_after_a_cached_write_is_still_pinned(
        tmp_path: Path, through_include: bool) -> None:
    """The driver asks git for the config's filters once per content of the config files
    (``GitRepo._program_pins``). A filter planted after that, in the config itself or in a
    file the config includes (whose change leaves the config's bytes alone), must be pinned
    off on the next write all the same."""
    repo, _, _ = buggy_repo(tmp_path / "repo")
    marker = tmp_path / "ran"
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    extra = tmp_path / "extra.cfg"
    extra.write_text("")
    if through_include:
        git(repo, "config", "include.path", str(extra))
    _write_through_filter(repo, "first")  # the listing is taken (and kept, without include)
    planted = f'[filter "evil"]\n\tsmudge = "sh -c \'touch {marker}; cat\'"\n' \
              f'\tclean = "sh -c \'touch {marker}; cat\'"\n\trequired = true\n'
    with (extra if through_include else repo / ".git" / "config").open("a") as fh:
        fh.write(planted)
    # the control: plain git runs the planted filter
    probe = tmp_path / "probe"
    shutil.copytree(repo, probe)
    if through_include:
        git(probe, "config", "include.path", str(extra))
    (probe / "first.txt").unlink()
    git(probe, "checkout", "--", "first.txt")
    assert marker.exists(), "the control: the planted filter runs under plain git"
    marker.unlink()
    _write_through_filter(repo, "second")
    assert not marker.exists(), "a write ran a filter planted after its listing was cached"


def _filter_config(marker: Path) -> str:
    return (f'[filter "evil"]\n\tsmudge = "sh -c \'touch {marker}; cat\'"\n'
            f'\tclean = "sh -c \'touch {marker}; cat\'"\n\trequired = true\n')


def test_a_commondir_planted_in_a_worktrees_admin_folder_cannot_bring_a_config(
        tmp_path: Path) -> None:
    """A linked worktree's admin folder names the common folder in ``commondir``, which git
    follows. Rewritten after the worktree was made (and after a write cached the config's
    listing) to point at a copy whose config names a filter, it must change nothing: git is
    told the common folder Choir located."""
    from choir.evidence.git import locate

    repo, _, _ = buggy_repo(tmp_path / "repo")
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attrs")
    main = locate(repo)
    assert main is not None
    work = main.add_worktree(tmp_path / "wt", "wt", "HEAD")
    work.write("status")  # a write: the listing is taken and kept
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.git"
    shutil.copytree(repo / ".git", evil)
    with (evil / "config").open("a") as fh:
        fh.write(_filter_config(marker))
    (work.git_dir / "commondir").write_text(f"{evil}\n")
    # the control: git following the admin folder's commondir runs the filter
    (tmp_path / "wt" / "a.txt").unlink()
    subprocess.run(["git", "checkout", "--", "a.txt"], cwd=tmp_path / "wt", check=True,
                   env={**os.environ, "GIT_DIR": str(work.git_dir)}, capture_output=True)
    assert marker.exists(), "the control: the planted commondir's filter runs under git"
    marker.unlink()
    (tmp_path / "wt" / "a.txt").unlink()
    work.write("checkout", "--", "a.txt")
    assert not marker.exists(), "a write followed a commondir planted after the worktree"


def test_a_config_changed_while_git_lists_it_cannot_poison_the_kept_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a kept listing opens: the config names a filter; between Choir's read of it
    and git's listing the filter is taken out, then put back. Had git listed the live file,
    its listing (no filter) would be kept under the bytes that name one, and every later
    write of the restored config would leave the filter unpinned. git lists the bytes Choir
    read instead (``git config --file -``)."""
    from choir.evidence import git as gitmod
    from choir.evidence.git import GitRepo, locate

    repo, _, _ = buggy_repo(tmp_path / "repo")
    config = repo / ".git" / "config"
    config.write_text(config.read_text() + _filter_config(tmp_path / "ran"))
    found = locate(repo)
    assert found is not None
    real = GitRepo._list_names

    def racing(self: GitRepo, bytes_read: bytes | None) -> list[str]:
        hostile = config.read_text()
        config.write_text(hostile.split('[filter "evil"]')[0])  # out while git lists ...
        try:
            return real(self, bytes_read)
        finally:
            config.write_text(hostile)  # ... and back

    monkeypatch.setattr(GitRepo, "_list_names", racing)
    gitmod._PINS.clear()
    assert "filter.evil.smudge=" in found._program_pins()
    monkeypatch.setattr(GitRepo, "_list_names", real)
    assert "filter.evil.smudge=" in found._program_pins()


def test_a_listing_git_cannot_make_refuses_the_write_and_is_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing that times out (or a config git cannot parse) would leave every filter
    unpinned: the write is refused, and nothing is kept for the next one."""
    from choir.evidence import git as gitmod
    from choir.evidence.git import locate

    repo, _, _ = buggy_repo(tmp_path / "repo")
    found = locate(repo)
    assert found is not None
    gitmod._PINS.clear()
    real = subprocess.run

    def slow_listing(argv: list[str], *args: object, **kwargs: object) -> object:
        if "--get-regexp" in argv:
            raise subprocess.TimeoutExpired(argv, 60)
        return real(argv, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(gitmod.subprocess, "run", slow_listing)
    with pytest.raises(UserError, match="no write is made without them pinned"):
        found.write("status")
    assert not gitmod._PINS
    monkeypatch.setattr(gitmod.subprocess, "run", real)
    with (repo / ".git" / "config").open("a") as fh:
        fh.write("[broken\n")
    with pytest.raises(UserError, match="no write is made without them pinned"):
        found.write("status")


def test_a_config_that_is_a_fifo_does_not_hang_the_listing(tmp_path: Path) -> None:
    """``config.worktree`` made a FIFO (which a plain read would block on forever): the
    key is not taken, git is asked (and refuses it, or reads nothing), nothing hangs."""
    from choir.evidence import git as gitmod
    from choir.evidence.git import locate

    repo, _, _ = buggy_repo(tmp_path / "repo")
    found = locate(repo)
    assert found is not None
    os.mkfifo(repo / ".git" / "config.worktree")
    assert found._config_files() is None
    gitmod._PINS.clear()
    found._program_pins()  # git does not read config.worktree unless the extension says so
    assert not gitmod._PINS


def _worktrees(tmp_path: Path, n: int) -> tuple[Path, list[Path]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a")
    trees = [tmp_path / "items" / f"i{k}" / "tree" for k in range(n)]  # one name, as a plan's
    for tree in trees:
        git(repo, "worktree", "add", "-q", "--detach", str(tree), "main")
    return repo, trees


def test_a_worktree_is_found_without_resolving_every_other_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan makes a worktree record per item and git forgets them at its end: resolving
    every record's pointer on every lookup made a plan's lookups grow with the square of its
    items. Only the record that names the worktree is resolved now, and it is kept."""
    import choir.evidence.git as G

    repo, trees = _worktrees(tmp_path, 30)
    found = G.locate(repo)
    assert found is not None
    resolved: list[str] = []
    real = os.path.realpath
    monkeypatch.setattr(G.os.path, "realpath",
                        lambda p, *a, **k: resolved.append(str(p)) or real(p, *a, **k))
    for tree in (trees[0], trees[-1], trees[0]):
        resolved.clear()
        made = found.worktree_at(tree)
        assert made is not None and made.root == tree.resolve()
        assert len(resolved) <= 3, resolved  # the path, its record's pointer, the remount


def test_a_kept_worktree_record_is_checked_again_before_it_is_used(tmp_path: Path) -> None:
    """The record found last time is used only while it still names the worktree: one
    rewritten to name another folder is not that worktree's (the others are read again)."""
    from choir.evidence.git import locate

    repo, trees = _worktrees(tmp_path, 3)
    found = locate(repo)
    assert found is not None
    first = found.worktree_at(trees[1])
    assert first is not None
    pointer = first.git_dir / "gitdir"
    pointer.write_text(f"{tmp_path / 'elsewhere' / '.git'}\n")
    assert found.worktree_at(trees[1]) is None
    pointer.write_text(f"{trees[1].resolve() / '.git'}\n")
    again = found.worktree_at(trees[1])
    assert again is not None and again.git_dir == first.git_dir


def test_submodule_entries_are_read_from_checked_objects(tmp_path: Path) -> None:
    """What the driver compares before an item may merge: a base's submodule entries and
    its commit's (the same entries merge as before; a new one does not)."""
    from choir.evidence.tree import commit_submodules

    repo, _b, _tree = buggy_repo(tmp_path / "repo")
    other = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{other},vendor")
    git(repo, "commit", "-qm", "a submodule")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "more.py").write_text("X = 1\n")
    git(repo, "add", "more.py")
    git(repo, "commit", "-qm", "more")
    head = git(repo, "rev-parse", "HEAD").strip()
    assert commit_submodules(repo, head, base) == [{"vendor": other}, {"vendor": other}]
    assert commit_submodules(repo, other) == [{}]
    assert commit_submodules(repo, "0" * len(head)) is None


def test_a_listing_git_cannot_make_is_refused_never_walked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 18a F3: a FIFO planted as ``.gitignore`` blocked ``git ls-files`` until its
    timeout; the scan then walked the folder as if it were no repository, and the files git
    ignores (a ``secret.env``) went into the tree hash and every verifier's snapshot."""
    from choir.evidence import git as git_module

    repo, _, _ = buggy_repo(tmp_path / "repo")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("secret.env\n")
    (repo / "secret.env").write_text("TOKEN=1\n")
    (repo / ".gitignore").unlink(missing_ok=True)
    os.mkfifo(repo / ".gitignore")
    real = git_module.GitRepo.run

    def quick(self: git_module.GitRepo, *args: str, timeout: float = 60) -> bytes | None:
        return real(self, *args, timeout=min(timeout, 2))

    monkeypatch.setattr(git_module.GitRepo, "run", quick)
    monkeypatch.setattr(git_module.GitRepo, "start",
                        lambda self, *args, timeout=60: lambda: quick(self, *args))
    with pytest.raises(UserError, match="could not list"):
        inspect_tree(repo)
