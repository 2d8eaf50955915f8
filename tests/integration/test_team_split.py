"""A split in a plan: an item whose failure keeps repeating and divides hands its parts back
to the plan, where each runs, is verified and merged as an item of its own; the item is then
verified whole on the integration head, and only then do its dependents start."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from choir.team.driver import run_plan
from choir.team.plan import load_plan
from tests import forked
from tests.team import git
from tests.workitems import PY, isolating_pytest

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]

# the member: the whole item writes two tested functions, both wrong, every time; a part
# (its goal names its failing test) writes its own function and test, right
MEMBER = textwrap.dedent("""\
    import json, os, pathlib, re
    goal = json.loads(pathlib.Path(os.environ["CHOIR_WORKITEM_FILE"]).read_text())["goal"]
    part = re.search(r"\\[part \\d+/\\d+ of \\S+: make \\w+ test test_(\\w+)\\.py", goal)
    ops = {"sub": ("a - b", "a + b"), "div": ("a // b", "a * b")}
    for name, (right, wrong) in ops.items():
        if part and part.group(1) != name:
            continue
        body = right if part else wrong
        pathlib.Path(f"{name}.py").write_text(f"def {name}(a, b):\\n    return {body}\\n")
        pathlib.Path(f"test_{name}.py").write_text(
            f"from {name} import {name}\\n\\ndef test_{name}():\\n"
            f"    assert {name}(6, 3) == {eval(right, {}, {'a': 6, 'b': 3})}\\n")
    """)


def _repo(repo: Path, member: str, lint: str = "") -> None:
    """A repo with one passing test and the member's script, committed on ``main``; ``lint``:
    more verifiers for its ``choir.yaml``."""
    isolating_pytest(repo)
    with (repo / "choir.yaml").open("a") as fh:
        fh.write(lint)
    (repo / "test_base.py").write_text("def test_base():\n    assert True\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    # the member's script is in the repo: a sandboxed member sees its worktree (and the
    # folder around it), not the test's files
    (repo / "member.py").write_text(member)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")


def _plan(tmp_path: Path, max_parallel: int, more: str = "") -> Path:
    """Plan ``sp`` over ``./repo``: item ``calc`` by the scripted member, then ``more``."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(textwrap.dedent(f"""\
        id: sp
        repo: ./repo
        base: main
        max_parallel: {max_parallel}
        members:
          worker: {{executor: {{kind: command, command: "{PY} member.py"}}}}
        items:
          - id: calc
            goal: sub and div, each with its test
            member: worker
            max_attempts: 6
            may_change_spec: ["test_*.py"]
        """) + textwrap.indent(more, "  "))
    return plan


def test_a_split_item_becomes_parts_of_the_plan_merged_then_it_is_verified_whole(
        tmp_path: Path, choir_home: Path) -> None:
    repo = tmp_path / "repo"
    _repo(repo, MEMBER)
    plan = _plan(tmp_path, 2, textwrap.dedent("""\
          - id: after
            goal: a note once calc is in
            executor: {kind: command, command: 'ls sub.py div.py > after.txt'}
            depends_on: [calc]
        """))
    state = asyncio.run(run_plan(load_plan(plan)))
    rows = state["items"]
    assert set(rows) == {"calc", "after", "calc~1", "calc~2"}, rows
    assert {k: r["state"] for k, r in rows.items()} == dict.fromkeys(rows, "merged"), rows
    assert state["status"] == "asserted"
    parts = {k: rows[k] for k in ("calc~1", "calc~2")}
    assert {r["split_of"] for r in parts.values()} == {"calc"}
    assert rows["calc"]["parts"] == ["calc~1", "calc~2"]
    # the split item's run spent 3 of its 6 attempts; its parts share the 3 left (2 + 1)
    assert sorted(r["part"]["max_attempts"] for r in parts.values()) == [1, 2]
    assert rows["calc"]["attempt"] == 1  # one run of its own, ended by the split
    assert all(r["attempt"] == 1 and r["run_id"].endswith(".1.part") for r in parts.values())
    # each part's goal names its own failing test, and it was told about that piece only
    for name, other in (("div", "sub"), ("sub", "div")):
        (part_id,) = [k for k, r in parts.items() if f"test_{name}" in r["part"]["goal"]]
        told = json.loads((choir_home / "plans" / "sp" / "items" / f"{part_id}.1.json")
                          .read_text())["goal"]
        assert f"test_{name}.py::test_{name}" in told and f"test_{other}" not in told, told
    # the whole item merged once its parts were in: its commit is the head it was checked on
    log = git(repo, "log", "--format=%H %s", state["integration"]).splitlines()
    merged = [line.split(" ", 1)[1] for line in log]

    def landed(item: str) -> int:
        """Where ``item`` came onto the branch: its merge commit, or its own commit when it
        landed as a fast forward (started from the head it landed on)."""
        return next(n for n, subject in enumerate(merged)
                    if subject in (f"merge {item}",) or subject.startswith(f"{item}: "))

    assert landed("after") < landed("calc~1")  # newest first
    assert landed("after") < landed("calc~2")
    assert git(repo, "show", f"{state['integration']}:after.txt").split() == ["div.py",
                                                                              "sub.py"]
    from choir.ahdb import open_ahdb

    events = [e.payload for e in open_ahdb().events() if e.kind == "integrate"]
    assert sorted(e["item"] for e in events) == ["sp.after", "sp.calc", "sp.calc~1",
                                                 "sp.calc~2"]
    whole = next(e for e in events if e["item"] == "sp.calc")
    assert whole["head"] == rows["calc"]["commit"] and whole["tree_hash"] == \
        whole["integration_tree"]
    for args in (["gate", "sp"], ["audit", "--json"]):
        done = forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                          timeout=300)
        assert done.returncode == 0, (args, done.stdout[:2000])
    assert json.loads((choir_home / "plans" / "sp" / "state.json").read_text())["status"] \
        == "asserted"


def test_a_whole_check_that_lands_after_another_item_keeps_the_plans_gate(
        tmp_path: Path, choir_home: Path) -> None:
    """A review of the plan gate's binding to the log: a split item's whole check names the
    head it began on, and an independent item may land while it runs, so the last
    ``integrate`` event is not always the final tree; the gate refused an honest plan. The
    record's final tree must be one a merge in the log names."""
    import asyncio

    from choir._core.ids import new_run_id
    from choir.ahdb import open_ahdb
    from choir.evidence.git import locate
    from choir.evidence.tree import commit_tree_hash
    from choir.team.promote import check_plan_gate
    from choir.team.queue import MergeQueue, verify_tree
    from choir.team.state import save_state
    from tests.workitems import isolating_pytest

    repo = tmp_path / "repo"
    isolating_pytest(repo)
    (repo / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (repo / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")

    def g(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=repo, check=True, capture_output=True, text=True
                              ).stdout.strip()

    g("init", "-q", "-b", "main")
    g("add", "-A")
    g("commit", "-qm", "base")
    heads = {}
    for name in ("a", "b"):
        (repo / f"{name}.txt").write_text(f"{name}\n")
        g("add", "-A")
        g("commit", "-qm", name)
        heads[name] = g("rev-parse", "HEAD")
    trees = {n: commit_tree_hash(repo, c) for n, c in heads.items()}
    for name, claims in (("a", ("sp.a", "sp.w", "sp")), ("b", ("sp.b", "sp"))):
        g("checkout", "-q", heads[name])
        for claim in claims:  # the rounds the driver runs for them
            verdict = asyncio.run(verify_tree(repo, claim, trees[name] or "", "round",
                                              new_run_id("verify")))
            assert verdict.passed, verdict
    g("checkout", "-q", "main")
    db = open_ahdb()
    db.declare_plan("sp", ["a", "b", "w"])  # as the driver does when the plan starts
    for key, name in (("sp.a", "a"), ("sp.b", "b")):  # a lands, then b, as the queue does
        tree = trees[name] or ""
        db.integrate("sp", key, assert_id=db.is_asserted(key, tree).id, tree_hash=tree,
                     commit=heads[name], head=heads[name],
                     integration_assert=db.is_asserted("sp", tree).id, integration_tree=tree)
    # the whole check of w, begun on a's head, records its merge after b landed
    assert MergeQueue("sp", locate(repo), tmp_path / "trees").record_whole(
        "w", heads["a"], trees["a"] or "") is None
    save_state("sp", {"id": "sp", "status": "asserted", "repo": str(repo),
                      "integration": heads["b"], "integration_tree": trees["b"],
                      "items": {"a": {"state": "merged", "commit": heads["a"]},
                                "b": {"state": "merged", "commit": heads["b"]},
                                "w": {"state": "merged", "commit": heads["a"]}}})
    answer = check_plan_gate("sp")
    assert answer.passed, answer.problems


LINTED_MEMBER = MEMBER.replace(
    "body = right if part else wrong",
    "body = (right + '  # LINT-' + 'VIOLATION') if part else wrong")


def test_a_split_in_a_plan_keeps_the_mood_the_item_climbed_to(tmp_path: Path,
                                                               choir_home: Path) -> None:
    """Review 17b (F2): a CALM item that failed the same way climbed to CURIOUS (where lint
    joined its plan), then split (SKEPTICAL) and handed its parts back; the plan ran the
    parts, and the whole check, in the item's declared CALM: lint never ran again, and the
    plan was ASSERTed with the parts' lint violations in its head. The parts run in the
    split's mood, and the whole is verified in it with every verifier the item's rounds ran."""
    _repo(tmp_path / "repo", LINTED_MEMBER,
          lint="  lint:\n    kind: lint\n    steps:\n      - {name: nolint, command: "
               "\"! grep -rn LINT-VIOLATION --include=*.py .\"}\n")
    plan = _plan(tmp_path, 1)  # its item's mood: CALM, the default
    state = asyncio.run(run_plan(load_plan(plan)))
    assert state["status"] != "asserted", state["items"]
    assert state["items"]["calc"]["state"] != "merged", state["items"]
    gate = forked.run([PY, "-m", "choir", "gate", "sp"], capture_output=True, text=True)
    assert gate.returncode != 0, gate.stdout


PINNED_MEMBER = textwrap.dedent("""\
    import json, os, pathlib, re
    goal = json.loads(pathlib.Path(os.environ["CHOIR_WORKITEM_FILE"]).read_text())["goal"]
    part = re.search(r"\\[part \\d+/\\d+ of \\S+: make \\w+ test test_(\\w+)\\.py", goal)
    ops = {"sub": ("a - b", "a * b * 1000"), "div": ("a // b", "a + b + 1000")}
    for name, (right, wrong) in ops.items():
        body = right if part else wrong
        pathlib.Path(f"{name}.py").write_text(f"def {name}(a, b):\\n    return {body}\\n")
    """)


@pytest.mark.parametrize("mood", ["BOLD", "PARANOID"])
def test_a_split_item_of_a_mood_with_run_checks_is_verified_whole(
        tmp_path: Path, choir_home: Path, mood: str) -> None:
    """Review 17e: the split item's floor went whole into its whole check, with Choir's own
    run checks in it (``unit.mutants``, the ``trace``), which a round of a tree never runs:
    every BOLD or PARANOID item that split failed ("required verifier(s) unit.mutants are not
    in choir.yaml's allowlist") where it had been ASSERTed."""
    repo = tmp_path / "repo"
    for name, value in (("sub", 5), ("div", 3)):  # the tests are pinned: in the base commit
        repo.mkdir(exist_ok=True)
        (repo / f"test_{name}.py").write_text(f"from {name} import {name}\n\n"
                                              f"def test_{name}():\n"
                                              f"    assert {name}(7, 2) == {value}\n")
    _repo(repo, PINNED_MEMBER)
    plan = _plan(tmp_path, 1)
    plan.write_text(plan.read_text().replace("max_attempts: 6",
                                             f"max_attempts: 6\n    mood: {mood}"))
    state = asyncio.run(run_plan(load_plan(plan)))
    assert state["status"] == "asserted", state["items"]
    assert {"calc~1", "calc~2"} <= set(state["items"])
