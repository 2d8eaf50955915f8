"""The adjudicate node: the round's evidence into the AHDB (through the rules), then the move.

Every AHDB write is keyed by run, work item, round and kind, so a node replayed after a
``kill -9`` appends nothing twice. Moves:

- done: PROPOSE, PROMOTE (PASS attestations of every voting run) and ASSERT; then the next
  part of a split work item, the parent's final verification, the approval gate, or the end;
- retry: HYPOTHESIZE with a discriminating test, bounded reports to the executor;
- nested / broaden: more green threads on the same tree, no execution;
- split: the work item becomes parts (``choir.director.split``), each run in turn;
- halt: the run ends, with the reason; a part that halts halts the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from langgraph.types import Command, Overwrite

from choir._core.failpoints import failpoint
from choir.ahdb import AHDB, open_ahdb
from choir.director import Decision, adjudicate, signatures, verdicts
from choir.director.split import part_feedback, split_parts
from choir.evidence.spec import refusal_summary
from choir.evidence.target import resolve_target
from choir.graph.state import RunState
from choir.models import Counts, Mood, ParentFrame, Result, VerificationReport, WorkItem
from choir.models.report import SUMMARY_MAX

Goto = Literal["execute", "direct", "approve", "__end__"]


def _record(db: AHDB, state: RunState, decision: Decision, results: dict[str, Result],
            key: str) -> str:
    """Write the round's atoms; returns the ASSERT id when the work item is done."""
    item = state["work_item"]
    runs = state.get("runs", [])
    minted = state.get("attestations", {})
    tree = state["target"].tree_hash
    commit = state["target"].commit_sha
    blind_spots, disclosed = _disclosures(state, results)
    if blind_spots:
        db.hyperthesis(item.id, tree, claim="; ".join(blind_spots)[:1000],
                       attestation_ids=disclosed, key=f"{key}/hyperthesis")
    if decision.action == "done":
        voting = [r for r in runs if not r.diagnostic and r.report.result is Result.PASS
                  and r.run_id in minted]
        required = sorted({*item.required_verifiers, *results})
        if db.is_asserted(item.id, tree) is None:
            claim = db.propose(claim=f"{item.id}: {item.goal}"[:900], work_item=item.id,
                               tree_hash=tree, commit_sha=commit,
                               required_verifiers=required, key=f"{key}/claim")
            claim = db.promote(claim.id, [minted[r.run_id] for r in voting])
            db.assert_work_item(item.id, tree, references=[claim.id], claim=f"{item.id} done",
                                commit_sha=commit, key=f"{key}/assert")
        asserted = db.is_asserted(item.id, tree)
        return asserted.id if asserted else ""
    failing = [r for r in runs if r.report.result is Result.FAIL and r.run_id in minted
               and not r.diagnostic]
    if failing and decision.action in ("retry", "split", "halt"):
        first = next((s for r in failing for s in r.report.failure_signatures), None)
        test = (f"rerun {first.test_id or first.kind}; it must pass" if first
                else "rerun the failing step; it must exit 0")
        if results.get(failing[0].verifier) is Result.FLAKY:
            test = f"rerun {failing[0].verifier} in clean sandboxes: it must pass every time"
        db.hypothesize(item.id, tree, claim=f"the change does not yet meet: {item.goal}"[:900],
                       discriminating_test=test, key=f"{key}/hypothesize",
                       attestation_ids=[minted[r.run_id] for r in failing])
    if failing:  # whatever the move, an attested FAIL demotes the claims it contradicts
        db.demote_failed(item.id, tree, [minted[r.run_id] for r in failing])
    return ""


def _disclosures(state: RunState, results: dict[str, Result]) -> tuple[list[str], list[str]]:
    """This round's blind spots (docs/concepts.md) and the attestations that show them.

    Named: every verifier whose verdict is FLAKY or INCONCLUSIVE, every run that was itself
    (a crashed green thread has no attestation, so its name is the only trace), every run
    over a subset of the tests, and the blind spots the reports name. A HYPERTHESIS is a
    disclosure: it is admissible, and it authorises nothing.
    """
    minted = state.get("attestations", {})
    this_round = f"{state['run_id']}-r{state.get('round', 0)}-"
    runs = [r for r in state.get("runs", []) if r.run_id.startswith(this_round)]
    unsettled = (Result.FLAKY, Result.INCONCLUSIVE)
    spots: list[str] = []
    shown: list[str] = []
    for run in runs:
        verdict = results.get(run.verifier)
        why = []
        if run.report.verifier_type == "crashed":
            why.append("its green thread crashed")
        elif run.report.result in unsettled:
            why.append(f"the run was {run.report.result.value}")
        if verdict in unsettled and not run.diagnostic:
            why.append(f"the verdict is {verdict.value}")
        if run.tests:
            why.append(f"it covered only {len(run.tests)} selected test(s)")
        if not why:
            continue
        spots.append(f"{run.verifier} ({run.lens}): {', '.join(why)}; it rules nothing out")
        spots.extend(f"{run.verifier}: {h}" for h in run.report.hyperthesis)
        if run.run_id in minted:
            shown.append(minted[run.run_id])
    return list(dict.fromkeys(spots)), sorted(set(shown))


def _next_part(state: RunState, base: dict[str, Any]) -> Command[Goto]:
    """A part is ASSERTed: start the next part, or verify the parent on the final tree."""

    done = state["work_item"].id
    parts = list(state.get("parts", []))
    frame = state.get("parent")
    assert frame is not None
    if parts:
        part = parts[0]
        return Command(goto="execute", update={
            **base, "work_item": part, "parts": parts[1:], "attempt": 0, "history": [],
            "mood": part.mood.value, "feedback": part_feedback(part, frame.reports),
            "status": "running",
            "events": [*base["events"], f"part {done} ASSERTed; next: {part.id}"]})
    from choir.graph.orchestrator import judge_spec

    target = resolve_target(Path(frame.item.repo), frame.item.id)
    return Command(goto="direct", update={
        **base, "work_item": frame.item, "parent": None, "parts": [], "attempt": frame.attempt,
        "spec_change": judge_spec({**state, "work_item": frame.item, "mood": frame.mood.value},
                                  target),
        "mood": frame.mood.value, "history": [list(h) for h in frame.history],
        "floor": list(frame.floor), "feedback": list(frame.reports),
        "round_kind": "primary", "nested": 0, "runs": Overwrite([]), "attestations": {},
        "target": target, "status": "running",
        "events": [*base["events"],
                   f"part {done} ASSERTed; every part done: verifying {frame.item.id} whole"]})


def spec_refusal(state: RunState) -> VerificationReport | None:
    """A report for the executor when this tree's spec change is refused: never ASSERTed,
    whatever the verifiers said (they ran the pinned checks, not the executor's)."""
    change = state.get("spec_change")
    target = state["target"]
    if state.get("spec") and (change is None or change.tree_hash != target.tree_hash):
        summary = "spec: no judgement of this tree against the pinned spec; refused"
    elif change is not None and change.refused:
        summary = f"spec change refused: {refusal_summary(change)}"[:SUMMARY_MAX]
    else:
        return None
    return VerificationReport(
        verifier="spec", verifier_type="spec", target=target, result=Result.FAIL,
        summary=summary, confidence=1.0, counts=Counts(),
        next_actions=("Restore the pinned tests, configuration and verifiers; change the code "
                      "under test instead (a work item declares may_change_spec for new "
                      "tests).",))


async def adjudicate_node(state: RunState) -> Command[Goto]:
    item: WorkItem = state["work_item"]
    config, policy = state["config"], state["policy"]
    mood = Mood(state["mood"])
    runs = state.get("runs", [])
    results = verdicts(runs, policy.moods[mood].reruns)
    parts = [] if state.get("split_done") else split_parts(item, runs, results,
                                                           config.verifiers, state["attempt"])
    db = open_ahdb()
    contradicted = db.failed_verifiers(item.id, state["target"].tree_hash)
    ran = {r.verifier for r in runs}
    owed = [] if mood is not Mood.BOLD or item.split_of is not None else \
        [n for n in policy.moods[mood].broaden if n not in ran]
    decision = adjudicate(runs, policy=policy, mood=mood, attempt=state["attempt"],
                          max_attempts=item.max_attempts, history=state.get("history", []),
                          nested_done=state.get("nested", 0), can_split=len(parts) >= 2,
                          broaden=owed, contradicted=contradicted)
    from choir.postconditions.drift import apply_policy, drift_events, record_drift

    this_round = f"{state['run_id']}-r{state.get('round', 0)}-"
    drift = drift_events([r for r in runs if r.run_id.startswith(this_round)],
                         state.get("attestations", {}))
    decision = apply_policy(decision, drift, config.decisions.get(item.decision_type or ""))
    refusal = spec_refusal(state)
    if refusal is not None and decision.action in ("done", "nested", "broaden"):
        again = state["attempt"] < item.max_attempts
        decision = Decision(action="retry" if again else "halt", mood=decision.mood,
                            reason=refusal.summary)
    parts = [p.model_copy(update={"mood": decision.mood}) for p in parts]
    round_no = state.get("round", 0) + 1
    key = f"{state['run_id']}/{item.id}/{round_no}"
    record_drift(db, drift, work_item=item.id, tree_hash=state["target"].tree_hash, key=key)
    asserted = _record(db, state, decision, results, key)
    failpoint("adjudicate:written")
    base: dict[str, Any] = {"mood": decision.mood.value, "reason": decision.reason,
                            "round": round_no}
    event = f"round {round_no} ({item.id}): {decision.action} ({decision.reason})"
    if decision.mood is not mood:
        event += f"; mood {mood.value} -> {decision.mood.value}"
    base["events"] = [event, *(d.line() for d in drift)]
    if decision.action == "done":
        if item.split_of is not None:
            return _next_part(state, base)
        update = {**base, "status": "asserted", "asserted": asserted}
        if policy.needs_approval(item.blast_radius):
            return Command(update={**update, "status": "awaiting_approval"}, goto="approve")
        return Command(update=update, goto="__end__")
    if decision.action in ("nested", "broaden"):
        return Command(goto="direct", update={
            **base, "round_kind": decision.action,
            "nested": state.get("nested", 0) + (decision.action == "nested")})
    history = [*state.get("history", []), signatures(runs)]
    reports = [r.report for r in runs]
    if decision.action == "split":
        frame = ParentFrame(item=item, attempt=state["attempt"], mood=mood,
                            history=tuple(tuple(h) for h in history), reports=tuple(reports),
                            floor=tuple(state.get("floor", [])))
        return Command(goto="execute", update={
            **base, "work_item": parts[0], "parts": parts[1:], "parent": frame,
            "split_done": True, "attempt": 0, "history": [], "status": "running",
            "feedback": part_feedback(parts[0], reports),
            "events": [*base["events"], f"split {item.id} into {', '.join(p.id for p in parts)}"]})
    if refusal is not None:
        reports.append(refusal)
    if decision.action == "retry":
        return Command(goto="execute", update={**base, "history": history, "status": "running",
                                               "feedback": reports})
    reason = decision.reason if item.split_of is None else \
        f"part {item.id} could not be satisfied: {decision.reason}"
    saved = state.get("parent")
    if saved is not None:  # report the run as the parent's
        base.update(work_item=saved.item, attempt=saved.attempt, parent=None, parts=[])
    return Command(update={**base, "reason": reason, "history": history, "status": "halted"},
                   goto="__end__")
