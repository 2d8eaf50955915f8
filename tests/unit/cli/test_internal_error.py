"""A crash of Choir's own is never read as a verdict (review 17d)."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.cli._errors import EXIT_INCONCLUSIVE, exit_code


def test_an_unexpected_exception_exits_4_with_its_traceback(
        choir_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tool answer the context store could not save crashed ``choir run`` with a raw
    traceback and exit 1, which the CLI uses for "halted": a script took a Choir fault for
    failed work. Nothing was decided: exit 4 (INCONCLUSIVE), the traceback, what to do."""
    def crash() -> int:
        raise RuntimeError("a bug")

    assert exit_code(crash) == EXIT_INCONCLUSIVE == 4
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug" in err
    assert "choir: internal error: RuntimeError: a bug; nothing was decided" in err
