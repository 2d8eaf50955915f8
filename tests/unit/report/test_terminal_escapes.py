"""Log text and file names never drive the user's terminal (issue #11 item 15).

A verifier's output is written by the code under test: it can hold escape sequences (OSC 52
writes the clipboard, CSI 2J clears the screen, OSC 8 makes links) and rich markup. Every
place that renders such text strips control sequences and escapes markup.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from choir.cli._progress import Progress
from choir.exceptions import ConfigError

HOSTILE = ("\x1b]52;c;ZXZpbA==\x07"  # OSC 52: write the clipboard
           "\x1b[2J\x1b[H"  # clear the screen, cursor home
           "\x9b31m"  # 8-bit CSI
           "\x1bP1$r0m\x1b\\"  # DCS string
           "\r\x08\x7f"
           "[link=https://evil.example]click me[/link] [bold red]PASS[/]"
           "\u202eevil")
MARKUP = ("[link=https://evil.example]", "[bold red]PASS[/]")


def _assert_clean(out: str) -> None:
    for bad in ("\x1b]", "\x1b[2J", "\x1b[H", "\x9b", "\x1bP", "\x07", "\r", "\x08", "\x7f",
                "\u202e"):
        assert bad not in out, (bad, out)
    for literal in MARKUP:  # shown as text, not interpreted
        assert literal in out, (literal, out)


def _contract() -> dict[str, object]:
    return {
        "status": "FAIL", "run_id": "r1", "mood": "CALM",
        "tail_log": "line one\n" + HOSTILE + "\nlast line",
        "reports": [{"verifier": "unit", "result": "FAIL", "confidence": 0.95,
                     "summary": "unit: FAIL: " + HOSTILE}],
        "attestations": ["a" * 64],
        "artifact_paths": ["/runs/r1/out/" + HOSTILE + ".xml"],
    }


def test_choir_verify_rendering_strips_escapes_and_markup(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from choir.cli._render import render_verify

    monkeypatch.setenv("FORCE_COLOR", "1")  # render as on a real terminal
    monkeypatch.setenv("COLUMNS", "400")
    render_verify(_contract())
    out = capsys.readouterr().out
    _assert_clean(out)
    assert "line one" in out and "last line" in out and "\x1b[" in out  # rich's own colour


def _progress_console() -> tuple[Progress, io.StringIO]:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=400)
    return Progress(console=console, live=False), buffer


def test_choir_run_progress_lines_and_table_strip_escapes_and_markup() -> None:
    progress, buffer = _progress_console()
    progress("progress", {"kind": "green", "key": "k", "verifier": "unit", "replica": 0,
                          "lens": "default", "state": "running"})
    progress("progress", {"kind": "green", "key": "k", "verifier": "unit", "replica": 0,
                          "lens": "default", "state": "done", "seconds": 1.0,
                          "result": "FAIL", "summary": HOSTILE})
    progress("adjudicate", {"events": ["retry: " + HOSTILE], "mood": "CALM"})
    progress.console.print(progress.render())
    _assert_clean(buffer.getvalue())


def test_config_errors_cannot_carry_escapes_to_the_terminal() -> None:
    err = ConfigError(f"unknown parser '{HOSTILE}'", path="/r/choir.yaml", line=3,
                      hint=f"did you mean '{HOSTILE}'")
    text = str(err)
    for bad in ("\x1b", "\x9b", "\x07", "\r", "\u202e"):
        assert bad not in text
    assert text.startswith("/r/choir.yaml:3: unknown parser") and "fix:" in text


def test_a_stored_excerpt_holds_no_control_sequence() -> None:
    """Rendering strips them, but an excerpt also goes where nothing renders: the executor's
    feedback file and prompt, the Director's and reporter's prompts, MCP answers, CI
    summaries. Only CSI colour codes were dropped when the excerpt was made; an OSC 52 (the
    clipboard), a DCS string, a bidi override reached them (a review's note, failing on the
    old code). The excerpt keeps the text and loses every control."""
    from choir.report.parsers import _excerpt

    out = _excerpt("assert add(2, 3) == 5 " + HOSTILE + " tail")
    for bad in ("\x1b", "\x07", "\x9b", "\r", "\x08", "\x7f", "\u202e"):
        assert bad not in out, (bad, out)
    assert out.startswith("assert add(2, 3) == 5") and "click me" in out
