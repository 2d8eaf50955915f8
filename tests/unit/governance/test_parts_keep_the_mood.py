"""A split's next part and its whole check keep the mood the run reached (review 17e).

``adjudicate_node`` never lowers a run's mood within a work item; a part raised to PARANOID
(a red drift's ``degrade_to: PARANOID``) handed the next part its split mood, and the whole
was verified in the frame's: SKEPTICAL again, without the held-out checks, the trace, the
limits and the mutation checks PARANOID adds.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from choir.graph import adjudicate
from choir.models import Mood, ParentFrame, WorkItem


def test_the_next_part_and_the_whole_keep_the_mood_a_part_reached(tmp_path: Path) -> None:
    whole = WorkItem(id="calc", goal="g", repo=str(tmp_path), max_attempts=6,
                     mood=Mood.SKEPTICAL)
    first, second = (whole.model_copy(update={"id": f"calc~{k}", "split_of": "calc"})
                     for k in (1, 2))
    frame = ParentFrame(item=whole, attempt=3, mood=Mood.SKEPTICAL)
    state = {"work_item": first, "parts": [second], "parent": frame, "mood": "PARANOID",
             "spent": 3, "run_id": "r", "round": 5}
    base = {"mood": "PARANOID", "reason": "every planned verifier passed", "round": 6,
            "floor": [], "switches": 1, "events": []}
    assert adjudicate._next_part(state, base).update["mood"] == "PARANOID"
    last = {**state, "work_item": second, "parts": []}
    with mock.patch.object(adjudicate, "resolve_target", lambda repo, item: mock.Mock()), \
            mock.patch("choir.graph.orchestrator.judge_spec", lambda *a, **k: None):
        assert adjudicate._next_part(last, base).update["mood"] == "PARANOID"
