"""Review 25: a sandboxed executor's plant in git's control files ran at the user's next git.

The executor's sandbox binds the repo writable, ``.git`` included, so that it can commit.
Before, what it wrote to ``.git/config`` (``core.fsmonitor``) or ``.git/hooks/`` stayed: the
run ASSERTed without a word, and the user's next ``git status`` (a shell prompt with git in
it runs one at every line) ran the program as the user, outside every sandbox. Now git's
control files are put back as they were once the sandbox ends, the run says so, and a
commit the executor made (history) stays.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def make_repo(tmp_path: Path) -> Path:
    """A repo whose one verifier checks ``add`` in a bubblewrap sandbox."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "choir.yaml").write_text(textwrap.dedent("""\
        sandbox: {backend: bwrap}
        verifiers:
          unit:
            kind: unit_tests
            steps:
              - name: t
                command: "python3 -c 'import calc; assert calc.add(2, 3) == 5'"
        moods:
          CALM: {verifiers: [unit]}
        """))
    return repo


def commit_all(repo: Path) -> None:
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def run_item(tmp_path: Path, item_id: str, command: str) -> subprocess.CompletedProcess[str]:
    """``choir run`` of a one-attempt work item on ``./repo`` whose executor runs ``command``."""
    item = tmp_path / "item.yaml"
    item.write_text(f"id: {item_id}\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  command: \"{command}\"\n")
    return forked.run([PY, "-m", "choir", "run", str(item)], capture_output=True,
                      text=True, timeout=300)


def test_an_executors_fsmonitor_and_hook_never_run_at_the_users_next_git(
        tmp_path: Path, choir_home: Path) -> None:
    repo = make_repo(tmp_path)
    commit_all(repo)
    config = (repo / ".git" / "config").read_bytes()
    loot = tmp_path / "loot"
    plant = (f"git config core.fsmonitor 'touch {loot}; false' && "
             f"printf '#!/bin/sh\\ntouch {loot}\\n' > .git/hooks/pre-commit && "
             "chmod +x .git/hooks/pre-commit && echo '# ok' >> calc.py && "
             "git -c user.name=x -c user.email=x@x -c core.hooksPath=/dev/null "
             "-c core.fsmonitor=false commit -qam executor")
    proc = run_item(tmp_path, "plant", plant)
    assert "ASSERTED" in proc.stdout, proc.stdout + proc.stderr
    assert "put back" in proc.stderr and ".git/config" in proc.stderr, proc.stderr
    assert (repo / ".git" / "config").read_bytes() == config
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], check=True,
                         capture_output=True, text=True).stdout.split()
    assert log == ["executor", "base"]  # the executor's commit (history) stays
    # the user's next git, as a shell prompt or a commit runs it
    subprocess.run(["git", "-C", str(repo), "status"], capture_output=True, check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@u",
                    "commit", "-q", "--allow-empty", "-m", "user"], capture_output=True,
                   check=True)
    assert not loot.exists(), "the executor's plant ran as the user"
    # the control: the same plant written by hand runs at that git
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", f"touch {loot}; false"],
                   check=True)
    subprocess.run(["git", "-C", str(repo), "status"], capture_output=True)
    assert loot.exists(), "the plant never runs: this test proves nothing"


def test_a_repo_an_executor_plants_in_a_subfolder_never_runs_at_the_users_git_there(
        tmp_path: Path, choir_home: Path) -> None:
    """A ``.git`` below the repo's own: a folder ``git init`` made, or a file naming a git
    folder elsewhere. git never tracks one, the tree scan skips it, and before, it stayed:
    the user's git in that folder (a shell prompt on ``cd``, an editor that scans for nested
    repositories) ran its ``core.fsmonitor`` as the user."""
    repo = make_repo(tmp_path)
    (repo / ".gitignore").write_text("cache/\n")
    commit_all(repo)
    loot = tmp_path / "loot"
    monitor = f"touch {loot}; false"
    plant = (f"git init -q sub && git -C sub config core.fsmonitor '{monitor}' && "
             f"git init -q cache/gitdir && git -C cache/gitdir config core.fsmonitor "
             f"'{monitor}' && mkdir -p deep/er && "
             "printf 'gitdir: ../../cache/gitdir/.git\\n' > deep/er/.git && "
             "echo '# ok' >> calc.py")
    proc = run_item(tmp_path, "nested", plant)
    assert "ASSERTED" in proc.stdout, proc.stdout + proc.stderr
    assert "sub/.git" in proc.stderr and "deep/er/.git" in proc.stderr, proc.stderr
    assert (repo / "calc.py").read_text().endswith("# ok\n")  # the executor's work stays
    for folder in ("sub", "deep/er", "cache/gitdir"):
        subprocess.run(["git", "-C", str(repo / folder), "status"], capture_output=True)
    assert not loot.exists(), "a repo the executor planted ran its program as the user"
    # the control: the same plant made by hand runs at that git
    subprocess.run(["git", "init", "-q", str(repo / "sub")], check=True)
    subprocess.run(["git", "-C", str(repo / "sub"), "config", "core.fsmonitor", monitor],
                   check=True)
    subprocess.run(["git", "-C", str(repo / "sub"), "status"], capture_output=True)
    assert loot.exists(), "the plant never runs: this test proves nothing"


def test_an_executors_rebase_left_in_progress_never_runs_its_exec_at_the_users_continue(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 26's open item: a rebase's todo list was counted as history, so an executor
    could leave an interactive rebase stopped at a ``break`` with an ``exec`` line after it,
    and the user's ``git rebase --continue`` (what ``git status`` tells them to type) ran
    the line as the user. A rebase, cherry-pick or am in progress is now guarded like the
    rest of git's control files: the executor's is removed once its sandbox ends."""
    repo = make_repo(tmp_path)
    commit_all(repo)
    loot = tmp_path / "loot"
    who = "git -c user.name=x -c user.email=x@x -c core.hooksPath=/dev/null"
    plant = (f"echo '# ok' >> calc.py && {who} commit -qam executor && "
             f"GIT_SEQUENCE_EDITOR=\"printf 'break\\nexec touch {loot}\\n' >\" "
             f"{who} rebase -q -i HEAD && test -d .git/rebase-merge")
    item = tmp_path / "item.yaml"
    item.write_text(f"id: rebase\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  command: {json.dumps(plant)}\n")
    proc = forked.run([PY, "-m", "choir", "run", str(item)], capture_output=True,
                      text=True, timeout=300)
    assert "ASSERTED" in proc.stdout, proc.stdout + proc.stderr
    assert "rebase-merge" in proc.stderr, proc.stderr  # said, with what was undone
    assert not (repo / ".git" / "rebase-merge").exists()
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], check=True,
                         capture_output=True, text=True).stdout.split()
    assert log == ["executor", "base"]  # the executor's commit (history) stays
    user = ["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@u"]
    subprocess.run([*user, "status"], capture_output=True, check=True)
    subprocess.run([*user, "rebase", "--continue"], capture_output=True)
    assert not loot.exists(), "the executor's exec line ran as the user"
    # the control: the same rebase stopped by hand runs its exec at the user's --continue
    subprocess.run([*user, "rebase", "-q", "-i", "HEAD"], capture_output=True, check=True,
                   env={**os.environ,
                        "GIT_SEQUENCE_EDITOR": f"printf 'break\\nexec touch {loot}\\n' >"})
    subprocess.run([*user, "rebase", "--continue"], capture_output=True)
    assert loot.exists(), "the plant never runs: this test proves nothing"


def test_a_hook_or_included_config_the_repos_config_names_in_the_tree_is_put_back(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 26's other open item: the repo's config names places in the work tree for git
    to run or read (husky's ``core.hooksPath=.husky/_``, ignored, so a change there shows
    in no diff; an ``include.path`` of a file in the tree). The executor rewrote the hook
    and added ``core.fsmonitor`` to the included file; the run ASSERTed and the user's next
    commit and status ran both as the user. Now both are put back, and the run says so."""
    repo = make_repo(tmp_path)
    (repo / ".gitignore").write_text(".husky/_/\n.gitconfig-local\n")
    hooks = repo / ".husky" / "_"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (hooks / "pre-commit").chmod(0o755)
    (repo / ".gitconfig-local").write_text("[user]\n\tname = u\n")
    commit_all(repo)
    for key, value in (("core.hooksPath", ".husky/_"), ("include.path", "../.gitconfig-local")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    hook, included = (hooks / "pre-commit").read_bytes(), (repo / ".gitconfig-local").read_bytes()
    loot, watched = tmp_path / "loot", tmp_path / "watched"
    plant = (f"printf '#!/bin/sh\\ntouch {loot}\\n' > .husky/_/pre-commit && "
             f"printf '[core]\\n\\tfsmonitor = touch {watched}; false\\n' >> .gitconfig-local "
             "&& echo '# ok' >> calc.py")
    proc = run_item(tmp_path, "hooks", plant)
    assert "ASSERTED" in proc.stdout, proc.stdout + proc.stderr
    assert ".husky/_" in proc.stderr and ".gitconfig-local" in proc.stderr, proc.stderr
    assert (hooks / "pre-commit").read_bytes() == hook
    assert (hooks / "pre-commit").stat().st_mode & 0o777 == 0o755
    assert (repo / ".gitconfig-local").read_bytes() == included
    assert (repo / "calc.py").read_text().endswith("# ok\n")  # the executor's work stays
    user = ["git", "-C", str(repo), "-c", "user.email=u@u"]
    subprocess.run([*user, "status"], capture_output=True, check=True)
    subprocess.run([*user, "commit", "-qam", "user"], capture_output=True, check=True)
    assert not loot.exists() and not watched.exists(), "the executor's plant ran as the user"
    # the control: the same plants written by hand run at the user's git
    subprocess.run(["bash", "-c", plant.rsplit(" && ", 1)[0]], cwd=repo, check=True)
    subprocess.run([*user, "status"], capture_output=True)
    subprocess.run([*user, "commit", "-q", "--allow-empty", "-m", "again"], capture_output=True)
    assert loot.exists() and watched.exists(), "the plants never run: this test proves nothing"
