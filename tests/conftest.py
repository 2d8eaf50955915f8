"""Suite-wide guards: every test gets its own CHOIR_HOME, and no test reaches a real network.

Real model requests are forbidden (pydantic-ai does the same): any connection to an address
outside the loopback range fails the test. Tests talk to respx mocks or to servers on
127.0.0.1; the Docker engine is reached over its Unix socket, which stays allowed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.postgres"]  # pg_server / pg_url: a real throwaway Postgres

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DISABLE_AIOHTTP_TRANSPORT", "True")
for _key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL"):
    os.environ.pop(_key, None)

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_loopback(address: Any) -> bool:
    host = address[0] if isinstance(address, tuple) else address
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guard(sock: socket.socket, address: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise ConnectionRefusedError(f"test tried to reach the network: {address!r}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _guard(self, address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _guard(self, address)
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)


@pytest.fixture(scope="session", autouse=True)
def _private_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The user's configuration (``~/.config/choir``: the gate's seen heads) stays out of the
    suite, for module- and session-scoped fixtures too, which run before ``choir_home``.

    A seen-heads file kept across runs remembers stores by path, and a later run whose
    temporary store reuses a path (pytest's numbered dirs start again once /tmp is cleared)
    would be refused as a rewritten log.
    """
    config = tmp_path_factory.mktemp("config")
    saved = {var: os.environ.get(var) for var in ("XDG_CONFIG_HOME", "CHOIR_SEEN_HEADS")}
    os.environ["XDG_CONFIG_HOME"] = str(config)
    os.environ["CHOIR_SEEN_HEADS"] = str(config / "seen-heads")
    yield
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@pytest.fixture(autouse=True)
def choir_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private CHOIR_HOME (keys, AHDB, checkpoints) and artifact dir for each test."""
    home = tmp_path / "choir-home"
    home.mkdir()
    monkeypatch.setenv("CHOIR_HOME", str(home))
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(home / "artifacts"))
    # the gate's high-water marks live outside the home: here, beside it, never in ~/.config
    monkeypatch.setenv("CHOIR_SEEN_HEADS", str(tmp_path / "seen-heads"))
    monkeypatch.delenv("AGENT_ARTIFACT_DIR", raising=False)
    for var in ("CHOIR_DATABASE_URL", "CHOIR_LEASE_WAIT_S"):  # a shell's shared store stays out
        monkeypatch.delenv(var, raising=False)
    yield home


@pytest.fixture(autouse=True)
def _private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Temporary files of the test and of every process it starts go under its tmp_path.

    A test that kills a process with SIGKILL (the crash tests) leaves that process's
    ``TemporaryDirectory`` behind; under tmp_path pytest removes it, not /tmp forever.
    """
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``CHOIR_TESTS_ENGINE_SKIPS=FILE``, the node id of every test skipped because no
    Docker engine answers is appended to FILE: CI's engine stage runs exactly those. Written
    once, by the process that sees every report (not again by the xdist worker that ran it)."""
    path = os.environ.get("CHOIR_TESTS_ENGINE_SKIPS")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if path and not worker and report.skipped and "Docker engine" in str(report.longrepr):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")
