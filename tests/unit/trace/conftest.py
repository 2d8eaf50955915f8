"""A small well-formed trace with its evidence in a real artifact store (bench's builder)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from choir.evidence.artifacts import ArtifactStore

_BENCH = Path(__file__).parents[3] / "bench" / "trace_verify.py"


@functools.cache
def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("_bench_trace_verify", _BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_trace(n_events: int, store: ArtifactStore) -> dict[str, Any]:
    trace: dict[str, Any] = _bench().build(n_events, store)
    return trace


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def small(store: ArtifactStore) -> dict[str, Any]:
    return build_trace(12, store)
