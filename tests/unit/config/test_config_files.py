"""choir.yaml and work item files: valid shapes load; every mistake names file, line and fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from choir.config import PIPELINE, load_repo_config, load_work_item
from choir.exceptions import ConfigError
from choir.models import Mood, VerifierKind

CONTRACT_EXAMPLE = """\
verification:
  steps:
    - name: install
      command: pip install -e .
    - name: test
      command: pytest -q
  timeout_s: 600
verifiers:
  unit:
    kind: unit_tests
    steps:
      - name: pytest
        command: pytest -q --junitxml=$CHOIR_OUT/junit.xml
    parser: junit
    timeout_s: 300
models:
  reporter: openai/gpt-4o-mini
  director: openai/gpt-4o
  executor: openai/gpt-4o
moods:
  CALM: {verifiers: [unit]}
  SKEPTICAL: {verifiers: [unit, pipeline]}
"""


def write(repo: Path, text: str) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    path = repo / "choir.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_contract_example_loads(tmp_path: Path) -> None:
    write(tmp_path, CONTRACT_EXAMPLE)
    config = load_repo_config(tmp_path)
    assert set(config.verifiers) == {PIPELINE, "unit"}
    assert config.verifiers[PIPELINE].kind is VerifierKind.PIPELINE
    assert [s.name for s in config.verifiers[PIPELINE].steps] == ["install", "test"]
    assert config.verifiers["unit"].parser == "junit"
    assert config.verifiers["unit"].timeout_s == 300
    assert config.models.reporter == "openai/gpt-4o-mini"
    assert config.moods[Mood.CALM].verifiers == ("unit",)


@pytest.mark.parametrize(
    ("text", "line", "needle", "hint"),
    [
        ("verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n      - name: t\n"
         "        comand: pytest\n", 6, "unknown key", "did you mean 'command'"),
        ("verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n      - name: t\n", 5,
         "'verifiers.unit.steps.0.command' is required", "add 'command:'"),
        ("verifiers:\n  unit:\n    kind: unit_tests\n    timeout_s: -5\n    steps:\n"
         "      - {name: t, command: x}\n", 4, "greater than 0", None),
        ("verifiers:\n  unit:\n    kind: unit_test\n    steps:\n      - {name: t, command: x}\n",
         3, "kind", "unit_tests"),
        ("verifiers:\n  unit: [\n", 3, "invalid YAML", "indentation"),
        ("verification:\n  steps:\n    - {name: t, command: x}\nmoods:\n  CALM:\n"
         "    verifiers: [unit]\n", 6, "unknown verifier 'unit'", "pipeline"),
        ("verifers:\n  unit: {}\n", 1, "unknown key 'verifers'", "did you mean 'verifiers'"),
        ("{}\n", 1, "no verifier is configured", "verification:"),
    ],
)
def test_bad_config_names_file_line_and_fix(
    tmp_path: Path, text: str, line: int, needle: str, hint: str | None
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_repo_config(tmp_path)
    err = info.value
    assert err.path == str(path)
    assert err.line == line, str(err)
    assert needle in str(err)
    if hint:
        assert err.hint is not None and hint in err.hint


def test_missing_repo_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_repo_config(tmp_path / "nope")


def test_missing_choir_yaml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_repo_config(tmp_path)
    assert info.value.path == str(tmp_path.resolve() / "choir.yaml")


def test_work_item_resolves_repo_relative_to_file(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    item_file = tmp_path / "item.yaml"
    item_file.write_text(
        "id: fix-add\ngoal: add must add\nrepo: ./repo\nmood: CALM\nmax_attempts: 4\n"
        "executor:\n  kind: command\n  command: python3 ../fix.py\n"
    )
    item = load_work_item(item_file)
    assert item.repo == str((tmp_path / "repo").resolve())
    assert item.max_attempts == 4 and item.mood is Mood.CALM
    assert item.executor.command == "python3 ../fix.py"


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("id: x\ngoal: g\nrepo: ./missing\nexecutor: {kind: command, command: 'true'}\n", 3,
         "does not exist"),
        ("id: x\ngoal: g\nrepo: ./repo\nmax_attempts: 0\n", 4, "max_attempts"),
        ("id: x\ngoal: g\nrepo: ./repo\nexecutor:\n  kind: command\n", 4, "needs 'command'"),
        ("id: x\ngoal: g\nrepo: ./repo\nmood: SLEEPY\n", 4, "mood"),
        ("id: x\nrepo: ./repo\n", 1, "'goal' is required"),
        ("id: x\ngoal: g\nrepo: ./repo\nexecuter: {}\n", 4, "did you mean"),
    ],
)
def test_bad_work_item(tmp_path: Path, text: str, line: int, needle: str) -> None:
    (tmp_path / "repo").mkdir()
    item_file = tmp_path / "item.yaml"
    item_file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_work_item(item_file)
    assert info.value.line == line, str(info.value)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("text", "line", "needle", "fix"),
    [
        ("id: x\ngoal: g\nrepo: ./repo\nrequired_verifiers:\n  - unit\n  - unti\n", 6,
         "required verifier 'unti' is not in", "use one of: lint, unit"),
        ("id: x\ngoal: g\nrepo: ./repo\nsplit_of: y\n", 4,
         "'split_of' is set by Choir", "remove 'split_of:'"),
        ("id: x\ngoal: g\nrepo: ./repo\nfocus: [t]\n", 4, "'focus' is set by Choir",
         "remove 'focus:'"),
    ],
)
def test_a_work_item_cannot_name_unknown_verifiers_or_choirs_own_fields(
        tmp_path: Path, text: str, line: int, needle: str, fix: str) -> None:
    """An unknown required verifier would be dropped from every plan: an ASSERT without it."""
    write(tmp_path / "repo", "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, "
          "command: 'true'}]}\n  lint: {kind: lint, steps: [{name: l, command: 'true'}]}\n")
    item_file = tmp_path / "item.yaml"
    item_file.write_text(text + "executor: {kind: command, command: 'true'}\n")
    with pytest.raises(ConfigError) as info:
        load_work_item(item_file)
    assert info.value.line == line and info.value.path == str(item_file), str(info.value)
    assert needle in str(info.value) and fix in str(info.value)


@pytest.mark.parametrize(("independent", "needle"), [
    ("nope", "lenses.independent names unknown verifier 'nope'"),
    ("unit", "lenses.independent names itself"),
])
def test_a_lens_names_only_another_allowlisted_verifier(tmp_path: Path, independent: str,
                                                        needle: str) -> None:
    repo = tmp_path / "repo"
    write(repo, textwrap.dedent(f"""\
        verifiers:
          unit:
            kind: unit_tests
            steps: [{{name: t, command: pytest}}]
            lenses:
              isolate: pytest {{tests}}
              independent: {independent}
          lint: {{kind: lint, steps: [{{name: l, command: ruff}}]}}
        """))
    with pytest.raises(ConfigError) as info:
        load_repo_config(repo)
    assert info.value.line == 7 and needle in str(info.value)
    assert "name another verifier of this allowlist: lint" in str(info.value)


def test_a_mood_that_names_no_verifier_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: x}]}\n"
                    "moods:\n  CALM: {verifiers: []}\n")
    with pytest.raises(ConfigError) as info:
        load_repo_config(tmp_path)
    assert "mood CALM names no verifier" in str(info.value) and info.value.line == 4


def test_a_work_item_id_with_the_part_marker_is_refused(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    item_file = tmp_path / "item.yaml"
    item_file.write_text("id: fix~1\ngoal: g\nrepo: ./repo\n"
                         "executor: {kind: command, command: 'true'}\n")
    with pytest.raises(ConfigError) as info:
        load_work_item(item_file)
    assert info.value.line == 1 and "marks the parts of a split work item" in str(info.value)


@pytest.mark.parametrize(("setting", "line"), [("allow_unsafe_isolation: true", 4),
                                               ("require_limits: false", 4),
                                               # YAML words and numbers pydantic would
                                               # have read as the same booleans (review 20c:
                                               # PARANOID ran in `local`, ASSERTed)
                                               ("allow_unsafe_isolation: 'yes'", 4),
                                               ("allow_unsafe_isolation: 1", 4),
                                               ("require_limits: 'no'", 4),
                                               ("require_limits: 0", 4)])
def test_choir_yaml_cannot_loosen_what_the_mood_policy_requires(
        tmp_path: Path, setting: str, line: int) -> None:
    """The repo's choir.yaml, which an executor (or a pull request) can write, switched off
    PARANOID's isolation and its resource limits: PARANOID ran with no sandbox and ASSERTed
    (a review found it). A mood may be tightened there, never loosened."""
    write(tmp_path, "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: x}]}\n"
                    f"moods:\n  PARANOID: {{{setting}}}\n")
    with pytest.raises(ConfigError) as info:
        load_repo_config(tmp_path)
    assert info.value.line == line and "cannot loosen" in str(info.value), str(info.value)
    # tightening is the repo's to do
    write(tmp_path, "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: x}]}\n"
                    "moods:\n  CALM: {allow_unsafe_isolation: false, require_limits: true}\n")
    assert load_repo_config(tmp_path).moods[Mood.CALM].require_limits is True


def test_choir_yaml_cannot_narrow_paranoid_or_cut_its_reruns(tmp_path: Path) -> None:
    """``moods: {PARANOID: {verifiers: [unit], reruns: 1}}`` shrank PARANOID's plan from ten
    runs to one (no rerun, lint or security scan, mutants or trace): a pull request checked
    by ``choir verify --mood PARANOID`` chose its own checks (a review's finding, failing on
    the old code). A guarded mood's verifiers may be added to, never removed, and no mood's
    reruns lowered; Choir's own trace and mutation checks stay whatever the list says."""
    from choir.config.policy import load_policy, with_run_checks

    allow = ("verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: x}]}\n"
             "  lint: {kind: lint, steps: [{name: t, command: x}]}\n"
             "  sec: {kind: security_scan, steps: [{name: t, command: x}]}\n")
    write(tmp_path, allow + "moods:\n  PARANOID: {verifiers: [unit], reruns: 1}\n")
    with pytest.raises(ConfigError) as info:
        load_repo_config(tmp_path)
    text = str(info.value)
    assert "cannot loosen reruns" in text and "leaves out lint, sec" in text, text
    assert {e.line for e in info.value.errors} == {6}, [e.line for e in info.value.errors]
    # naming every verifier of its kinds (and more) is the repo's to do; Choir's own
    # checks are added whatever the list says
    write(tmp_path, allow + "  extra: {kind: smoke, steps: [{name: t, command: x}]}\n"
                            "moods:\n  PARANOID: {verifiers: [unit, lint, sec, extra]}\n")
    policy = load_policy(with_run_checks(load_repo_config(tmp_path)))
    paranoid = policy.moods[Mood.PARANOID]
    assert {"unit", "lint", "sec", "extra", "trace", "unit.mutants"} <= set(paranoid.verifiers)
    assert paranoid.reruns == 2
    # CALM's list is the repo's to choose (the documented override)
    write(tmp_path, allow + "moods:\n  CALM: {verifiers: [lint]}\n")
    assert load_policy(load_repo_config(tmp_path)).moods[Mood.CALM].verifiers == ("lint",)


@pytest.mark.parametrize(("text", "hint"), [
    ("verifiers:\n  unit:\n    kind: unit_tests\n    steps: []\n",
     "give 'steps' at least 1 item"),
    ("verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n      - {name: t, command: ''}\n",
     "give 'command' at least 1 character"),
    ("verifiers:\n  'b d':\n    kind: unit_tests\n    steps:\n      - {name: t, command: x}\n",
     "A-Za-z"),
])
def test_a_length_or_pattern_fix_says_what_the_value_needs(tmp_path: Path, text: str,
                                                           hint: str) -> None:
    """Review 17h: an empty ``steps`` or ``command`` read "give 'command' between 1 and any
    number of items" (a string is no list, and there is no upper bound), and a name's
    pattern was lowercased into another rule (``[a-za-z0-9]``)."""
    write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_repo_config(tmp_path)
    assert info.value.hint is not None and hint in info.value.hint, info.value.hint
    assert "any number" not in info.value.hint
