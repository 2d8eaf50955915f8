"""A configuration file is parsed once per text: the warm service's worker reads the same
choir.yaml for every request (``choir.config._yaml._PARSED``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from choir.config import _yaml
from choir.config._yaml import load_yaml
from choir.exceptions import ConfigError


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_yaml, "_PARSED", {})


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = _yaml._parse

    def counting(path: Path, text: str) -> _yaml.YamlDoc:
        parsed.append(text)
        return real(path, text)

    monkeypatch.setattr(_yaml, "_parse", counting)
    return parsed


def test_the_same_bytes_are_parsed_once_and_each_caller_gets_its_own_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _count_parses(monkeypatch)
    path = tmp_path / "choir.yaml"
    path.write_text("verifiers:\n  unit: {uses: pytest}\nmoods:\n  CALM: {verifiers: [unit]}\n")
    first = load_yaml(path, root=tmp_path)
    first.data["verifiers"]["unit"]["uses"] = "changed by a caller"
    second = load_yaml(path, root=tmp_path)
    assert len(parsed) == 1
    assert second.data["verifiers"]["unit"] == {"uses": "pytest"}
    assert second.line_of(("moods", "CALM")) == 4


def test_edited_bytes_are_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _count_parses(monkeypatch)
    path = tmp_path / "choir.yaml"
    path.write_text("a: 1\n")
    assert load_yaml(path).data == {"a": 1}
    path.write_text("a: 2\n")  # same size, same second: the text is the key, not the stat
    assert load_yaml(path).data == {"a": 2}
    assert len(parsed) == 2


def test_a_file_that_failed_fails_again_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "choir.yaml"
    path.write_text("a: 1\nb: [unclosed\n")
    for _ in range(2):
        with pytest.raises(ConfigError) as exc:
            load_yaml(path)
        assert exc.value.line is not None
    assert _yaml._PARSED == {}


def test_the_memo_is_bounded(tmp_path: Path) -> None:
    for i in range(_yaml._PARSED_MAX + 5):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(f"a: {i}\n")
        load_yaml(path)
    big = tmp_path / "big.yaml"
    big.write_text("a: '" + "x" * (_yaml._PARSED_MAX_CHARS + 1) + "'\n")
    load_yaml(big)
    assert len(_yaml._PARSED) == _yaml._PARSED_MAX
    assert all(len(text) <= _yaml._PARSED_MAX_CHARS for _, text in _yaml._PARSED)


def test_a_file_parsed_ahead_is_found_parsed_and_an_edit_is_parsed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm service's idle worker parses the files its last requests read
    (``parse_ahead``); a request reads the file again and finds the parse only for the
    same text."""
    parsed = _count_parses(monkeypatch)
    path = tmp_path / "choir.yaml"
    path.write_text("a: 1\n")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    broken = tmp_path / "broken.yaml"
    broken.write_text("b: [unclosed\n")
    _yaml.parse_ahead([str(tmp_path / "gone.yaml"), str(fifo), str(broken), str(path)])
    assert [key[0] for key in _yaml._PARSED] == [str(path)]  # the others said nothing
    assert load_yaml(path, root=tmp_path).data == {"a": 1}
    assert parsed == ["b: [unclosed\n", "a: 1\n"]  # no second parse of the same text
    path.write_text("a: 2\n")
    assert load_yaml(path, root=tmp_path).data == {"a": 2}
    assert parsed[-1] == "a: 2\n"


def test_a_file_grown_past_what_the_memo_keeps_is_not_parsed_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The note names files a request read; an executor may grow one since (ruamel took
    32 s over 1 MiB of hostile YAML, the next request waiting): ``parse_ahead`` parses only
    what the memo would keep, and begins none after its time."""
    parsed = _count_parses(monkeypatch)
    big = tmp_path / "big.yaml"
    big.write_text("a: '" + "x" * _yaml._PARSED_MAX_CHARS + "'\n")
    small = tmp_path / "small.yaml"
    small.write_text("a: 1\n")
    _yaml.parse_ahead([str(big), str(small)])
    assert parsed == ["a: 1\n"]
    monkeypatch.setattr(_yaml, "AHEAD_S", -1.0)
    small.write_text("a: 2\n")
    _yaml.parse_ahead([str(small)])
    assert parsed == ["a: 1\n"]
