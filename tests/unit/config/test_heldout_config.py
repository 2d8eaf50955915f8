"""``$CHOIR_HOME/heldout.yaml``: held-out verifiers join a repo's allowlist, mistakes name
the file and line, PARANOID plans every one, and the executor hears counts only."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from choir.config import load_repo_config
from choir.config.policy import load_policy
from choir.evidence.heldout import heldout_tree, redact
from choir.evidence.tree import remove_snapshot
from choir.exceptions import ConfigError, IntegrityError
from choir.models import (
    Counts,
    FailureSignature,
    Mood,
    Result,
    Target,
    VerificationReport,
)


def _repo(tmp_path: Path, extra: str = "") -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(textwrap.dedent("""\
        verifiers:
          unit:
            kind: unit_tests
            steps: [{name: t, command: pytest -q}]
          lint:
            kind: lint
            steps: [{name: l, command: ruff check}]
        """) + extra)
    return repo


def _heldout(home: Path, repo: Path, body: str = "") -> None:
    (home / "heldout" / "calc").mkdir(parents=True, exist_ok=True)
    (home / "heldout" / "calc" / "test_hidden.py").write_text("def test_x(): pass\n")
    (home / "heldout.yaml").write_text(textwrap.dedent(f"""\
        repos:
          - repo: /somewhere/else
            verifiers:
              other: {{kind: unit_tests, steps: [{{name: t, command: pytest}}]}}
          - repo: {repo}
            verifiers:
        """) + textwrap.indent(body or textwrap.dedent("""\
              hidden:
                kind: integration_tests
                path: calc
                steps: [{name: t, command: pytest -q $CHOIR_HELDOUT}]
            """), "      "))


def test_no_file_no_heldout_checks(tmp_path: Path) -> None:
    config = load_repo_config(_repo(tmp_path))
    assert all(s.heldout is None for s in config.verifiers.values())


def test_a_heldout_verifier_joins_the_allowlist_with_its_files_hash(
        tmp_path: Path, choir_home: Path) -> None:
    repo = _repo(tmp_path)
    _heldout(choir_home, repo)
    config = load_repo_config(repo)
    spec = config.verifiers["hidden"]
    assert spec.heldout is not None and len(spec.heldout.files_hash) == 64
    assert spec.heldout.path == str((choir_home / "heldout" / "calc").resolve())
    assert spec.env["CHOIR_HELDOUT"] == ".choir-heldout"
    assert "other" not in config.verifiers  # another repo's


def test_paranoid_plans_every_heldout_check_even_over_a_repo_override(
        tmp_path: Path, choir_home: Path) -> None:
    repo = _repo(tmp_path, "moods:\n  PARANOID: {verifiers: [unit, lint]}\n")
    _heldout(choir_home, repo)
    policy = load_policy(load_repo_config(repo))
    assert policy.moods[Mood.PARANOID].verifiers == ("unit", "lint", "hidden")
    assert "hidden" not in policy.moods[Mood.CALM].verifiers  # by kind: integration_tests
    assert "hidden" in policy.moods[Mood.SKEPTICAL].verifiers


@pytest.mark.parametrize(("body", "words"), [
    ("hidden:\n  kind: unit_tests\n  path: nowhere\n  steps: [{name: t, command: x}]\n",
     "does not exist"),
    ("unit:\n  kind: unit_tests\n  path: calc\n  steps: [{name: t, command: x}]\n",
     "already a verifier"),
    ("hidden:\n  kind: unit_tests\n  path: calc\n", "steps"),
])
def test_mistakes_name_the_file_and_line(tmp_path: Path, choir_home: Path, body: str,
                                         words: str) -> None:
    repo = _repo(tmp_path)
    _heldout(choir_home, repo, body)
    with pytest.raises(ConfigError) as err:
        load_repo_config(repo)
    text = str(err.value)
    assert words in text and "heldout.yaml" in text and err.value.errors[0].line, text


def _report(verifier: str) -> VerificationReport:
    return VerificationReport(
        verifier=verifier, verifier_type="junit", target=Target(tree_hash="a" * 64),
        result=Result.FAIL, summary="test_secret_input failed: assert 7 == 6",
        next_actions=("look at test_secret_input",), confidence=1.0,
        failure_signatures=(FailureSignature(id="s1", kind="assertion",
                                             test_id="t::test_secret_input",
                                             excerpt="assert 7 == 6"),),
        counts=Counts(run=3, failed=1, errors=0, skipped=0), artifacts={"log": "b" * 64})


def test_the_executor_hears_counts_only(tmp_path: Path, choir_home: Path) -> None:
    repo = _repo(tmp_path)
    _heldout(choir_home, repo)
    specs = load_repo_config(repo).verifiers
    mine, held = redact([_report("unit"), _report("hidden")], specs)
    assert mine == _report("unit")  # the repo's own checks: as they were
    # the result alone: the counts are the step's to declare, and the code under test may
    # read the held-out files there (review 18c: a hidden test read back through them)
    assert held.summary == "held-out check FAIL"
    assert "secret" not in held.model_dump_json() and "7 == 6" not in held.model_dump_json()
    assert held.result is Result.FAIL and held.counts == Counts()


def test_the_verifier_reads_a_private_copy_with_the_pinned_files(
        tmp_path: Path, choir_home: Path) -> None:
    repo = _repo(tmp_path)
    _heldout(choir_home, repo)
    spec = load_repo_config(repo).verifiers["hidden"]
    assert spec.heldout is not None
    (repo / ".choir-heldout").mkdir()  # what an executor planted there is dropped
    (repo / ".choir-heldout" / "test_hidden.py").write_text("def test_x(): pass  # mine\n")
    copy = heldout_tree(repo, spec.heldout, tmp_path)
    try:
        assert (copy / ".choir-heldout" / "test_hidden.py").read_text() == \
            "def test_x(): pass\n"
        assert not os.access(copy / ".choir-heldout", os.W_OK) or os.geteuid() == 0
        assert not (copy / ".choir-heldout").stat().st_mode & 0o222
    finally:
        remove_snapshot(copy)
    (choir_home / "heldout" / "calc" / "test_hidden.py").write_text("def test_x(): 1\n")
    with pytest.raises(IntegrityError, match="changed since"):
        heldout_tree(repo, spec.heldout, tmp_path)
