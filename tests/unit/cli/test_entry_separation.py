"""The CLI's entry separates every command that reads hostile bytes before it runs: only a
command line that shows help (which runs nothing) or launches another process skips it.

The gap this closes: ``-h`` anywhere on the line skipped separation, but ``choir verify
--repo -h`` (a repo folder named ``-h``) or ``--claim -h`` runs the command, in a process
that could read the key folder.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import choir.cli as entry


@pytest.fixture
def separations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    made: list[bool] = []
    monkeypatch.setattr(entry, "_separate_now", lambda make_key=True: made.append(make_key))
    monkeypatch.setattr(entry, "_deferred", False)
    yield made


@pytest.mark.parametrize("args", [
    ["gate", "item", "--repo", "-h"],
    ["audit", "--export-head", "--help"],
    ["audit", "--", "-h"],
])
def test_a_help_word_that_is_a_value_still_separates(separations: list[bool],
                                                     args: list[str]) -> None:
    entry._separate(args)
    assert separations == [True], args


@pytest.mark.parametrize("args", [
    ["verify", "--repo", "-h"], ["verify", "--claim", "--help"], ["run", "--", "-h"],
    ["run", "--run-id", "-h", "item.yaml"],
])
def test_a_served_command_with_a_help_word_as_a_value_is_deferred_to_separate(
        separations: list[bool], args: list[str]) -> None:
    """``verify`` and ``run`` separate once they know they run here, cold (``_warm``)."""
    entry._separate(args)
    assert entry._deferred and not separations, args


@pytest.mark.parametrize("args", [
    ["verify", "--help"], ["verify", "-h"], ["verify", "--mood", "CALM", "-h"],
    ["run", "item.yaml", "--help"], ["audit", "-h"], ["attest", "--help"], ["--help"],
    ["serve", "--detach"], ["serve", "--stop"],
])
def test_help_and_launchers_run_nothing_and_skip_it(separations: list[bool],
                                                    args: list[str]) -> None:
    entry._separate(args)
    assert not separations and not entry._deferred, args


def test_a_command_line_click_refuses_is_not_help() -> None:
    assert not entry._shows_help(["no-such-command", "-h"])
