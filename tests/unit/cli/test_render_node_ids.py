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
