"""Review 20 (F3, F4, F5): what a repo's choir.yaml or a work item may not say.

F4: a verifier named like one of Choir's own run checks (``NAME.mutants``, ``choir-trace``)
was silently replaced by it in ``choir run``, so a failing lint of that name never ran.
F5: a mood listing only the run's trace checked no code, yet ASSERTed.
F3: an integer of more than 4300 digits, a date that is no date, or a NUL in ``repo:`` was
an internal error (exit 4) instead of a ConfigError with its line (exit 2).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from choir.config import load_repo_config, load_work_item
from choir.exceptions import ConfigError

UNIT = "verifiers:\n  unit:\n    kind: unit_tests\n    steps: [{name: t, command: 'true'}]\n"


def write(repo: Path, text: str) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    path = repo / "choir.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def load_error(repo: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_repo_config(repo)
    return str(info.value)


@pytest.mark.parametrize("name", ["unit.mutants", "lint.mutants", "choir-trace"])
def test_a_verifier_named_like_a_run_check_is_refused_with_its_line(tmp_path: Path,
                                                                    name: str) -> None:
    path = write(tmp_path, UNIT + f"  {name}:\n    kind: lint\n"
                                  "    steps: [{name: lint, command: 'exit 1'}]\n")
    err = load_error(tmp_path)
    assert f"{path}:5:" in err and f"'{name}'" in err and "fix:" in err


def test_a_decision_callable_named_like_a_mutation_check_is_refused(tmp_path: Path) -> None:
    (tmp_path / "verifiers").mkdir()
    (tmp_path / "verifiers" / "unit.mutants.py").write_text("def verify(context):\n    pass\n")
    path = write(tmp_path, UNIT + "decisions:\n  refund:\n    verification:\n"
                                  "      methods: [unit.mutants]\n")
    err = load_error(tmp_path)
    assert f"{path}:8:" in err and "'unit.mutants'" in err


TRACE = "  runtrace:\n    kind: trace\n    steps: [{name: verify, command: choir trace verify}]\n"


def test_a_mood_listing_only_the_trace_is_refused_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, UNIT + TRACE + "moods:\n  CALM: {verifiers: [runtrace]}\n")
    err = load_error(tmp_path)
    assert f"{path}:9:" in err and "mood CALM" in err and "runtrace" in err
    assert "unit" in err.split("fix:")[1]


def test_an_allowlist_of_the_trace_alone_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "verifiers:\n" + TRACE)
    err = load_error(tmp_path)
    assert f"{path}:1:" in err and "checks no code" in err


def test_a_mood_listing_the_trace_beside_a_check_loads(tmp_path: Path) -> None:
    write(tmp_path, UNIT + TRACE + "moods:\n  CALM: {verifiers: [runtrace, unit]}\n")
    assert load_repo_config(tmp_path).moods


def test_an_integer_of_5000_digits_in_choir_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, UNIT + "max_parallel: " + "9" * 5000 + "\n")
    err = load_error(tmp_path)
    assert f"{path}:5:" in err and "4300" in err and "set_int_max_str_digits" not in err


@pytest.mark.parametrize("value", ["2024-13-45", "2024-02-30 10:00:00"])
def test_a_date_that_is_no_date_is_a_config_error(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, UNIT + f"max_parallel: {value}\n")
    assert f"{path}:5:" in load_error(tmp_path)


def item(tmp_path: Path, text: str) -> Path:
    (tmp_path / "repo").mkdir(exist_ok=True)
    write(tmp_path / "repo", UNIT)
    path = tmp_path / "item.yaml"
    path.write_text(text)
    return path


def test_an_integer_of_4400_digits_in_a_work_item_is_a_config_error(tmp_path: Path) -> None:
    path = item(tmp_path, "id: x\ngoal: g\nrepo: ./repo\nmax_attempts: " + "1" * 4400
                + "\nexecutor: {kind: command, command: 'true'}\n")
    with pytest.raises(ConfigError) as info:
        load_work_item(path)
    assert f"{path}:4:" in str(info.value)


@pytest.mark.parametrize("repo", ['"re\\0po"', "a" * 300, "a/" * 3000])
def test_a_repo_with_a_nul_or_too_long_is_a_config_error(tmp_path: Path, repo: str) -> None:
    path = item(tmp_path, f"id: y\ngoal: g\nrepo: {repo}\n"
                          "executor: {kind: command, command: 'true'}\n")
    with pytest.raises(ConfigError) as info:
        load_work_item(path)
    assert f"{path}:3:" in str(info.value) and "repo" in str(info.value)
