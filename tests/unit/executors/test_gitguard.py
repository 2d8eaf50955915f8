"""``choir.executors.gitguard``: what an executor leaves in git's control files is undone.

Each case plants what a hostile executor would in a real ``git init`` repo, between
``save`` and ``restore``, and checks the control files are back byte for byte while the
history it may write (a commit) stays.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from choir.exceptions import SandboxError
from choir.executors import gitguard


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "core.hooksPath=/dev/null", *args], check=True,
                          capture_output=True, text=True).stdout


def tree_of(folder: Path) -> dict[str, tuple[str, bytes, int]]:
    """Every entry under ``folder``: kind, bytes or link target, mode."""
    found = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path).encode(), 0)
            elif path.is_dir():
                found[rel] = ("dir", b"", st.st_mode & 0o7777)
            elif not path.is_file():  # a FIFO: never opened (it would block)
                found[rel] = ("other", b"", st.st_mode)
            else:
                found[rel] = ("file", path.read_bytes(), st.st_mode & 0o7777)
    return found


def control(repo: Path) -> dict[str, tuple[str, bytes, int]]:
    history = gitguard.HISTORY
    return {rel: v for rel, v in tree_of(repo / ".git").items()
            if rel.split("/")[0] not in history}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


PLANTS = {
    "config": lambda g: (g / "config").write_text(
        (g / "config").read_text() + "[core]\n\tfsmonitor = touch /tmp/pwned\n"),
    "hook": lambda g: ((g / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch x\n"),
                       (g / "hooks" / "pre-commit").chmod(0o755)),
    "hooks_a_link": lambda g: (os.rename(g / "hooks", g / "old-hooks"),
                               (g / "hooks").symlink_to(g.parent.parent)),
    "config_a_link": lambda g: ((g / "config").unlink(),
                                (g / "config").symlink_to(g.parent.parent / "evil")),
    "config_a_folder": lambda g: ((g / "config").unlink(), (g / "config").mkdir()),
    "worktree_config": lambda g: (g / "config.worktree").write_text(
        "[core]\n\tpager = touch x\n"),
    "submodule": lambda g: ((g / "modules" / "m").mkdir(parents=True),
                            (g / "modules" / "m" / "HEAD").write_text("ref: refs/heads/x\n"),
                            (g / "modules" / "m" / "config").write_text(
                                "[core]\n\tfsmonitor = touch x\n")),
    "info_unreadable": lambda g: ((g / "info" / "exclude").write_text("*.py\n"),
                                  (g / "info").chmod(0)),
    "a_fifo": lambda g: os.mkfifo(g / "hooks" / "post-checkout"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_plant_in_gits_control_files_is_undone_and_the_history_kept(
        repo: Path, tmp_path: Path, plant: str) -> None:
    (tmp_path / "evil").write_text("[core]\n\tfsmonitor = touch x\n")
    before = control(repo)
    saved = gitguard.save(repo)
    (repo / "a.txt").write_text("changed by the executor\n")
    git(repo, "commit", "-qam", "the executor's commit")  # history: allowed
    head = git(repo, "rev-parse", "HEAD")
    PLANTS[plant](repo / ".git")
    assert control(repo) != before or plant == "info_unreadable"  # the plant is there
    undone = gitguard.restore(saved)
    assert undone, "nothing was said to be undone"
    assert all(u.startswith(".git") for u in undone)
    assert control(repo) == before
    assert git(repo, "rev-parse", "HEAD") == head  # the executor's commit stays
    assert (tmp_path / "evil").read_text().startswith("[core]")  # a link's target untouched


def test_nothing_changed_says_nothing_and_a_commit_is_no_plant(repo: Path) -> None:
    saved = gitguard.save(repo)
    (repo / "b.txt").write_text("b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "two")
    git(repo, "branch", "side")
    git(repo, "tag", "t1")
    assert gitguard.restore(saved) == []


def test_a_git_folder_replaced_whole_is_moved_aside_and_stops_the_round(repo: Path) -> None:
    saved = gitguard.save(repo)
    os.rename(repo / ".git", repo / "kept")
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text("[core]\n\tfsmonitor = touch x\n")
    with pytest.raises(SandboxError, match="replaced"):
        gitguard.restore(saved)
    assert not (repo / ".git").exists()
    assert (repo / gitguard.QUARANTINE / "config").exists()


def test_a_git_file_of_a_worktree_made_a_folder_is_put_back(repo: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(worktree))
    pointer = (worktree / ".git").read_bytes()
    saved = gitguard.save(worktree)
    (worktree / ".git").unlink()
    (worktree / ".git").mkdir()
    (worktree / ".git" / "config").write_text("[core]\n\tfsmonitor = touch x\n")
    assert gitguard.restore(saved) == [".git"]
    assert (worktree / ".git").read_bytes() == pointer


def test_a_repo_with_no_git_folder_keeps_none(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    saved = gitguard.save(plain)
    (plain / ".git").mkdir()
    (plain / ".git" / "config").write_text("[core]\n\tfsmonitor = touch x\n")
    assert gitguard.restore(saved) == [".git"]
    assert not (plain / ".git").exists()


NESTED = {
    "a_repo": lambda r: git(r, "init", "-q", "sub/deeper"),
    "a_gitdir_file": lambda r: ((r / "sub").mkdir(),
                                (r / "sub" / ".git").write_text("gitdir: ../elsewhere\n")),
    "a_link": lambda r: ((r / "sub").mkdir(), (r / "sub" / ".git").symlink_to(r / ".git")),
    "in_an_unreadable_folder": lambda r: (git(r, "init", "-q", "sub/x"),
                                          (r / "sub").chmod(0)),
    "in_a_linked_folder": lambda r: (git(r, "init", "-q", "ignored/x"),
                                     (r / "sub").symlink_to(r / "ignored")),
}


@pytest.mark.parametrize("plant", sorted(NESTED))
def test_a_repository_planted_below_the_repo_is_removed_and_its_files_kept(
        repo: Path, plant: str) -> None:
    saved = gitguard.save(repo)
    (repo / "keep.txt").write_text("the executor's work\n")
    NESTED[plant](repo)
    undone = gitguard.restore(saved)
    assert undone and all(u.endswith(".git") and u != ".git" for u in undone), undone
    assert (repo / "keep.txt").exists()
    left = [p for p in repo.rglob(".git") if p != repo / ".git"]
    assert left == [], left
    assert (repo / ".git" / "config").exists()  # a link's target (the repo's own) untouched
    assert gitguard.restore(gitguard.save(repo)) == []  # nothing planted: nothing said


def test_a_repository_that_was_there_is_kept_and_guarded_like_the_repos_own(
        repo: Path, tmp_path: Path) -> None:
    vendored = repo / "vendor" / "lib"
    vendored.mkdir(parents=True)
    git(vendored, "init", "-q")
    (vendored / "f.txt").write_text("f\n")
    git(vendored, "add", "-A")
    git(vendored, "commit", "-qm", "lib")
    worktree = repo / "wt"  # a linked worktree's .git file, inside the repo
    git(vendored, "worktree", "add", "-q", str(worktree))
    before, pointer = control(vendored), (worktree / ".git").read_bytes()
    saved = gitguard.save(repo)
    PLANTS["config"](vendored / ".git")
    PLANTS["hook"](vendored / ".git")
    (worktree / ".git").write_text("gitdir: ../elsewhere\n")
    undone = gitguard.restore(saved)
    assert "vendor/lib/.git/config" in undone and "wt/.git" in undone, undone
    assert control(vendored) == before
    assert (worktree / ".git").read_bytes() == pointer


def test_a_read_only_folder_is_not_walked(repo: Path) -> None:
    venv = repo / ".venv"
    git(repo, "init", "-q", str(venv / "pkg"))  # a vendored repo inside the interpreter
    saved = gitguard.save(repo, skip=[venv])
    assert saved.nested == {}
    assert gitguard.restore(saved) == []
    assert (venv / "pkg" / ".git").is_dir()


def as_nobody(tmp_path: Path, case: str) -> str:
    """Run ``case`` (a function of this module, given a repo) as user 65534 in a child
    process, in a repo that user owns: as root no mode stops anything. What it returns."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the case as another user")
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # a folder the other user can reach
    try:
        top.chmod(0o755)
        repo = top / "repo"
        repo.mkdir()
        os.chown(repo, 65534, 65534)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the user: nobody
            code = 1
            try:
                os.close(read)
                os.setgid(65534)
                os.setuid(65534)
                os.environ.update(HOME=str(top))
                subprocess.run(["git", "init", "-q", str(repo)], check=True)
                os.write(write, repr(globals()[case](repo)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        said = os.read(read, 65536).decode()
        os.close(read)
        assert os.waitpid(pid, 0)[1] == 0, said
        return said
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(top)], check=False)
        shutil.rmtree(top)


def _hidden_in_an_unreadable_folder(repo: Path) -> object:
    saved = gitguard.save(repo)
    subprocess.run(["git", "init", "-q", str(repo / "sub" / "x")], check=True)
    (repo / "sub").chmod(0)
    undone = gitguard.restore(saved)
    (repo / "sub").chmod(0o755)
    return undone, (repo / "sub" / "x" / ".git").exists()


def _beside_a_folder_that_cannot_be_entered(repo: Path) -> object:
    saved = gitguard.save(repo)
    subprocess.run(["git", "init", "-q", str(repo / "sub")], check=True)
    (repo / "a" / "b").mkdir(parents=True)
    (repo / "a").chmod(0o444)  # listed, never entered
    undone = gitguard.restore(saved)
    return undone, (repo / "sub" / ".git").exists(), oct((repo / "a").stat().st_mode & 0o777)


def _a_plant_that_cannot_be_listed(repo: Path) -> object:
    saved = gitguard.save(repo)
    subprocess.run(["git", "init", "-q", str(repo / "sub")], check=True)
    (repo / "sub" / ".git").chmod(0o311)  # git opens its files by name all the same
    undone = gitguard.restore(saved)
    return undone, (repo / "sub" / ".git").exists()


@pytest.mark.parametrize("case, expected", [
    ("_hidden_in_an_unreadable_folder", "(['sub/x/.git'], False)"),
    ("_beside_a_folder_that_cannot_be_entered", "(['sub/.git'], False, '0o444')"),
    ("_a_plant_that_cannot_be_listed", "(['sub/.git'], False)"),
])
def test_a_repository_hidden_by_modes_is_removed_as_the_user(
        tmp_path: Path, case: str, expected: str) -> None:
    """As the user, not as root (whom no mode stops): a folder made unreadable, one that
    can be listed but not entered, a planted ``.git`` that cannot be listed (review 26).
    Each is opened to be read and put back as it was; the plant is gone."""
    assert as_nobody(tmp_path, case) == expected


def test_a_replaced_git_folder_still_has_the_planted_repositories_removed(
        repo: Path) -> None:
    """Review 26: the repo's own ``.git`` replaced whole stopped ``restore`` before it
    reached the repositories planted below: they stayed, and ran at the user's git there."""
    saved = gitguard.save(repo)
    os.rename(repo / ".git", repo / "kept")
    git(repo / "kept", "init", "-q", "--bare", str(repo / ".git"))
    git(repo, "init", "-q", "sub")
    with pytest.raises(SandboxError, match="replaced"):
        gitguard.restore(saved)
    assert not (repo / "sub" / ".git").exists()


def test_a_read_only_folder_moved_aside_is_walked_again(repo: Path) -> None:
    """Review 26: ``tests/spec`` was skipped by its name; the executor moved ``tests`` aside
    (a read-only folder inside it moves with it) and planted ``tests/spec/.git``."""
    spec = repo / "tests" / "spec"
    spec.mkdir(parents=True)
    saved = gitguard.save(repo, skip=[spec])
    os.rename(repo / "tests", repo / "tests_x")
    git(repo, "init", "-q", "tests/spec")
    assert gitguard.restore(saved) == ["tests/spec/.git"]
    assert not (repo / "tests" / "spec" / ".git").exists()


@pytest.fixture
def husky(repo: Path) -> Path:
    """The repo with a hooks folder in its work tree (husky's) and an included config file
    there, both named by its config."""
    hooks = repo / ".husky" / "_"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (hooks / "pre-commit").chmod(0o755)
    (repo / "conf").mkdir()
    (repo / "conf" / "git.cfg").write_text("[user]\n\tname = u\n")
    git(repo, "config", "core.hooksPath", ".husky/_")
    git(repo, "config", "include.path", "../conf/git.cfg")
    return repo


def test_the_places_the_config_names_are_kept_whole_and_put_back(husky: Path) -> None:
    before = {**tree_of(husky / ".husky"), **tree_of(husky / "conf")}
    saved = gitguard.save(husky)
    assert sorted(saved.named) == [".husky/_", "conf/git.cfg"]
    (husky / ".husky" / "_" / "pre-commit").write_text("#!/bin/sh\ntouch loot\n")
    (husky / ".husky" / "_" / "post-checkout").write_text("#!/bin/sh\ntouch loot\n")
    (husky / "conf" / "git.cfg").unlink()
    (husky / "conf" / "git.cfg").symlink_to("/etc/passwd")
    assert gitguard.restore(saved) == [".husky/_", "conf/git.cfg"]
    assert {**tree_of(husky / ".husky"), **tree_of(husky / "conf")} == before
    assert gitguard.restore(gitguard.save(husky)) == []  # nothing changed: nothing said


def test_a_hooks_folder_removed_or_made_a_file_is_made_again(husky: Path) -> None:
    before = tree_of(husky / ".husky")
    for plant in ("removed", "a file", "parent removed"):
        saved = gitguard.save(husky)
        if plant == "parent removed":
            subprocess.run(["rm", "-rf", str(husky / ".husky")], check=True)
        else:
            subprocess.run(["rm", "-rf", str(husky / ".husky" / "_")], check=True)
        if plant == "a file":
            (husky / ".husky" / "_").write_text("#!/bin/sh\n")
        assert gitguard.restore(saved) == [".husky/_"], plant
        assert tree_of(husky / ".husky") == before, plant


def test_only_the_repos_own_config_is_read_and_nothing_in_git_twice(repo: Path) -> None:
    """A hooks folder inside ``.git`` is guarded with it already; one outside the work tree
    is not the executor's to write."""
    git(repo, "config", "core.hooksPath", ".git/myhooks")
    git(repo, "config", "include.path", "/etc/gitconfig-elsewhere")
    git(repo, "config", "--add", "include.path", "../../outside.cfg")
    assert gitguard.save(repo).named == {}


def _a_control_file_made_unreadable(repo: Path) -> object:
    """Review 29: one control file made unreadable stopped the walk of ``.git`` at it, and
    every plant after it stayed (the config's fsmonitor, a hook, a rebase's todo)."""
    saved = gitguard.save(repo)
    (repo / ".git" / "description").chmod(0)
    with open(repo / ".git" / "config", "a") as fh:
        fh.write("[core]\n\tfsmonitor = touch loot; false\n")
    (repo / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch loot\n")
    (repo / ".git" / "rebase-merge").mkdir()
    undone = gitguard.restore(saved)
    return (undone, "fsmonitor" in (repo / ".git" / "config").read_text(),
            (repo / ".git" / "hooks" / "pre-commit").exists(),
            (repo / ".git" / "rebase-merge").exists(),
            oct((repo / ".git" / "description").stat().st_mode & 0o777))


def _a_named_place_made_unreadable_or_too_big(repo: Path) -> object:
    """Review 29: the put-back compared the place first, and a folder made unreadable in
    it (or an included file grown past the bound) raised there: the round stopped with the
    plant in place."""
    (repo / ".husky" / "_").mkdir(parents=True)
    (repo / ".husky" / "_" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (repo / "local.cfg").write_text("[user]\n\tname = u\n")
    git(repo, "config", "core.hooksPath", ".husky/_")
    git(repo, "config", "include.path", "../local.cfg")
    saved = gitguard.save(repo)
    (repo / ".husky" / "_" / "pre-commit").write_text("#!/bin/sh\ntouch loot\n")
    (repo / ".husky" / "_" / "zz").mkdir()
    (repo / ".husky" / "_" / "zz").chmod(0)
    with open(repo / "local.cfg", "a") as fh:
        fh.write("[core]\n\tfsmonitor = touch loot; false\n" + "#" * (gitguard.MAX_BYTES + 1))
    undone = gitguard.restore(saved)
    return (undone, (repo / ".husky" / "_" / "pre-commit").read_text(),
            (repo / "local.cfg").read_text())


@pytest.mark.parametrize("case, expected", [
    ("_a_control_file_made_unreadable",
     "(['.git/config', '.git/description', '.git/hooks/pre-commit', '.git/rebase-merge'], "
     "False, False, False, '0o644')"),
    ("_a_named_place_made_unreadable_or_too_big",
     "(['.husky/_', 'local.cfg'], '#!/bin/sh\\nexit 0\\n', '[user]\\n\\tname = u\\n')"),
])
def test_what_the_executor_made_unreadable_is_put_back_unread(
        tmp_path: Path, case: str, expected: str) -> None:
    """As the user (as root no mode stops a read): an entry that cannot be read counts as
    changed and is written again, and the walk goes on past it."""
    assert as_nobody(tmp_path, case) == expected


def test_a_parent_of_a_named_place_made_a_link_is_removed_never_followed(
        husky: Path, tmp_path: Path) -> None:
    """Review 29: a parent made a link stopped the round but stayed, and the user's git
    followed it to the executor's hook (``.husky`` -> a folder it filled), or to its config
    (``conf``, missing before, made a link to its own folder). The link is removed, plain
    folders made, the place put back; nothing is written through the link."""
    before = tree_of(husky / ".husky")
    theirs = tmp_path / "theirs"
    (theirs / "_").mkdir(parents=True)
    (theirs / "_" / "pre-commit").write_text("#!/bin/sh\ntouch loot\n")
    (theirs / "git.cfg").write_text("[core]\n\tfsmonitor = touch loot; false\n")
    kept = tree_of(theirs)
    git(husky, "config", "--add", "include.path", "../gone/git.cfg")
    saved = gitguard.save(husky)
    subprocess.run(["rm", "-rf", str(husky / ".husky")], check=True)
    (husky / ".husky").symlink_to(theirs)
    (husky / "gone").symlink_to(theirs)
    assert gitguard.restore(saved) == [".husky", ".husky/_", "gone"]
    assert tree_of(husky / ".husky") == before and not (husky / "gone").exists()
    assert tree_of(theirs) == kept


def _in_config_worktree(repo: Path) -> str:
    git(repo, "config", "extensions.worktreeConfig", "true")
    git(repo, "config", "--worktree", "core.hooksPath", ".githooks")
    return ".githooks"


def _in_a_nested_repository(repo: Path) -> str:
    sub = repo / "vendor" / "lib"
    sub.mkdir(parents=True)
    (sub / ".gitconfig-local").write_text("[user]\n\tname = u\n")
    git(sub, "init", "-q")
    git(sub, "config", "include.path", "../.gitconfig-local")
    return "vendor/lib/.gitconfig-local"


def _a_filter_program(repo: Path) -> str:
    git(repo, "config", "filter.strip.clean", "./tools/strip.sh --quiet")
    git(repo, "config", "alias.fix", "!tools/fix.sh")
    return "tools/strip.sh"


def _in_the_users_global_config(repo: Path) -> str:
    (Path(os.environ["HOME"]) / ".gitconfig").write_text("[core]\n\thooksPath = .githooks\n")
    return ".githooks"


def _behind_an_inactive_include(repo: Path) -> str:
    (repo / "conf").mkdir()
    (repo / "conf" / "release.cfg").write_text("[include]\n\tpath = release-local.cfg\n")
    git(repo, "config", "includeIf.onbranch:release.path", "../conf/release.cfg")
    return "conf/release-local.cfg"  # read once HEAD is on release: the executor's to move


def _behind_the_users_own_link(repo: Path) -> str:
    (repo / "scripts" / "hooks").mkdir(parents=True)
    (repo / ".githooks").symlink_to("scripts/hooks")
    git(repo, "config", "core.hooksPath", ".githooks")
    return "scripts/hooks"


# one setting each: (key, value, the place it names)
SETTINGS = {"_a_program_named_past_its_first_word":
            ("filter.strip.clean", "sh tools/strip.sh", "tools/strip.sh"),
            "_a_helper_with_a_bang": ("credential.helper", "!./tools/cred.sh get",
                                      "tools/cred.sh"),
            "_diff_external": ("diff.external", "tools/differ", "tools/differ")}


def _in_the_users_environment(repo: Path) -> str:
    os.environ.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="core.hooksPath",
                      GIT_CONFIG_VALUE_0=".envhooks")
    return ".envhooks"


def _in_a_nested_repository_choir_refuses(repo: Path) -> str:
    sub = repo / "vendor" / "lib"
    sub.mkdir(parents=True)
    git(sub, "init", "-q")
    (sub / ".git" / "objects" / "info" / "alternates").write_text(str(repo / ".git/objects"))
    git(sub, "config", "core.hooksPath", ".h")
    return "vendor/lib/.h"


def _behind_an_inactive_include_outside(repo: Path) -> str:
    home = Path(os.environ["HOME"])
    (home / "release.inc").write_text("[core]\n\thooksPath = .relhooks\n")
    (home / ".gitconfig").write_text(
        f'[includeIf "onbranch:release/**"]\n\tpath = {home / "release.inc"}\n')
    return ".relhooks"


def _through_a_link_to_the_repo(repo: Path) -> str:
    alias = repo.parent / "alias"
    alias.symlink_to(repo)
    git(repo, "config", "core.hooksPath", str(alias / ".githooks"))
    return ".githooks"


@pytest.mark.parametrize("case", [
    "_in_config_worktree", "_in_a_nested_repository", "_a_filter_program",
    "_in_the_users_global_config", "_behind_an_inactive_include",
    "_behind_the_users_own_link", "_a_program_named_past_its_first_word",
    "_a_helper_with_a_bang", "_diff_external", "_in_the_users_environment",
    "_in_a_nested_repository_choir_refuses", "_behind_an_inactive_include_outside",
    "_through_a_link_to_the_repo"])
def test_every_place_the_users_git_runs_in_the_tree_is_kept(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Review 29 (its second round too): places the user's git runs or reads in the work
    tree that only the repo's own config, read with ``--local``, never named (each plant ran
    at the user's next git in ``/work/review/r29/r4_places_not_read.py`` and
    ``/work/review/r29b/``). Each is kept now, and what the executor writes there is
    undone."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for key in ("GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0"):
        monkeypatch.setenv(key, "")  # restored after the case; emptied for it
        monkeypatch.delenv(key)
    if case in SETTINGS:
        key, value, place = SETTINGS[case]
        git(repo, "config", key, value)
    else:
        place = globals()[case](repo)
    saved = gitguard.save(repo)
    assert place in saved.named, sorted(saved.named)
    planted = repo / place
    if (repo / place).is_dir():
        planted = planted / "pre-commit"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("#!/bin/sh\ntouch loot\n")
    assert place in gitguard.restore(saved)
    assert not planted.exists() or "loot" not in planted.read_text()


def test_a_folder_made_to_look_like_a_repository_loses_its_head(repo: Path,
                                                                 tmp_path: Path) -> None:
    """Review 29b: git takes any folder holding ``HEAD``, ``objects/`` and ``refs/`` for a
    repository (``safe.bareRepository`` is ``all`` by default), so the user's prompt in
    ``src/`` ran the fsmonitor of a config the executor wrote there, no ``.git`` in sight.
    Its ``HEAD`` is removed (git then takes it for none); its other files stay. One that was
    there (a fixture) is guarded like any repository below the repo."""
    git(repo, "init", "-q", "--bare", "fixture")
    saved = gitguard.save(repo)
    assert "fixture" in saved.nested
    loot = tmp_path / "loot"
    src = repo / "src"
    (src / "objects").mkdir(parents=True)
    (src / "refs").mkdir()
    (src / "HEAD").write_text("ref: refs/heads/main\n")
    (src / "config").write_text(f"[core]\n\tfsmonitor = touch {loot}; false\n"
                                "\tbare = false\n\tworktree = .\n")
    (src / "main.py").write_text("x = 1\n")
    with open(repo / "fixture" / "config", "a") as fh:
        fh.write(f"[core]\n\tfsmonitor = touch {loot}; false\n")
    undone = gitguard.restore(saved)
    assert "src/HEAD" in undone and "fixture/config" in undone, undone
    assert (src / "main.py").exists() and (src / "config").exists()  # its files stay
    for where in (src, repo / "fixture"):
        subprocess.run(["git", "-C", str(where), "status"], capture_output=True)
    assert not loot.exists(), "a repository the executor made ran its program as the user"


def test_a_linked_parent_the_executor_made_a_folder_is_a_link_again(repo: Path) -> None:
    """Review 29b: the user reaches the hooks folder through a link of their own (``cfg`` ->
    ``config``); the executor replaced the link by a folder holding its hook. The link is
    kept as a place itself, so its folder goes and the link comes back."""
    (repo / "config" / "hooks").mkdir(parents=True)
    (repo / "cfg").symlink_to("config")
    git(repo, "config", "core.hooksPath", "cfg/hooks")
    saved = gitguard.save(repo)
    assert "cfg" in saved.named and "config/hooks" in saved.named
    (repo / "cfg").unlink()
    (repo / "cfg" / "hooks").mkdir(parents=True)
    (repo / "cfg" / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch loot\n")
    assert "cfg" in gitguard.restore(saved)
    assert (repo / "cfg").is_symlink() and os.readlink(repo / "cfg") == "config"


def _a_named_parent_made_read_only(repo: Path) -> object:
    (repo / "conf").mkdir()
    (repo / "conf" / "git.inc").write_text("[user]\n\tname = u\n")
    git(repo, "config", "include.path", "../conf/git.inc")
    saved = gitguard.save(repo)
    with open(repo / "conf" / "git.inc", "a") as fh:
        fh.write("[core]\n\tfsmonitor = touch loot; false\n")
    (repo / "conf").chmod(0o555)
    undone = gitguard.restore(saved)
    return (undone, (repo / "conf" / "git.inc").read_text(),
            oct((repo / "conf").stat().st_mode & 0o777))


def test_a_named_places_parent_made_read_only_is_put_back(tmp_path: Path) -> None:
    """Review 29b: the executor rewrote an included file and made its folder read-only: the
    file could not be removed, the round stopped, and the user's next status ran it. The
    folder's mode is put back first (the owner's write while putting back)."""
    assert as_nobody(tmp_path, "_a_named_parent_made_read_only") == repr(
        (["conf", "conf/git.inc"], "[user]\n\tname = u\n", "0o755"))


def _a_read_only_folder_in_a_named_place(repo: Path) -> object:
    shut = repo / ".husky" / "_" / "shut"
    shut.mkdir(parents=True)
    (shut / "kept").write_text("x\n")
    shut.chmod(0o555)
    git(repo, "config", "core.hooksPath", ".husky/_")
    before = tree_of(repo / ".husky")
    saved = gitguard.save(repo)
    subprocess.run(["chmod", "-R", "u+w", str(repo / ".husky")], check=True)
    subprocess.run(["rm", "-rf", str(repo / ".husky" / "_")], check=True)
    undone = gitguard.restore(saved)
    return undone, tree_of(repo / ".husky") == before


def test_a_read_only_folder_in_a_named_place_is_made_again_with_what_it_held(
        tmp_path: Path) -> None:
    """Review 29b: a folder of the place whose saved mode denied writing was made with that
    mode at once, and what it held could not be written back (the put-back failed, the
    round stopped). Its mode is set once it is filled (as user 65534: no mode stops root)."""
    assert as_nobody(tmp_path, "_a_read_only_folder_in_a_named_place") == repr(
        ([".husky/_"], True))


def test_more_included_files_than_the_guard_reads_refuse_the_round(repo: Path) -> None:
    """Review 29b's minor note: each included file whose condition is false now (git reads
    it once ``onbranch:`` holds) is read for what it names, at most ``INCLUDES_MAX``; past
    that the guard stopped, silently, and a place the next one named (here the hooks
    folder) was not kept. The round is refused now, as for too many entries."""
    conf = repo / "conf"
    conf.mkdir()
    for i in range(gitguard.INCLUDES_MAX + 1):
        (conf / f"{i:03}.cfg").write_text("[user]\n\tname = u\n")
        git(repo, "config", "--add", "includeIf.onbranch:release.path", f"../conf/{i:03}.cfg")
    (conf / f"{gitguard.INCLUDES_MAX:03}.cfg").write_text("[core]\n\thooksPath = .husky/_\n")
    (repo / ".husky" / "_").mkdir(parents=True)
    with pytest.raises(SandboxError, match="includes more than 64 files"):
        gitguard.save(repo)
    git(repo, "config", "--unset-all", "includeIf.onbranch:release.path")
    last = f"../conf/{gitguard.INCLUDES_MAX:03}.cfg"
    git(repo, "config", "includeIf.onbranch:release.path", last)
    assert ".husky/_" in gitguard.save(repo).named  # within the bound: kept


def test_a_folder_past_the_entry_bound_is_refused_before_it_is_read_whole(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 29b's minor note: a folder in ``.git`` of millions of entries was listed whole
    (in memory) before the bound on entries was checked. They are read one at a time now:
    the round is refused at the first entry past the bound."""
    junk = repo / ".git" / "junk"
    junk.mkdir()
    for i in range(500):
        (junk / str(i)).touch()
    monkeypatch.setattr(gitguard, "MAX_ENTRIES", 50)
    read = 0
    scandir = os.scandir

    class Counted:
        def __init__(self, path: object) -> None:
            self.it = scandir(path)  # type: ignore[call-overload]

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self.it.close()

        def __iter__(self) -> Counted:
            return self

        def __next__(self) -> os.DirEntry[str]:
            nonlocal read
            read += 1
            return next(self.it)

    monkeypatch.setattr(os, "scandir", Counted)
    with pytest.raises(SandboxError, match="more than 50 entries"):
        gitguard.save(repo)
    assert read < 100, read  # 51 kept, the history's skipped, each earlier folder's end
