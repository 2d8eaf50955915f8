"""Failing node ids are printed ready to paste into a shell (review 17h)."""

from __future__ import annotations

import shlex

import pytest

from choir.cli._render import render_verify


def test_a_parametrized_node_id_is_quoted_for_the_shell(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``test_double[minus one]`` pasted after ``python3 -m pytest`` split at its space:
    "file or directory not found: one]"."""
    node = "tests/test_calc.py::test_double[minus one]"
    contract = {"status": "FAIL", "run_id": "r", "mood": "CALM", "manifest": {},
                "reports": [], "threads": [], "attestations": [], "artifact_paths": [],
                "failing_tests": [{"node_id": node, "location": "", "verifier": "unit",
                                   "replica": 0},
                                  {"node_id": "tests/test_calc.py::test_plain", "location": "",
                                   "verifier": "unit", "replica": 0}]}
    render_verify(contract)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "test_double" in ln)
    assert shlex.split(line)[0] == node, line
    assert "  tests/test_calc.py::test_plain" in out  # a plain id stays as it is


def test_the_first_tests_of_a_repo_are_told_why_they_cannot_pass_alone() -> None:
    """Review 17h: a pull request adding a repo's first tests read INCONCLUSIVE (the base's
    checks ran no test; added tests never decide alone) and nothing said why."""
    from choir.app.base_lines import base_lines

    contract = {"base": {"ref": "main", "commit": "0" * 40, "added": ["tests/test_a.py"]},
                "reports": [{"verifier": "unit", "result": "INCONCLUSIVE"},
                            {"verifier": "unit", "result": "PASS"}],
                "threads": [{"replica": 0}, {"replica": 1000}]}
    assert any("added tests never decide alone" in line for line in base_lines(contract))
    contract["reports"][0]["result"] = "PASS"
    assert not any("decide alone" in line for line in base_lines(contract))
