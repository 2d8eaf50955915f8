"""A resumed run's record: a node the graph runs again after kill -9 adds no event twice.

LangGraph streams a finished task's update while the write that saves it is still being
submitted (``put_writes``, then ``output_writes``), so the trace can hold a green thread's
call and result when the checkpoint does not: the resumed run runs that green thread again
(its sealed verifier run is reused, the same result) and the recorder must not record the
same call a second time (``call id ... is reused``, ``has two results``).
"""

from __future__ import annotations

from pathlib import Path

from choir.attest import load_signer
from choir.models import Result
from choir.trace.record import TraceRecorder, read_trace
from tests.unit.director.test_director_adjudicate import vrun


def test_a_green_thread_recorded_before_a_crash_is_not_recorded_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    signer = load_signer(home)
    run = vrun("unit", Result.PASS).model_copy(update={"run_id": "k-r0-unit-0"})
    first = TraceRecorder("k", home, signer=signer)
    first.emit("run_started", name="wi", data={"work_item": "wi", "mood": "CALM",
                                                "required": []})
    first._commit()
    first.node("green", {"runs": [run]})  # recorded; the checkpoint never saw it: killed
    again = TraceRecorder("k", home, signer=signer)  # the resumed run takes the record up
    again.started(None)
    again.node("green", {"runs": [run]})  # the green thread, run again, reuses its run
    events, _ = read_trace(home / "traces" / "k.jsonl")
    calls = [e.call_id for e in events if e.kind == "tool_call"]
    assert calls == ["k-r0-unit-0"], [(e.kind, e.call_id) for e in events]
    assert [e.kind for e in events].count("tool_result") == 1
