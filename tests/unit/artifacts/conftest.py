from __future__ import annotations

from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "art"))
    return ArtifactStore()
