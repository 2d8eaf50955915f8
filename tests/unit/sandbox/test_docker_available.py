"""#16.1: probing for a Docker engine that is not there must not leak its socket."""

from __future__ import annotations

import gc
import warnings

import pytest

from choir.sandbox.docker import DockerSandbox


def test_available_is_false_and_leaks_no_socket_without_an_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nonexistent.sock")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert DockerSandbox.available() is False
        assert DockerSandbox.available() is False
        gc.collect()
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert [str(w.message) for w in leaks] == []
