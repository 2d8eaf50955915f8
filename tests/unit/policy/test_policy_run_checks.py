"""The run checks Choir adds to a ``choir run``'s allowlist never replace a verifier of the
repo's (review 20, F4), and a mood never plans the run's trace alone (review 20, F5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.config import MoodOverride, RepoConfig, load_repo_config
from choir.config.policy import load_policy, with_run_checks
from choir.exceptions import ConfigError
from choir.models import Mood, StepSpec, VerifierKind, VerifierSpec

STEP = (StepSpec(name="t", command="true"),)
TRACE_STEP = (StepSpec(name="verify", command="choir trace verify"),)


def repo_config(tmp_path: Path, **specs: VerifierKind) -> RepoConfig:
    """A configuration built in code, as the Python API may: no file's checks stand guard."""
    verifiers = {name: VerifierSpec(name=name, kind=kind,
                                  steps=TRACE_STEP if kind is VerifierKind.TRACE else STEP)
                 for name, kind in specs.items()}
    return RepoConfig(path=str(tmp_path), source=str(tmp_path / "choir.yaml"),
                      verifiers=verifiers)


def test_the_mutation_check_never_replaces_a_verifier_of_that_name(tmp_path: Path) -> None:
    config = repo_config(tmp_path, unit=VerifierKind.UNIT_TESTS,
                         **{"unit.mutants": VerifierKind.LINT})
    with pytest.raises(ConfigError, match="unit.mutants"):
        with_run_checks(config)


def test_the_trace_check_never_replaces_a_verifier_of_that_name(tmp_path: Path) -> None:
    config = repo_config(tmp_path, unit=VerifierKind.UNIT_TESTS, trace=VerifierKind.LINT,
                         **{"choir-trace": VerifierKind.LINT})
    with pytest.raises(ConfigError, match="choir-trace"):
        with_run_checks(config)


def test_the_run_checks_are_added_beside_the_repos(tmp_path: Path) -> None:
    (tmp_path / "choir.yaml").write_text(
        "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: 'true'}]}\n")
    config = with_run_checks(load_repo_config(tmp_path))
    assert config.verifiers["unit.mutants"].mutates == "unit"
    assert config.verifiers["trace"].kind is VerifierKind.TRACE


def test_a_mood_override_of_the_trace_alone_still_plans_a_check(tmp_path: Path) -> None:
    config = repo_config(tmp_path, unit=VerifierKind.UNIT_TESTS,
                         runtrace=VerifierKind.TRACE).model_copy(
        update={"moods": {Mood.CALM: MoodOverride(verifiers=("runtrace",))}})
    assert "unit" in load_policy(config).moods[Mood.CALM].verifiers
