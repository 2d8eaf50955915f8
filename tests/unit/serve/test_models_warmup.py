"""The service's import of the model client (``Server._warm_models``): no fork while it
runs, and never a service that forks nothing because the import hangs."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from choir.serve import place, server
from choir.serve.worker import MODELS
from tests.serving import idle_service


@pytest.fixture
def service_loop(choir_home: Path) -> Any:
    fd = place.open_folder(choir_home, create=True)
    assert fd is not None
    lock = server.take_lock(fd)
    loop = server.Server(idle_service(choir_home), fd, lock, jobs=1, idle_timeout_s=0)
    yield loop
    loop.close()
    os.close(lock)
    os.close(fd)


def test_no_worker_is_forked_while_the_import_runs_and_a_hung_one_stops_holding_them(
        choir_home: Path, service_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(server, "_import_models", lambda: release.wait(30))
    forked: list[int] = []
    monkeypatch.setattr(service_loop, "_fork",
                        lambda: forked.append(1) or server._Worker(pid=-1, ctl=None))
    (choir_home / "serve" / MODELS).write_text("imported")
    service_loop.models = False
    service_loop._warm_models()
    assert service_loop.warming is not None and service_loop.warming.is_alive()
    service_loop._fill()
    assert forked == []  # held while another thread imports
    monkeypatch.setattr(server, "MODELS_WAIT_S", 0.0)  # the import has taken too long
    service_loop._warm_models()
    assert service_loop.warming is None and service_loop.models
    service_loop._fill()
    assert forked == [1]  # forked without it
    service_loop._warm_models()
    assert service_loop.warming is None  # never tried again
    release.set()


def test_a_finished_import_replaces_the_idle_workers_forked_without_it(
        choir_home: Path, service_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(server, "_import_models", lambda: None)
    ours, theirs = socket.socketpair()
    service_loop.idle.append(server._Worker(pid=-1, ctl=ours))
    (choir_home / "serve" / MODELS).write_text("imported")
    service_loop.models = False
    service_loop._warm_models()
    assert service_loop.warming is not None
    service_loop.warming.join(10)
    service_loop._warm_models()
    assert service_loop.models and not service_loop.idle
    assert theirs.recv(1) == b""  # the old idle worker's channel closed: it exits
    theirs.close()
