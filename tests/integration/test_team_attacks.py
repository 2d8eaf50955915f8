"""A hostile member: the driver commits its worktree on the host, outside any sandbox, so
nothing the member wrote in the worktree may steer that git call."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from choir.team.driver import run_plan
from choir.team.plan import load_plan
from tests.team import team_repo, write_plan

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("git") is None,
                                reason="needs bubblewrap and git")


def test_a_member_cannot_swap_the_worktree_git_dir_to_run_a_filter_on_the_host(
        tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    team_repo(tmp_path / "repo")
    command = ("git init -q --bare .evil && "
               f"git --git-dir=.evil config filter.x.clean \"sh -c 'touch {marker}; cat'\" && "
               "printf '* filter=x\\n' > .gitattributes && printf 'gitdir: .evil\\n' > .git")
    script = tmp_path / "evil.sh"
    script.write_text(command + "\n")
    plan = write_plan(tmp_path, "atk", f"""\
        - id: evil
          goal: anything
          max_attempts: 1
          executor: {{kind: command, command: 'sh {script}'}}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert state["items"]["evil"]["state"] == "merged", state  # the attack got that far
    assert not marker.exists(), "the member's git config ran a command on the host"
