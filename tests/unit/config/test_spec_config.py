"""``spec:`` in choir.yaml and ``may_change_spec:`` in a work item: defaults, additions Choir
always makes, and every bad glob named with its file, line and fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from choir.config import DEFAULT_SPEC, load_repo_config, load_work_item
from choir.exceptions import ConfigError
from tests import forked

UNIT = "verifiers:\n  unit:\n    kind: unit_tests\n    steps: [{name: t, command: pytest}]\n"


def _repo(tmp_path: Path, extra: str = "") -> Path:
    repo = tmp_path / "repo"
    (repo / "checks").mkdir(parents=True)
    (repo / "checks" / "audit.py").write_text("def verify():\n    return True\n")
    (repo / "choir.yaml").write_text(UNIT + extra)
    return repo


def test_the_default_spec_and_what_is_always_pinned(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "  audit:\n    callable: checks/audit.py\n")
    # the interpreter's venv and ``src`` as a file or link: where Python looks, always
    always = ("/.venv/", "pyvenv.cfg", "conda-meta/", "/src")
    assert load_repo_config(repo).spec == (*DEFAULT_SPEC, *always, "/checks/audit.py")
    declared = load_repo_config(_repo(tmp_path / "b", "  audit:\n    callable: "
                                      "checks/audit.py:verify\nspec: [e2e/]\n"))
    assert declared.spec == ("e2e/", "choir.yaml", *always, "/checks/audit.py")


@pytest.mark.parametrize("glob", ["../outside", "~/x", "a/../../b", "''"])
def test_a_spec_glob_outside_the_repo_names_file_and_line(tmp_path: Path, glob: str) -> None:
    repo = _repo(tmp_path, f"spec:\n  - tests/\n  - {glob}\n")
    with pytest.raises(ConfigError) as info:
        load_repo_config(repo)
    assert info.value.path == str(repo / "choir.yaml") and info.value.line == 7
    assert "spec[1]" in str(info.value) and info.value.hint


def test_may_change_spec_is_checked_the_same_way(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    item = tmp_path / "item.yaml"
    item.write_text("id: x\ngoal: g\nrepo: ./repo\nmay_change_spec: [tests/new.py, ../x]\n"
                    "executor: {kind: command, command: 'true'}\n")
    with pytest.raises(ConfigError) as info:
        load_work_item(item)
    assert info.value.line == 4 and "may_change_spec[1]" in str(info.value)
    item.write_text(item.read_text().replace(", ../x", ""))
    assert load_work_item(item).may_change_spec == ("tests/new.py",)
    assert repo.is_dir()


def test_the_cli_exits_2_on_a_bad_spec(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "spec: [../x]\n")
    proc = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(repo)],
                      capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "choir.yaml" in proc.stderr, proc.stderr
