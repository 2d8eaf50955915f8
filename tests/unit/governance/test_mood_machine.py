"""The mood state machine in docs/concepts.md is what the Director does: every mood x every
outcome, and every path through the table climbs (no SKEPTICAL -> CURIOUS -> SKEPTICAL)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from choir.config.policy import Policy
from choir.director import RANK, Decision, adjudicate
from choir.models import Mood, Result
from tests.unit.director.test_director_adjudicate import vrun

DOC = Path(__file__).resolve().parents[3] / "docs" / "concepts.md"
OUTCOMES = ("pass", "unsettled", "new failure", "same failure",
            "same failure, halt_after, divides", "same failure, halt_after, does not divide",
            "budget spent")


def table() -> dict[Mood, dict[str, tuple[str, Mood]]]:
    text = DOC.read_text()
    body = text.split("<!-- mood-machine -->")[1].split("<!-- /mood-machine -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in body.strip().splitlines()]
    header, rows = rows[0], rows[2:]
    assert tuple(header[1:]) == OUTCOMES
    out: dict[Mood, dict[str, tuple[str, Mood]]] = {}
    for row in rows:
        mood = Mood(row[0])
        cells = {}
        for outcome, cell in zip(OUTCOMES, row[1:], strict=True):
            m = re.fullmatch(r"(\w+)(?: → (\w+))?", cell)
            assert m, cell
            cells[outcome] = (m[1], Mood(m[2]) if m[2] else mood)
        out[mood] = cells
    assert set(out) == set(Mood)
    return out


def decide(policy: Policy, mood: Mood, outcome: str) -> Decision:
    fail = [vrun("unit", Result.FAIL, tests=("t::a",), replica=r)
            for r in range(policy.moods[mood].reruns)]
    same = [["unit:t::a"]]
    args = {"attempt": 1, "max_attempts": 9, "history": [], "nested_done": 0,
            "can_split": False}
    if outcome == "pass":
        runs = [vrun("unit", Result.PASS, replica=r) for r in range(policy.moods[mood].reruns)]
    elif outcome == "unsettled":
        runs = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1)]
    else:
        runs = fail
        if outcome == "same failure":
            args["history"] = same * (policy.same_signature_limit - 1)
        elif outcome.startswith("same failure, halt_after"):
            args["history"] = same * (policy.halt_after - 1)
            args["can_split"] = outcome.endswith(", divides")
        elif outcome == "budget spent":
            args.update(attempt=9, history=same * (policy.halt_after - 1), can_split=True)
    return adjudicate(runs, policy=policy, mood=mood, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("mood", list(Mood))
@pytest.mark.parametrize("outcome", OUTCOMES)
def test_every_cell_of_the_documented_table_is_what_the_director_does(
        policy: Policy, mood: Mood, outcome: str) -> None:
    action, then = table()[mood][outcome]
    decision = decide(policy, mood, outcome)
    assert (decision.action, decision.mood) == (action, then), decision.reason


def test_every_path_through_the_table_climbs_and_is_bounded(policy: Policy) -> None:
    """Every sequence of outcomes from every mood: a mood once left is never come back to,
    and the number of switches stays within what the ranks allow."""
    cells = table()
    for start in Mood:
        for path in itertools.product(OUTCOMES, repeat=5):
            mood, seen, switches = start, [start], 0
            for outcome in path:
                _, then = cells[mood][outcome]
                if then is not mood:
                    switches += 1
                    assert RANK[then] > RANK[mood] and then not in seen, (start, path)
                    seen.append(then)
                mood = then
            assert switches <= 2


def test_switches_stop_at_the_policys_bound(policy: Policy) -> None:
    runs = [vrun("unit", Result.FAIL, tests=("t::a",))]
    decision = adjudicate(runs, policy=policy, mood=Mood.CALM, attempt=1, max_attempts=9,
                          history=[["unit:t::a"]], nested_done=0,
                          switches=policy.max_mood_switches)
    assert (decision.action, decision.mood) == ("retry", Mood.CALM)


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    from tests.unit.director.test_director_adjudicate import policy as make

    return make.__wrapped__(tmp_path)  # type: ignore[attr-defined]
