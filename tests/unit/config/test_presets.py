"""``uses: NAME`` presets: a user writes one line and gets the right flags, parser and kind."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from choir.config import load_repo_config
from choir.config.presets import preset_names
from choir.exceptions import ConfigError
from choir.models import VerifierKind


def _repo(tmp_path: Path, yaml: str) -> Path:
    (tmp_path / "choir.yaml").write_text(textwrap.dedent(yaml))
    return tmp_path


def test_the_four_presets_expand_to_full_specs(tmp_path: Path) -> None:
    config = load_repo_config(_repo(tmp_path, """\
        verifiers:
          unit: {uses: pytest}
          lint: {uses: ruff}
          types: {uses: mypy}
          security: {uses: bandit}
        """))
    unit, lint, types, sec = (config.verifiers[n] for n in ("unit", "lint", "types", "security"))
    assert unit.kind is VerifierKind.UNIT_TESTS and unit.parser == "junit"
    # pytest, its JUnit XML written by Choir's light writer (choir/sandbox/pytest_junit.py)
    assert unit.steps[0].command.startswith('python3 -c "$CHOIR_PYTEST" ')
    assert "-p no:cacheprovider" in unit.steps[0].command
    assert unit.lenses.isolate is None  # JUnit ids are not pytest node ids: no subset lens
    assert lint.kind is VerifierKind.LINT and lint.parser == "ruff"
    assert "--no-cache" in lint.steps[0].command and "--output-format json" in lint.steps[0].command
    assert types.kind is VerifierKind.TYPECHECK and types.parser == "mypy"
    assert "--cache-dir=$CHOIR_OUT/" in types.steps[0].command
    assert sec.kind is VerifierKind.SECURITY_SCAN and sec.parser == "sarif"
    assert "-f sarif -o $CHOIR_OUT/bandit.sarif" in sec.steps[0].command
    assert {"pytest", "ruff", "mypy", "bandit"} <= set(preset_names())


def test_fields_beside_uses_override_the_preset_field_by_field(tmp_path: Path) -> None:
    config = load_repo_config(_repo(tmp_path, """\
        verifiers:
          unit:
            uses: pytest
            timeout_s: 42
            steps:
              - name: quick
                command: python3 -m pytest -q -x tests/unit
          integ:
            uses: pytest
            kind: integration_tests
        """))
    unit, integ = config.verifiers["unit"], config.verifiers["integ"]
    assert unit.timeout_s == 42
    assert [s.name for s in unit.steps] == ["quick"]  # steps replace whole
    assert unit.parser == "junit" and unit.kind is VerifierKind.UNIT_TESTS  # the rest is kept
    assert integ.kind is VerifierKind.INTEGRATION_TESTS and integ.parser == "junit"


def test_a_preset_spec_equals_the_same_spec_written_out(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = load_repo_config(_repo(tmp_path / "a", "verifiers:\n  lint: {uses: ruff}\n"))
    spelled = a.verifiers["lint"].model_dump(mode="json", exclude={"name", "schema_version"})
    b = load_repo_config(_repo(tmp_path / "b", f"verifiers:\n  lint: {json.dumps(spelled)}\n"))
    assert a.verifiers["lint"] == b.verifiers["lint"]  # same spec, same hash, no trace of uses


def test_unknown_preset_names_file_line_and_known_presets(tmp_path: Path) -> None:
    repo = _repo(tmp_path, """\
        verifiers:
          unit:
            kind: unit_tests
            steps: [{name: t, command: 'true'}]
          lint:
            uses: flake9
        """)
    with pytest.raises(ConfigError) as info:
        load_repo_config(repo)
    err = info.value
    assert err.path == str(repo / "choir.yaml") and err.line == 6
    assert "flake9" in err.message
    assert err.hint is not None and all(n in err.hint for n in ("pytest", "ruff", "mypy", "bandit"))


def test_a_bad_override_is_still_a_config_error_with_its_line(tmp_path: Path) -> None:
    repo = _repo(tmp_path, """\
        verifiers:
          unit:
            uses: pytest
            timeout_s: -1
        """)
    with pytest.raises(ConfigError) as info:
        load_repo_config(repo)
    assert info.value.line == 4 and "timeout_s" in info.value.message
