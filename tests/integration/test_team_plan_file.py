"""The plan file is validated whole: every mistake at once, with file, line and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.exceptions import ConfigError
from choir.team.plan import load_plan
from tests import forked
from tests.team import team_repo, write_plan


def test_every_mistake_in_a_plan_is_reported_at_once(tmp_path: Path) -> None:
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "p", """\
        - id: a
          goal: a
          member: nobody
        - id: b
          goal: b
          member: worker
          depends_on: [c]
        - id: c
          goal: c
          member: worker
          depends_on: [b]
        - id: d
          goal: d
          member: worker
          depends_on: [zzz]
        - id: e
          goal: e
        - id: f
          goal: f
          member: worker
          escalate_to: stronger
        """)
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    text = str(err.value)
    assert "unknown member 'nobody'" in text and f"{plan}:11:" in text
    assert "dependency cycle: b -> c -> b" in text
    assert "depends on missing item 'zzz'" in text
    assert "escalates to unknown member 'stronger'" in text and f"{plan}:29:" in text
    assert "item 'e' needs exactly one of 'executor:' and 'member:'" in text
    assert str(plan) in text


def test_a_good_plan_loads_and_resolves_members(tmp_path: Path) -> None:
    team_repo(tmp_path / "repo")
    plan = load_plan(write_plan(tmp_path, "p", """\
        - id: a
          goal: a
          member: worker
        - id: b
          goal: b
          executor: {kind: command, command: 'echo hi'}
          depends_on: [a]
        """))
    assert plan.repo == str((tmp_path / "repo").resolve())
    item = plan.work_item("a", tmp_path)
    assert item.id == "p.a" and item.executor.command == "true"
    assert plan.work_item("b", tmp_path).executor.command == "echo hi"


def test_the_cli_exits_2_naming_file_and_line(tmp_path: Path) -> None:

    from tests.workitems import PY

    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "p", """\
        - id: a
          goal: a
          member: worker
          depends_on: [a]
        """)
    proc = forked.run([PY, "-m", "choir", "plan", "run", str(plan)], capture_output=True,
                      text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{plan}:" in proc.stderr and "dependency cycle: a -> a" in proc.stderr


def test_an_item_escalates_to_a_member_of_the_plan_as_that_members_executor(
        tmp_path: Path) -> None:
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "p", """\
        - id: a
          goal: a
          executor: {kind: command, command: 'false'}
          escalate_to: worker
        - id: b
          goal: b
          member: worker
          escalate_to: human
        """)
    loaded = load_plan(plan)
    a = loaded.work_item("a", tmp_path)
    assert a.escalate_to == loaded.members["worker"].executor
    assert loaded.work_item("b", tmp_path).escalate_to == "human"


def test_items_come_from_a_folder_of_work_item_files_each_checked_with_its_own_lines(
        tmp_path: Path) -> None:
    team_repo(tmp_path / "repo")
    folder = tmp_path / "backlog"
    folder.mkdir()
    (folder / "a.yaml").write_text("id: a\ngoal: write a\nmember: worker\n")
    (folder / "b.yaml").write_text("id: b\ngoal: copy a\nmember: worker\ndepends_on: [a]\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text("id: f\nrepo: ./repo\nitems_from: backlog\n"
                    "members:\n  worker:\n    executor: {kind: command, command: 'true'}\n")
    loaded = load_plan(plan)
    assert [i.id for i in loaded.items] == ["a", "b"]
    assert loaded.item("b").depends_on == ("a",)
    (folder / "c.yaml").write_text("id: c\ngoal: c\n\nmember: nobody\ndepends_on: [zzz]\n")
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    text = str(err.value)
    assert f"{folder / 'c.yaml'}:4:" in text and "unknown member 'nobody'" in text
    assert f"{folder / 'c.yaml'}:5:" in text and "missing item 'zzz'" in text
    (folder / "c.yaml").unlink()
    (folder / "d.yaml").symlink_to(folder / "a.yaml")  # said as a link, not as unreadable
    with pytest.raises(ConfigError, match="d.yaml: is a symlink") as err:
        load_plan(plan)
    assert "replace the link with the file itself" in str(err.value)
    plan.write_text("id: f\nrepo: ./repo\nitems_from: nowhere\n")
    with pytest.raises(ConfigError, match="items_from 'nowhere' is not a folder"):
        load_plan(plan)


def test_a_plan_id_with_a_dot_is_refused_its_claim_would_be_another_plans_item(
        tmp_path: Path) -> None:
    """Item claims are ``PLAN.ITEM``: a plan ``p.x`` would read, and write, plan ``p``'s
    item ``x``'s claim (its gate, its ASSERTs for an equal tree)."""
    from choir.team.plan import item_key

    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "p.x", """\
        - id: a
          goal: a
          member: worker
        """)
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    text = str(err.value)
    assert f"{plan}:1:" in text and "may not contain '.'" in text and "p-x" in text
    assert item_key("p", "x") == "p.x"  # the claim such a plan would have shared
    # an id without a dot still loads, and items may keep theirs
    dotted = load_plan(write_plan(tmp_path, "p", """\
        - id: x.y
          goal: a
          member: worker
        """))
    assert dotted.id == "p" and item_key(dotted.id, "x.y") == "p.x.y"


def test_ids_and_a_base_git_or_the_run_ids_cannot_take_are_refused_at_load(
        tmp_path: Path) -> None:
    """Found by a review: these loaded, then failed once the plan had a record (a raw git
    error or a validation traceback, and `--resume` repeated it): '~' is a split part's,
    ``a..b``, ``a.`` and ``a.lock`` name no branch, and a long plan and item id together
    make a run id over its limit; ``base: main.lock`` names no branch either."""
    team_repo(tmp_path / "repo")
    long_item = "i" * 40
    plan = write_plan(tmp_path, "p" * 45, f"""\
        - id: x~1
          goal: a
          member: worker
        - id: a..b
          goal: a
          member: worker
        - id: a.
          goal: a
          member: worker
        - id: a.lock
          goal: a
          member: worker
        - id: {long_item}
          goal: a
          member: worker
        """)
    plan.write_text(plan.read_text().replace("base: main", "base: main.lock"))
    with pytest.raises(ConfigError) as err:
        load_plan(plan)
    text = str(err.value)
    assert f"{plan}:9: item id 'x~1'" in text and "only the parts of a split item" in text
    for line in (12, 15, 18):
        assert f"{plan}:{line}:" in text
    assert text.count("cannot name a git branch") == 3
    assert f"{plan}:21:" in text and "too long beside the plan id" in text
    assert "base 'main.lock' is not a branch name" in text


def test_a_long_chain_of_dependencies_loads_and_its_cycle_is_named(tmp_path: Path) -> None:
    """Review 16c: 1,200 items each depending on the next (105 KB) exceeded Python's
    recursion limit in the cycle check: a traceback, not a plan or an error."""
    team_repo(tmp_path / "repo")
    n = 1500
    items = "".join(f"- id: i{k}\n  goal: g\n  member: worker\n" +
                    (f"  depends_on: [i{k + 1}]\n" if k + 1 < n else "") for k in range(n))
    assert len(load_plan(write_plan(tmp_path, "chain", items)).items) == n
    looped = items + "  depends_on: [i0]\n"  # the last item now needs the first
    with pytest.raises(ConfigError, match="dependency cycle: i0 -> i1 -> "):
        load_plan(write_plan(tmp_path, "loop", looped))
