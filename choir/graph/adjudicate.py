"""The adjudicate node: the round's evidence into the AHDB (through the rules), then the move.

Every AHDB write is keyed by run, work item, round and kind, so a node replayed after a
``kill -9`` appends nothing twice. Moves:

- done: PROPOSE, PROMOTE (PASS attestations of every voting run) and ASSERT; then the next
  part of a split work item, the parent's final verification, the approval gate, or the end;
- retry: HYPOTHESIZE with a discriminating test, bounded reports to the executor;
- nested / broaden: more green threads on the same tree, no execution;
- split: the work item becomes parts (``choir.director.split``), each run in turn; a part
  may split again down to the policy's ``split_depth``, all within the one attempt budget;
  a plan item's run (``hand_back``) ends instead, status ``split``, its parts for the plan;
- escalate: what would halt goes to the work item's ``escalate_to``: a stronger executor
  (for what is left of the budget) or a person (the approval interrupt, evidence attached);
- halt: the run ends, with the reason; a part that halts halts the run.

The attempt budget is the run's, not a work item's: ``spent`` counts every executor run of
the work item and of everything split from it, against its ``max_attempts``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from langgraph.types import Command, Overwrite

from choir._core.failpoints import failpoint
from choir.ahdb import AHDB, open_ahdb
from choir.ahdb.store import done_text
from choir.director import RANK, Decision, adjudicate, signatures, verdicts
from choir.director.hypothesis import derive
from choir.director.split import part_feedback, split_parts
from choir.evidence.spec import refusal_summary
from choir.evidence.target import resolve_target
from choir.graph.state import RunState, budget_left
from choir.models import (
    AtomKind,
    AtomStatus,
    Counts,
    ExecutorSpec,
    Mood,
    ParentFrame,
    Result,
    VerificationReport,
    VerifierKind,
    WorkItem,
)
from choir.models.report import SUMMARY_MAX
from choir.telemetry import end

Goto = Literal["execute", "direct", "approve", "__end__"]


def assert_done(db: AHDB, state: RunState, required: list[str], key: str) -> str:
    """Propose, promote and ASSERT the work item on the round's tree (keyed: written once
    however often the node runs again); the ASSERT's id."""
    item = state["work_item"]
    minted = state.get("attestations", {})
    tree = state["target"].tree_hash
    commit = state["target"].commit_sha
    voting = [r for r in state.get("runs", []) if not r.diagnostic
              and r.report.result is Result.PASS and r.run_id in minted]
    if db.is_asserted(item.id, tree) is None:
        claim = db.propose(claim=f"{item.id}: {item.goal}"[:900], work_item=item.id,
                           tree_hash=tree, commit_sha=commit,
                           required_verifiers=required, key=f"{key}/claim")
        claim = db.promote(claim.id, [minted[r.run_id] for r in voting])
        db.assert_work_item(item.id, tree, references=[claim.id], claim=done_text(item.id),
                            commit_sha=commit, key=f"{key}/assert")
    asserted = db.is_asserted(item.id, tree)
    return asserted.id if asserted else ""


def _record(db: AHDB, state: RunState, decision: Decision, results: dict[str, Result],
            key: str, *, held: bool = False) -> str:
    """Write the round's atoms; returns the ASSERT id when the work item is done. ``held``:
    it is done but a person must approve first (``approve`` writes its ASSERT then)."""
    item = state["work_item"]
    runs = state.get("runs", [])
    minted = state.get("attestations", {})
    tree = state["target"].tree_hash
    blind_spots, disclosed = _disclosures(state, results)
    if blind_spots:
        db.hyperthesis(item.id, tree, claim="; ".join(blind_spots)[:1000],
                       attestation_ids=disclosed, key=f"{key}/hyperthesis")
    if decision.action == "done":
        if held:
            return ""
        return assert_done(db, state, sorted({*item.required_verifiers, *results}), key)
    failing = [r for r in runs if r.report.result is Result.FAIL and r.run_id in minted
               and not r.diagnostic]
    if failing and decision.action in ("retry", "split", "halt", "escalate"):
        hypothesis = derive(item, runs, results, state["config"].verifiers,
                            changed_files(Path(item.repo), state["target"].commit_sha))
        if hypothesis is not None:
            said = hypothesis.claim if decision.action != "escalate" else \
                f"{decision.reason[:400]}; {hypothesis.claim}"
            db.hypothesize(item.id, tree, claim=said,
                           discriminating_test=hypothesis.discriminating_test,
                           key=f"{key}/hypothesize",
                           attestation_ids=[minted[r.run_id] for r in failing])
    if failing:  # whatever the move, an attested FAIL demotes the claims it contradicts
        db.demote_failed(item.id, tree, [minted[r.run_id] for r in failing])
    return ""


def resolve_hypotheses(db: AHDB, state: RunState) -> list[str]:
    """Mark this work item's open hypotheses that this round's PASSes settle (the rules
    decide which: ``choir.ahdb.rules.resolution``); returns one event line each."""
    minted = state.get("attestations", {})
    passed = {r.verifier: minted[r.run_id] for r in state.get("runs", [])
              if r.report.result is Result.PASS and not r.diagnostic and r.run_id in minted}
    lines = []
    for atom in db.atoms(state["work_item"].id, AtomKind.HYPOTHESIZE):
        if atom.status is not AtomStatus.PROPOSED:
            continue
        explained = {db.attestation(a).body.verifier for a in atom.attestations}
        hit = next((passed[v] for v in sorted(explained) if v in passed), None)
        if hit is None:
            continue
        done = db.resolve_hypothesis(atom.id, hit)
        verdict = "confirmed" if done.status is AtomStatus.PROMOTED else "refuted"
        lines.append(f"hypothesis {atom.id[:12]} {verdict} by a PASS of "
                     f"{db.attestation(hit).body.verifier}")
    return lines


def changed_files(repo: Path, commit: str | None, limit: int = 50) -> list[str] | None:
    """The files the attempt changed against the commit the tree sits on (tracked files whose
    bytes differ, and new files), at most ``limit``; None when git cannot say.

    The repo is the executor's, so git never looks at the working tree here: ``git diff``
    would run the clean filter and fsmonitor a planted ``.gitattributes`` or config names,
    as Choir. The commit's blobs come from the hardened object reader, the working files are
    opened without following links and hashed as git would, and new files come from
    ``ls-files --others``, which reads no file content.
    """
    import hashlib

    from choir._core import fsopen
    from choir.evidence.git import locate
    from choir.exceptions import IntegrityError, UserError

    try:
        found = locate(repo)
        head = found.rev(commit or "HEAD") if found is not None else None
        if found is None or head is None:
            return None
        with found.objects() as reader:
            listed = list(reader.files(reader.commit_tree(head)))
    except (UserError, IntegrityError, OSError, ValueError):
        return None
    changed: list[str] = []
    with fsopen.DirCursor(repo) as cursor:
        for rel, _kind, oid in listed:
            if len(changed) >= limit:
                break
            parts = fsopen.split(rel)
            try:
                fd, st = fsopen.open_regular(parts[-1], cursor.dir(parts[:-1]))
            except OSError:
                changed.append(rel)  # deleted, or now a link or a folder
                continue
            with open(fd, "rb", closefd=True) as fh:
                hasher = hashlib.sha256() if len(oid) == 64 else hashlib.sha1()  # noqa: S324
                hasher.update(f"blob {st.st_size}\0".encode())
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    hasher.update(chunk)
            if hasher.hexdigest() != oid:
                changed.append(rel)
    new = found.run("ls-files", "-z", "--others", "--exclude-standard") or b""
    names = [*changed, *(n for n in new.decode(errors="replace").split("\0") if n)]
    return [n for n in dict.fromkeys(names) if n.isprintable() and not n.startswith(".choir")][
        :limit]


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
    """A part is ASSERTed: start the next part, or verify the parent on the final tree (the
    parent may itself be a part: its siblings and its own parent come back with it)."""

    done = state["work_item"].id
    parts = list(state.get("parts", []))
    frame = state.get("parent")
    assert frame is not None
    reached = Mood(base["mood"])  # no part takes the run below the mood it reached (17e)

    def climbed(mood: Mood) -> Mood:
        return max(mood, reached, key=RANK.__getitem__)

    spent, ceiling = budget_left(state)
    if parts and spent >= ceiling:  # a part took the attempts the next one needed
        root = frame.root
        return Command(goto="__end__", update={
            **base, "work_item": root.item, "attempt": root.attempt, "parent": None,
            "parts": [], "status": "halted",
            "reason": f"part {done} ASSERTed, but the attempt budget is spent "
                      f"({spent}/{ceiling}) before {parts[0].id} could run"})
    if parts:
        part = parts[0]
        return Command(goto="execute", update={
            **base, "work_item": part, "parts": parts[1:], "attempt": 0, "history": [],
            "mood": climbed(part.mood).value,
            "feedback": part_feedback(part, frame.reports),
            "status": "running",
            "events": [*base["events"], f"part {done} ASSERTed; next: {part.id}"]})
    from choir.graph.orchestrator import judge_spec

    target = resolve_target(Path(frame.item.repo), frame.item.id)
    return Command(goto="direct", update={
        **base, "work_item": frame.item, "parent": frame.parent, "parts": list(frame.parts),
        "attempt": frame.attempt,
        "spec_change": judge_spec({**state, "work_item": frame.item,
                                   "mood": climbed(frame.mood).value}, target),
        "mood": climbed(frame.mood).value, "history": [list(h) for h in frame.history],
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


def escalation_target(item: WorkItem, state: RunState) -> ExecutorSpec | str | None:
    """Who takes ``item`` when the loop cannot satisfy it: its own ``escalate_to`` (a part
    inherits its parent's), else the policy's; an executor only once per run."""
    target = item.escalate_to or state["policy"].escalate_to
    if isinstance(target, ExecutorSpec) and state.get("escalated"):
        return state["policy"].escalate_to
    return target


def escalate(decision: Decision, item: WorkItem, state: RunState) -> Decision:
    """A halt the evidence explains becomes an escalation when someone can take the item.

    A stronger executor only while budget is left (it draws on the same ``max_attempts``);
    a person always (the approval interrupt). An empty plan is a configuration fault: it
    halts, nobody can fix it by trying harder.
    """
    if decision.action != "halt" or decision.reason.startswith("nothing was verified"):
        return decision
    target = escalation_target(item, state)
    spent, ceiling = budget_left(state)
    if isinstance(target, ExecutorSpec) and spent < ceiling:
        who = f"executor {target.kind}" + (f" (model {target.model})" if target.model else "")
        return Decision("escalate", decision.mood, f"{decision.reason}; escalated to {who} "
                        f"for the {ceiling - spent} attempt(s) left")
    if target == "human":
        return Decision("escalate", decision.mood, f"{decision.reason}; escalated to a person "
                        "(choir approve RUN_ID [--reject]) with the evidence attached")
    return decision


def _escalation(state: RunState, decision: Decision, base: dict[str, Any],
                item: WorkItem, reports: list[Any]) -> Command[Goto]:
    target = escalation_target(item, state)
    if isinstance(target, ExecutorSpec):
        stronger = item.model_copy(update={"executor": target})
        return Command(goto="execute", update={
            **base, "work_item": stronger, "escalated": True, "history": [],
            "status": "running", "feedback": reports,
            "events": [*base["events"], f"escalated {item.id} to executor {target.kind}"
                       + (f" (model {target.model})" if target.model else "")]})
    evidence = [f"{r.verifier}: {r.result.value}: {r.summary}"[:300] for r in reports[:12]]
    return Command(goto="approve", update={
        **base, "status": "awaiting_approval",
        "escalation": {"work_item": item.id, "reason": decision.reason, "evidence": evidence,
                       "tree": state["target"].tree_hash},
        "events": [*base["events"], f"escalated {item.id} to a person: {decision.reason}"]})


async def adjudicate_node(state: RunState) -> Command[Goto]:
    item: WorkItem = state["work_item"]
    config, policy = state["config"], state["policy"]
    mood = Mood(state["mood"])
    runs = state.get("runs", [])
    results = verdicts(runs, policy.moods[mood].reruns)
    spent, ceiling = budget_left(state)
    frame = state.get("parent")
    depth = frame.depth if frame is not None else 0
    parts = split_parts(item, runs, results, config.verifiers, ceiling - spent) \
        if depth < policy.split_depth else []
    db = open_ahdb()
    contradicted = db.failed_verifiers(item.id, state["target"].tree_hash)
    ran = {r.verifier for r in runs}
    owed = [] if mood is not Mood.BOLD or item.split_of is not None else \
        [n for n in policy.moods[mood].broaden if n not in ran]
    decision = adjudicate(runs, policy=policy, mood=mood, attempt=spent, max_attempts=ceiling,
                          history=state.get("history", []),
                          nested_done=state.get("nested", 0), can_split=len(parts) >= 2,
                          broaden=owed, contradicted=contradicted,
                          switches=state.get("switches", 0))
    from choir.postconditions.drift import apply_policy, drift_events, record_drift

    this_round = f"{state['run_id']}-r{state.get('round', 0)}-"
    drift = drift_events([r for r in runs if r.run_id.startswith(this_round)],
                         state.get("attestations", {}),
                         {n for n, s in config.verifiers.items()
                          if s.kind is VerifierKind.POSTCONDITION})
    decision = apply_policy(decision, drift, config.decisions.get(item.decision_type or ""))
    refusal = spec_refusal(state)
    if refusal is not None and decision.action in ("done", "nested", "broaden"):
        again = spent < ceiling  # the run's one budget, as for any retry
        decision = Decision(action="retry" if again else "halt", mood=decision.mood,
                            reason=refusal.summary)
    decision = escalate(decision, item, state)
    if RANK[decision.mood] < RANK[mood]:  # no rule may lower the run's mood (review 17b, F3)
        decision = replace(decision, mood=mood)
    parts = [p.model_copy(update={"mood": decision.mood}) for p in parts]
    round_no = state.get("round", 0) + 1
    key = f"{state['run_id']}/{item.id}/{round_no}"
    record_drift(db, drift, work_item=item.id, tree_hash=state["target"].tree_hash, key=key)
    resolved = resolve_hypotheses(db, state)  # earlier rounds' hypotheses, before this one's
    # above the approval radius nothing is ASSERTed before a person approves: the gate and
    # promotion read the log, so an ASSERT written before the question answered for the
    # tree while it waited, and after a rejection (review 17, F1)
    held = decision.action == "done" and item.split_of is None and \
        policy.needs_approval(item.blast_radius)
    asserted = _record(db, state, decision, results, key, held=held)
    failpoint("adjudicate:written")
    end(f"{state['run_id']}-r{state.get('round', 0)}", {
        "choir.action": decision.action, "choir.verifiers": len(results)})
    floor = list(state.get("floor", []))
    if mood is Mood.BOLD and decision.mood is not Mood.BOLD:
        # what BOLD owed once the core is green stays owed: a climb (the same failure again,
        # which the executor chooses) skipped BOLD's scans and mutants (review 17b, F5)
        floor = list(dict.fromkeys([*floor, *policy.moods[Mood.BOLD].broaden]))
    base: dict[str, Any] = {"mood": decision.mood.value, "reason": decision.reason,
                            "round": round_no, "floor": floor,
                            "switches": state.get("switches", 0) + (decision.mood is not mood)}
    event = f"round {round_no} ({item.id}): {decision.action} ({decision.reason})"
    if decision.mood is not mood:
        event += f"; mood {mood.value} -> {decision.mood.value}"
    base["events"] = [event, *(d.line() for d in drift), *resolved]
    if decision.action == "done":
        if item.split_of is not None:
            return _next_part(state, base)
        update = {**base, "status": "asserted", "asserted": asserted}
        if held:
            return Command(update={**update, "status": "awaiting_approval", "held": {
                "key": key, "required": sorted({*item.required_verifiers, *results})}},
                goto="approve")
        return Command(update=update, goto="__end__")
    if decision.action in ("nested", "broaden"):
        return Command(goto="direct", update={
            **base, "round_kind": decision.action,
            "nested": state.get("nested", 0) + (decision.action == "nested")})
    history = [*state.get("history", []), signatures(runs)]
    reports = [r.report for r in runs]
    if decision.action == "split" and state.get("hand_back") and frame is None:
        return Command(goto="__end__", update={
            **base, "parts": parts, "history": history, "feedback": reports,
            "status": "split",
            "events": [*base["events"], f"split {item.id} into {', '.join(p.id for p in parts)}"
                       f", handed back to the plan (budget {spent}/{ceiling} spent)"]})
    if decision.action == "split":
        saved = ParentFrame(item=item, attempt=state["attempt"], mood=decision.mood,
                            history=tuple(tuple(h) for h in history), reports=tuple(reports),
                            floor=tuple(floor), parts=tuple(state.get("parts", [])),
                            parent=frame)
        return Command(goto="execute", update={
            **base, "work_item": parts[0], "parts": parts[1:], "parent": saved,
            "attempt": 0, "history": [], "status": "running",
            "feedback": part_feedback(parts[0], reports),
            "events": [*base["events"], f"split {item.id} into {', '.join(p.id for p in parts)}"
                       f" (depth {saved.depth}/{policy.split_depth}; budget {spent}/{ceiling} "
                       "spent)"]})
    if refusal is not None:
        reports.append(refusal)
    if decision.action == "retry":
        return Command(goto="execute", update={**base, "history": history, "status": "running",
                                               "feedback": reports})
    if decision.action == "escalate":
        return _escalation(state, decision, {**base, "history": history}, item, reports)
    reason = decision.reason if item.split_of is None else \
        f"part {item.id} could not be satisfied: {decision.reason}"
    if frame is not None:  # report the run as the parent's
        root = frame.root
        base.update(work_item=root.item, attempt=root.attempt, parent=None, parts=[])
    return Command(update={**base, "reason": reason, "history": history, "status": "halted"},
                   goto="__end__")
