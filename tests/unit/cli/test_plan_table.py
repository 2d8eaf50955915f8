"""``choir plan run``'s live table and lines show what a member chose as text.

An item's ``last`` quotes paths of the member's worktree (a repository it planted, a
conflicting file): a file named ``[/x]/.git`` was a rich tag that ended the plan, and every
``--resume``, on a terminal (``MarkupError``); one named with an escape sequence set the
terminal's title off one (a review found both).
"""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from choir.cli import plan as plan_cli

HOSTILE = "commit: a repository inside the worktree ([/x]/.git, \x1b]0;PWNED\x07/.git, [bold]b)"


class _Loaded:
    id = "p"
    items = [type("Item", (), {"id": "a", "member": "m"})()]


def test_the_live_table_shows_a_members_text_as_text(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import rich.console

    monkeypatch.setattr(rich.console, "Console",
                        lambda **kw: Console(force_terminal=True, width=200, **kw))

    def drive(update: Any) -> dict[str, Any]:
        update({"item": "a", "member": "m", "state": "failed", "attempt": 1, "last": HOSTILE})
        return {"done": True}

    assert plan_cli._with_table(_Loaded(), drive) == {"done": True}
    shown = capsys.readouterr().out
    assert "[/x]/.git" in shown  # the text, not a tag
    assert "\x1b]0;" not in shown and "\x07" not in shown and "PWNED" not in shown


def test_the_plain_lines_carry_no_escape_sequence(capsys: pytest.CaptureFixture[str]) -> None:
    plan_cli._line({"item": "a\x1b[2J", "member": "m", "state": "failed", "attempt": 1,
                    "last": HOSTILE})
    line = capsys.readouterr().err
    assert "\x1b" not in line and "\x07" not in line and "[/x]/.git" in line


def test_a_line_break_in_a_members_text_starts_no_row(capsys: pytest.CaptureFixture[str]) -> None:
    plan_cli._line({"item": "a", "member": "m", "state": "failed", "attempt": 1,
                    "last": "x\n  b  -  merged   attempt 1  ASSERTed\tok"})
    assert capsys.readouterr().err.count("\n") == 1
