"""The progress view's lines where stderr is no terminal: written as they are, without rich."""

from __future__ import annotations

import pytest

from choir.cli._progress import PlainConsole, Progress, stderr_console


def test_a_summarys_text_is_written_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    view = Progress(console=PlainConsole(), live=False)
    summary = ":fire: \x1b]52;c;cGF3bmVk\x07[bold]all[/bold] " + "x" * 150
    view("progress", {"kind": "green", "key": "k", "verifier": "unit", "replica": 0,
                      "lens": "default", "state": "done", "seconds": 1.25, "result": "PASS",
                      "summary": summary})
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line: not wrapped at 80 columns
    # the markup and the emoji code are text (rich's plain output made :fire: an emoji);
    # the escape sequence is gone, and the summary shortened as before
    assert err.startswith("  [green] unit#0 PASS in 1.2s: :fire: [bold]all[/bold] xxx")
    assert "\x1b" not in err and "\N{FIRE}" not in err


def test_rich_draws_where_it_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert isinstance(stderr_console(), PlainConsole)  # pytest's captured stderr: no tty
    for var, value in (("FORCE_COLOR", "1"), ("TTY_COMPATIBLE", "1")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            console = stderr_console()
            assert not isinstance(console, PlainConsole) and console.is_terminal
