"""The code digest moves with anything a request would run differently with."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from choir.serve import stale


def test_the_digest_is_stable_and_moves_with_an_installed_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = stale.code()
    assert first == stale.code()
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    with_site = stale.code()
    assert with_site != first
    os.utime(site, ns=(1, 1))  # what `pip install` does to the folder: a new mtime
    assert stale.code() != with_site


def test_start_up_variables_are_compared_and_the_rest_are_the_requests() -> None:
    mine = stale.start_env({"PYTHONPATH": "/a", "LD_PRELOAD": "", "HOME": "/root"})
    assert mine == {"PYTHONPATH": "/a", "LD_PRELOAD": ""}
    theirs = stale.start_env({"PYTHONPATH": "/b", "OPENAI_API_KEY": "k"})
    assert stale.differences(mine, theirs) == ["LD_PRELOAD", "PYTHONPATH"]
    assert stale.differences(mine, dict(mine)) == []


def test_the_digest_moves_with_a_changed_file_of_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import choir

    package = tmp_path / "choir"
    (package / "_data" / "policies").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    policy = package / "_data" / "policies" / "moods.yaml"
    policy.write_text("moods: {}\n")
    (package / "__pycache__").mkdir()
    monkeypatch.setattr(choir, "__file__", str(package / "__init__.py"))
    first = stale.code()
    (package / "__pycache__" / "x.pyc").write_bytes(b"derived")
    assert stale.code() == first  # bytecode is derived from the sources: not counted
    policy.write_text("moods: {CALM: {}}\n")
    assert stale.code() != first
