"""A warm service's idle worker parses the configuration files its last requests read
(``choir.serve.worker``: ``_note_parsed`` after a request, ``_parse_ahead`` before the next).
The note is the service's own file in its owner-only folder; a link or a malformed note
there is read as no note."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from choir.config import _yaml
from choir.config._yaml import load_yaml
from choir.serve import place, worker


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> worker.Service:
    monkeypatch.setattr(_yaml, "_PARSED", {})
    place.folder(tmp_path / "home").mkdir(parents=True, mode=0o700)
    return worker.Service(home=tmp_path / "home", version="0", code="", start_env={},
                          root=(0, 0), commands={})


def test_what_a_request_read_is_parsed_by_the_next_idle_worker(
        tmp_path: Path, service: worker.Service, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "repo" / "choir.yaml"
    config.parent.mkdir()
    config.write_text("verifiers:\n  unit: {uses: pytest}\n")
    load_yaml(config, root=config.parent)  # the request's read
    worker._note_parsed(service)
    note = place.folder(service.home) / worker.PARSED
    assert json.loads(note.read_text()) == [str(config)]
    assert oct(note.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setattr(_yaml, "_PARSED", {})  # the next worker: a process of its own
    worker._parse_ahead(service)
    assert [key for key, _text in _yaml._PARSED] == [str(config)]


@pytest.mark.parametrize("plant", ["link", "not a list", "not names", "too long"])
def test_a_note_that_is_not_the_services_own_is_no_note(
        tmp_path: Path, service: worker.Service, plant: str) -> None:
    config = tmp_path / "choir.yaml"
    config.write_text("a: 1\n")
    note = place.folder(service.home) / worker.PARSED
    if plant == "link":
        (tmp_path / "elsewhere").write_text(json.dumps([str(config)]))
        os.symlink(tmp_path / "elsewhere", note)
    elif plant == "not a list":
        note.write_text(json.dumps({"path": str(config)}))
    elif plant == "not names":
        note.write_text(json.dumps([str(config), 7]))
    else:
        note.write_text(json.dumps([str(config)] * (worker.PARSED_BYTES // 8)))
    worker._parse_ahead(service)
    assert _yaml._PARSED == {}
