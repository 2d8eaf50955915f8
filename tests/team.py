"""A tiny repo and plans with scripted ``command`` members, for the team tests.

The repo's one verifier (pytest, in a real sandbox) fails when a ``*.txt`` file says BROKEN,
when ``b.txt`` does not hold ``a.txt``'s line, or when ``x.flag`` and ``y.flag`` are both
present: two changes that each pass alone but break together.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from tests.workitems import UNIT_VERIFIER

CHECK = textwrap.dedent("""\
    import pathlib
    import time

    def test_tree():
        here = pathlib.Path('.')
        if (here / 'slow.txt').exists():  # a round that takes a while (seconds in the file)
            time.sleep(float((here / 'slow.txt').read_text()))
        for p in here.glob('*.txt'):
            assert 'BROKEN' not in p.read_text(), p
        if (here / 'b.txt').exists():
            assert (here / 'b.txt').read_text() == 'A\\n'
        assert not ((here / 'x.flag').exists() and (here / 'y.flag').exists())
    """)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def committed_repo(path: Path, name: str = "base.txt", text: str = "base\n") -> Path:
    """A git repo at ``path`` on ``main``, with one commit of one file."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", name)
    return path


def team_repo(path: Path, *, slow_s: float = 0.0) -> Path:
    """The repo; ``slow_s``: every round of its verifier takes at least that long."""
    path.mkdir(parents=True)
    (path / "test_tree.py").write_text(CHECK)
    if slow_s:
        (path / "slow.txt").write_text(f"{slow_s}\n")
    (path / "choir.yaml").write_text(UNIT_VERIFIER)
    (path / ".gitignore").write_text("__pycache__/\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    return path


def write_plan(tmp_path: Path, plan_id: str, items: str, max_parallel: int = 2) -> Path:
    """A plan over ``tmp_path/repo`` with member ``sh`` (its command comes from each item's
    goal-free ``executor:``, or the member's default ``true``)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"id: {plan_id}\nrepo: ./repo\nbase: main\nmax_parallel: {max_parallel}\n"
                    "members:\n  worker:\n    executor: {kind: command, command: 'true'}\n"
                    "items:\n" + textwrap.indent(textwrap.dedent(items), "  "))
    return plan
