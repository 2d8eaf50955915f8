"""A hostile member: the driver commits its worktree on the host, outside any sandbox, so
nothing the member wrote in the worktree may steer that git call."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from choir.team.driver import run_plan
from choir.team.plan import load_plan
from tests.team import git, team_repo, write_plan

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("git") is None,
                                 reason="needs bubblewrap and git"),
              pytest.mark.slow]  # CI's slow stage: the README's command stays under five minutes


def test_a_member_cannot_swap_the_worktree_git_dir_to_run_a_filter_on_the_host(
        tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    repo = team_repo(tmp_path / "repo")
    command = ("git init -q --bare .evil && "
               f"git --git-dir=.evil config filter.x.clean \"sh -c 'touch {marker}; cat'\" && "
               "printf '* filter=x\\n' > .gitattributes && printf 'gitdir: .evil\\n' > .git")
    # in the repo, where the sandboxed member can read it (a script beside the repo it could
    # not: this test's member ran nothing until the thirteenth session, and passed)
    (repo / "evil.sh").write_text(command + "\n")
    git(repo, "add", "evil.sh")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the script")
    plan = write_plan(tmp_path, "atk", """\
        - id: evil
          goal: anything
          max_attempts: 1
          executor: {kind: command, command: 'sh evil.sh'}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert not marker.exists(), "the member's git config ran a command on the host"
    # since review 25 the swapped .git file is put back once the member's sandbox ends (the
    # round's snapshot refused it before: the commit, which never reads it, is the next
    # test's); the filter the member's .gitattributes names is then refused at the commit,
    # so nothing the member made is merged
    row = state["items"]["evil"]
    assert row["state"] == "failed" and ".gitattributes" in row["last"], row


def _plant_programs(git_dir: Path, marker: Path) -> None:
    """Every program a git config can name, each leaving ``marker``/NAME when run."""
    def cmd(name: str) -> str:
        return f"\"sh -c 'touch {marker}/{name}; cat'\""  # quoted: ';' starts a comment

    with (git_dir / "config").open("a") as fh:
        fh.write(f'[filter "x"]\n\tclean = {cmd("clean")}\n\tsmudge = {cmd("smudge")}\n'
                 f'\tprocess = {cmd("process")}\n\trequired = true\n'
                 f'[merge "m"]\n\tdriver = {cmd("merge")}\n'
                 f'[core]\n\tfsmonitor = {cmd("fsmonitor")}\n'
                 f'[alias]\n\tmerge = "!touch {marker}/alias"\n'
                 f'[credential]\n\thelper = "!touch {marker}/credential"\n')
    hooks = git_dir / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "post-merge",
                 "pre-merge-commit", "reference-transaction", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}/hook-{hook}\n")
        (hooks / hook).chmod(0o755)


def test_programs_planted_in_the_repo_config_run_nothing_during_merge_commit_promote(
        tmp_path: Path) -> None:
    """Config the repo's attributes name (filters, a merge driver, fsmonitor, hooks) is
    planted in the integration repo's own config, as if a member had reached it: the
    driver's worktrees, commits, merges and the promotion must run none of it. (The
    attributes are the base's: an item that changes them fails, the next test.)"""
    from choir.team.promote import promote

    marker = tmp_path / "ran"
    marker.mkdir()
    repo = team_repo(tmp_path / "repo")
    (repo / ".gitattributes").write_text("* filter=x merge=m\n")
    git(repo, "add", ".gitattributes")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "attributes")
    _plant_programs(repo / ".git", marker)
    plan = write_plan(tmp_path, "cfg", """\
        - id: one
          goal: a file through the filter
          executor: {kind: command, command: "echo A > a.txt"}
        - id: two
          goal: another, merged after one
          executor: {kind: command, command: "echo C > c.txt"}
          depends_on: [one]
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert sorted(p.name for p in marker.iterdir()) == [], "the repo config ran a program"
    assert {k: r["state"] for k, r in state["items"].items()} == {"one": "merged",
                                                                   "two": "merged"}, state
    merged = git(tmp_path / "repo", "show", "choir/plan/cfg/integration:.gitattributes")
    assert merged == "* filter=x merge=m"  # the merged files did name the planted drivers
    # a checkout of the head would run the base's filter: promote refuses it (review 19b),
    # and runs nothing to say so
    from choir.exceptions import UserError

    with pytest.raises(UserError, match="converts its files"):
        promote("cfg", "released")
    assert sorted(p.name for p in marker.iterdir()) == [], "the repo config ran a program"


# how a member writes its .gitattributes: the plain lines, and (a later review) a line git
# reads whole that splitlines() cut at its carriage returns, the line as a link's text (git
# reads a link's blob as the file when it checks out), an archive's expansion, a name in
# another case (a file system that folds case opens it as the file)
ATTRIBUTE_FILES = {
    "ident": "echo 'v.txt ident' > .gitattributes",
    "eol": "echo '* text eol=crlf' > .gitattributes",
    "a macro": "echo '[attr]conv ident' > .gitattributes",
    "lfs": "echo 'v.txt filter=lfs' > .gitattributes",
    "carriage returns": "printf 'v.txt\\rtext\\reol=crlf\\n' > .gitattributes",
    "a link": "ln -s 'v.txt ident' .gitattributes",
    "export-subst": "echo 'v.txt export-subst' > .gitattributes",
    "export-ignore": "echo 'test_tree.py export-ignore' > .gitattributes",
    "upper case": "echo 'v.txt ident' > .GitAttributes",
    # a second review: a form feed before a '#' made the line a comment to Python's split()
    # and a pattern to git's
    "a form feed": "printf '\\f#v.txt ident\\n' > .gitattributes",
}


@pytest.mark.parametrize("written", list(ATTRIBUTE_FILES))
def test_an_item_that_changes_how_git_checks_files_out_is_never_merged(
        tmp_path: Path, written: str) -> None:
    """A member's ``.gitattributes`` line that makes git convert a file on checkout: its
    rounds read the blob (``$Id$``), a person's checkout of the promoted branch got
    ``$Id: 055c87... $`` and failed the repo's own test (a review found it, on overlay
    worktrees); ``git archive`` of it expands or drops files. The item fails, naming the
    file."""
    repo = team_repo(tmp_path / "repo")
    command = json.dumps(f"echo '$Id$' > v.txt && {ATTRIBUTE_FILES[written]}")
    plan = write_plan(tmp_path, "conv", f"""\
        - id: a
          goal: write v
          max_attempts: 1
          executor: {{kind: command, command: {command}}}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    row = state["items"]["a"]
    assert row["state"] == "failed" and ".gitattributes changes how git" in row["last"], row
    assert "v.txt" not in git(repo, "ls-tree", "--name-only", "choir/plan/conv/integration")


def _base_attributes(repo: Path, text: str) -> None:
    """The base commits a ``.gitattributes`` of its own."""
    (repo / ".gitattributes").write_text(text)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".gitattributes")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "attributes")


def test_a_macro_the_base_defined_is_a_conversion_where_an_item_uses_it(
        tmp_path: Path) -> None:
    """The base's ``.gitattributes`` defines ``[attr]conv ident`` (its own line, unchanged):
    an item's new line ``v.txt conv`` names no conversion itself, and git converts by it."""
    _base_attributes(team_repo(tmp_path / "repo"), "[attr]conv ident\n")
    plan = write_plan(tmp_path, "macro", """\
        - id: a
          goal: write v
          max_attempts: 1
          executor: {kind: command, command: "echo '$Id$' > v.txt &&
            printf '[attr]conv ident\\nv.txt conv\\n' > .gitattributes"}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    row = state["items"]["a"]
    assert row["state"] == "failed" and ".gitattributes changes how git" in row["last"], row


def test_the_base_lines_in_another_order_are_a_change(tmp_path: Path) -> None:
    """A later line overrides an earlier one: the base's ``* text=auto eol=crlf`` then
    ``*.sh text eol=lf``, swapped, checks ``run.sh`` out with CRLF endings, though the same
    lines are there (a review: the lines were compared as a set)."""
    _base_attributes(team_repo(tmp_path / "repo"), "* text=auto eol=crlf\n*.sh text eol=lf\n")
    plan = write_plan(tmp_path, "order", """\
        - id: a
          goal: swap
          max_attempts: 1
          executor: {kind: command, command: "printf '*.sh text eol=lf\\n* text=auto eol=crlf\\n'
            > .gitattributes && printf 'echo ok\\n' > run.sh"}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    row = state["items"]["a"]
    assert row["state"] == "failed" and ".gitattributes changes how git" in row["last"], row


def test_a_worktree_whose_git_became_a_repo_of_its_own_runs_nothing_when_committed(
        tmp_path: Path) -> None:
    """The sandbox masks a worktree's ``.git`` from a member, but an executor with another
    sandbox (or none) could replace it with a whole git folder whose config and hooks name
    programs. The driver commits through the git folder it recorded when it made the
    worktree, so it neither reads that folder nor commits into it."""
    from choir.evidence.git import locate

    marker = tmp_path / "ran"
    marker.mkdir()
    repo = team_repo(tmp_path / "repo")
    main = locate(repo)
    assert main is not None
    work = main.add_worktree(tmp_path / "wt", "choir/plan/t/item/evil", "main")
    (work.root / ".git").unlink()
    git(work.root, "init", "-q", ".")
    _plant_programs(work.root / ".git", marker)
    (work.root / ".gitattributes").write_text("* filter=x\n")
    (work.root / "a.txt").write_text("A\n")
    work.write("add", "-A")
    work.write("commit", "-q", "--allow-empty", "--no-verify", "-m", "evil")
    assert not list(marker.iterdir()), "the worktree's own .git ran a program on the host"
    head = work.rev("HEAD")
    assert head is not None and git(repo, "show", f"{head}:a.txt") == "A"
    assert git(repo, "rev-parse", "choir/plan/t/item/evil") == head


def test_a_member_sees_no_other_members_workspace(tmp_path: Path) -> None:
    """Two members run side by side: one looks around its worktree (the folder a sandboxed
    member may read beside its repo) for the other's, and copies what it finds. It must
    find nothing: each worktree is alone in a folder of its own."""
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "iso", """\
        - id: spy
          goal: look around
          max_attempts: 1
          executor: {kind: command, command: 'sleep 3; ls -a .. > seen.txt;
            cat ../*/secret.txt ../../*/*/secret.txt > stolen.txt 2>/dev/null; true'}
        - id: victim
          goal: keep a secret
          max_attempts: 1
          executor: {kind: command, command: 'echo hunter2 > secret.txt'}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert {k: r["state"] for k, r in state["items"].items()} == {"spy": "merged",
                                                                   "victim": "merged"}, state
    repo = tmp_path / "repo"
    commit = state["items"]["spy"]["commit"]
    seen = git(repo, "show", f"{commit}:seen.txt").split()
    assert "victim" not in seen, seen  # the other member's worktree is not in sight
    assert git(repo, "show", f"{commit}:stolen.txt") == "", "a member read another's work"


def _one_item(tmp_path: Path, plan_id: str, command: str,
              sandbox: str = "auto") -> tuple[dict, dict]:  # type: ignore[type-arg]
    """A plan of one item ``a`` whose member runs ``command`` once: its record, a's row.
    ``sandbox: none`` is the trust mode, where no guard undoes what the member did to git."""
    plan = write_plan(tmp_path, plan_id, f"""\
        - id: a
          goal: write a
          max_attempts: 1
          executor: {{kind: command, sandbox: {sandbox}, command: '{command}'}}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    return state, state["items"]["a"]


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_nested_repository_a_member_commits_is_never_merged(tmp_path: Path,
                                                              sandbox: str) -> None:
    """A member made a nested git repository in its worktree: the item's round does not see
    it (a folder that is a repository of its own is no file of the tree), the driver's
    ``git add -A`` committed it as a submodule entry, and the commit's tree hash left such
    entries out, so the gate, the integration round and ``promote`` all passed a tree with a
    commit in it nobody verified (a review found it). An item whose commit's submodule
    entries differ from its base's now fails (``none``, the trust mode). A sandboxed member's
    nested ``.git`` is removed once its sandbox ends (review 25): its files are plain files
    of the tree, verified and merged as such, never a submodule entry."""
    repo = team_repo(tmp_path / "repo")
    nested = ("echo A > a.txt && git init -q vendor && cd vendor && echo x > __init__.py && "
              "git -c user.name=x -c user.email=x@x add -A && "
              "git -c user.name=x -c user.email=x@x commit -qm x")
    state, row = _one_item(tmp_path, "gl", nested, sandbox)
    if sandbox == "none":
        assert row["state"] == "failed" and "vendor" in row["last"], row
        assert state["status"] == "failed"
        assert "vendor" not in git(repo, "ls-tree", "--name-only", "choir/plan/gl/integration")
        return
    assert row["state"] == "merged", row
    entries = git(repo, "ls-tree", "-r", "choir/plan/gl/integration", "vendor").split("\n")
    assert [e.split()[1] for e in entries if e] == ["blob"], entries  # a file, not a commit


def test_a_worktree_made_a_repository_of_its_own_is_never_committed(tmp_path: Path) -> None:
    """Review 16d: a member replaced its worktree's ``.git`` with a repository of its own
    whose excludes hide ``bad.txt``: the item's round listed that repository's files, never
    saw ``bad.txt`` and ASSERTed; the driver's commit (through the admin folder) held it, and
    the item failed only at its integration round, for a reason that named no ``.git``. Since
    review 25 the worktree's ``.git`` (a pointer file) is put back once the member's sandbox
    ends, the repository it made removed: the round sees ``bad.txt`` and fails on it."""
    repo = team_repo(tmp_path / "repo")
    own = ("echo BROKEN > bad.txt && rm -f .git && git init -q . && "
           "echo bad.txt >> .git/info/exclude")
    _state, row = _one_item(tmp_path, "og", own)
    assert row["state"] == "failed" and "verification failed" in row["last"], row
    assert row["sent_back"] == 0
    assert "bad.txt" not in git(repo, "ls-tree", "--name-only", "choir/plan/og/integration")


NESTED_FILTER = (
    "git init -q {at} && cd {at} && echo x > f && git add f && "
    "git config filter.evil.clean \"sh -c \\\"touch {marker}; cat\\\"\" && "
    "printf \"f filter=evil\\\\n\" > .gitattributes && touch -d @1 f")


@pytest.mark.parametrize("sandbox", ["auto", "none"])
@pytest.mark.parametrize("at", ["vendor", "sub"])
def test_a_nested_repository_runs_none_of_its_programs_when_the_item_is_committed(
        tmp_path: Path, at: str, sandbox: str) -> None:
    """``git add -A`` starts git in a nested repository it finds (to tell whether it is
    dirty), under that repository's own config: a filter the member wrote there ran on the
    host as Choir, before the submodule check could fail the item (a review found it).
    ``sub``: the base's submodule, an empty folder in the checkout, made a repository with
    no commit (git then asks it whether it is dirty); ``vendor``: a repository of the
    member's own. In the trust mode (``none``) the item now fails before any git runs in its
    worktree, naming the ``.git`` it found; a sandboxed member's ``.git`` is removed when its
    sandbox ends."""
    marker = tmp_path / "pwned"
    repo = team_repo(tmp_path / "repo")
    if at == "sub":
        git(repo, "update-index", "--add", "--cacheinfo", "160000," + "1" * 40 + ",sub")
        (repo / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n'
                                          '\turl = https://example.invalid/sub\n')
        git(repo, "add", ".gitmodules")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "submodule")
    command = "echo A > a.txt && " + NESTED_FILTER.format(at=at, marker=marker)
    _state, row = _one_item(tmp_path, "nf", command, sandbox)
    assert not marker.exists(), "a nested repository's filter ran on the host"
    if sandbox == "none":  # the trust mode: the driver finds the repository and refuses it
        assert row["state"] == "failed" and f"({at}/.git)" in row["last"], row
        return
    # sandboxed: the member's .git was removed once its sandbox ended (review 25), so no git
    # ever ran in it, and what it left are plain files, seen and judged as such
    if at == "vendor":  # its attributes name a filter: refused as any tree's would be
        assert row["state"] == "failed" and "vendor/.gitattributes" in row["last"], row
    else:  # inside the base's submodule path: no file of the tree, the gitlink unchanged
        assert row["state"] == "merged", row
        entry = git(repo, "ls-tree", "choir/plan/nf/integration", "sub").split()
        assert entry[1:3] == ["commit", "1" * 40], entry


def test_a_claim_recorded_outside_the_plan_never_stands_in_for_its_rounds(
        tmp_path: Path) -> None:
    """Review 15's suspicion, made an attack: the driver takes an ASSERT of the plan's claim
    on a tree as that integration round done ("verified before"), and of ``PLAN.ITEM`` as
    the item's. ``choir verify --claim PLAN`` (or an agent's verify over MCP, in CALM) on
    the tree the plan will reach stood in for the plan's own round, in its own mood. A plan
    whose names hold claims already is refused; once a plan exists no one else records its
    claims; and a claim with a '.' is a plan item's, never named by hand."""
    from choir.app.verify import averify_tree
    from choir.exceptions import UserError

    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "atk2", """\
        - id: a
          goal: changes nothing, so its integration tree is the base tree
          member: worker
        """)
    pre = asyncio.run(averify_tree(tmp_path / "repo", claim="atk2"))  # the attacker's CALM round
    assert pre.contract["claim"]["asserted"]
    with pytest.raises(UserError, match="holds claims under its names already"):
        asyncio.run(run_plan(load_plan(plan)))
    with pytest.raises(UserError, match="a plan item's claim"):
        asyncio.run(averify_tree(tmp_path / "repo", claim="atk3.a"))
    fresh = write_plan(tmp_path, "atk3", """\
        - id: a
          goal: a
          member: worker
        """)
    state = asyncio.run(run_plan(load_plan(fresh)))
    assert state["items"]["a"]["state"] == "merged", state
    with pytest.raises(UserError, match="a plan of that name"):
        asyncio.run(averify_tree(tmp_path / "repo", claim="atk3"))
