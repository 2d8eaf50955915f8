"""The orchestrator: execute -> direct -> green threads (Send x N) -> attest -> adjudicate.

Side effects that must not repeat (minting attestations, AHDB writes) happen in nodes before
any interrupt, and are idempotent on replay: a green thread's run id names one run (a
resumed thread reuses a sealed run), attestations are content-addressed, and AHDB atoms are
keyed by run, round and kind. The approval interrupt lives in this parent graph
(resuming an interrupt inside a subgraph is where LangGraph's resume
bugs are; a green thread must never run twice). Progress goes out on LangGraph's custom stream
(``emit``): what the CLI shows live, never part of the state.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Overwrite, Send, interrupt

from choir._core.failpoints import failpoint
from choir.attest import AttestationStore, load_signer
from choir.director import part_plan, plan, verdicts
from choir.director.advisor import suggest
from choir.director.lenses import lens_spec, nested_plan
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.target import target_of
from choir.evidence.tree import ensure_snapshot, remove_snapshot, snapshot, snapshot_root
from choir.exceptions import UserError
from choir.executors import executor_isolation, get_executor
from choir.executors.pinned import pinned_gate
from choir.graph.adjudicate import adjudicate_node
from choir.graph.state import GreenIn, GreenOut, RunState
from choir.models import (
    Counts,
    Mood,
    PlannedVerifier,
    Result,
    Target,
    VerificationReport,
    VerifierKind,
    VerifierPlan,
    VerifierRun,
)
from choir.verification import attest_run, open_sandbox, run_verifier_thread, sandbox_options

_SEMAPHORES: dict[tuple[int, int], asyncio.Semaphore] = {}


def emit(event: dict[str, Any]) -> None:
    """Progress for whoever streams the run (``choir run``'s live view); never state."""
    try:
        get_stream_writer()(event)
    except RuntimeError:  # outside a graph run (a direct call in a test): nobody listens
        pass


def _limiter(n: int) -> asyncio.Semaphore:
    """Bounded parallelism for green threads (policy ``max_parallel``), per event loop."""
    key = (id(asyncio.get_running_loop()), n)
    return _SEMAPHORES.setdefault(key, asyncio.Semaphore(n))


def _crash_report(state: GreenIn, error: BaseException) -> VerifierRun:
    """A crashed green thread becomes INCONCLUSIVE evidence, not a crashed run."""
    planned = state["planned"]
    report = VerificationReport(
        verifier=planned.name, verifier_type="crashed", target=state["target"],
        result=Result.INCONCLUSIVE, summary=f"verifier crashed: {type(error).__name__}: "
                                            f"{str(error)[:200]}",
        next_actions=("Rerun; the verifier itself failed, not the code under test.",),
        confidence=0.0, hyperthesis=("The verifier crashed: nothing was ruled out.",),
        counts=Counts())
    return VerifierRun(verifier=planned.name, run_id=state["run_id"], report=report,
                       report_hash="", manifest_hash="", lens=planned.lens,
                       replica=planned.replica, diagnostic=planned.diagnostic,
                       tests=planned.tests)


async def green_thread(state: GreenIn) -> GreenOut:
    """One verifier in its own sandbox; raw output stays in the artifact store."""
    from choir.distributed import fanout_from_env

    item = state["work_item"]
    planned = state["planned"]
    config, policy = state["config"], state["policy"]
    label = {"kind": "green", "key": state["run_id"], "verifier": planned.name,
             "lens": planned.lens, "replica": planned.replica}
    emit({**label, "state": "queued"})
    async with _limiter(policy.max_parallel):
        emit({**label, "state": "running"})
        started = time.monotonic()
        try:
            if config.verifiers[planned.name].kind is VerifierKind.TRACE:  # in-process
                from choir.trace.step import run_trace_step

                run = await asyncio.to_thread(run_trace_step, planned, state["run_id"],
                                              state["target"], ArtifactStore())
            else:
                sandbox = open_sandbox(config, policy, Mood(state["mood"]))
                fanout = fanout_from_env(sandbox_options(config))  # CHOIR_SCHEDULER: a cluster
                try:
                    from choir.postconditions.context import context_env

                    spec = lens_spec(config.verifiers[planned.name], planned)
                    run, _ = await run_verifier_thread(
                        spec,
                        repo=verified_tree(Path(item.repo), state["target"]),
                        target=state["target"], sandbox=sandbox, store=ArtifactStore(),
                        run_id=state["run_id"], reporter=config.models.reporter,
                        lens=planned.lens, replica=planned.replica,
                        diagnostic=planned.diagnostic, tests=planned.tests,
                        runner=fanout.run_verifier if fanout else None,
                        env=context_env(spec, item, run_id=state["run_id"]))
                finally:
                    sandbox.close()
                    if fanout:
                        fanout.close()
        except Exception as exc:  # noqa: BLE001 - a crash is evidence of nothing
            run = _crash_report(state, exc)
    emit({**label, "state": "done", "result": run.report.result.value,
          "seconds": round(time.monotonic() - started, 2), "summary": run.report.summary[:160]})
    return {"runs": [run]}


def snapshot_round(repo: Path, work_item: str, previous: Target | None) -> Target:
    """Hash the tree the executor left and seal a snapshot of it in the same pass.

    Every green thread of the round (and nested rounds on the same tree) verifies this
    snapshot, never the live folder. The previous round's snapshot is dropped when the tree
    changed: nothing verifies it any more.
    """

    snap = snapshot(repo, snapshot_root())
    if previous is not None and previous.tree_hash != snap.tree_hash:
        remove_snapshot(snapshot_root() / previous.tree_hash)
    return target_of(snap, work_item)


def verified_tree(repo: Path, target: Target) -> Path:
    """The sealed snapshot of ``target``'s tree for a green thread to verify.

    After a crash the snapshot may be gone: the live tree is copied again and used only if it
    still hashes to the recorded tree; otherwise ``IntegrityError`` makes the thread
    INCONCLUSIVE, never a verification of a different tree.
    """

    return ensure_snapshot(repo, target.tree_hash)


def _green_graph() -> Any:
    builder = StateGraph(GreenOut, input_schema=GreenIn, output_schema=GreenOut)
    builder.add_node("verify", green_thread)
    builder.add_edge(START, "verify")
    builder.add_edge("verify", END)
    return builder.compile()


async def execute(state: RunState) -> dict[str, Any]:
    """One executor attempt, sandboxed; a mood that forbids an unsandboxed one refuses it.

    The executor's sandbox (and every process it started) is gone when this returns, so the
    tree the verifiers see cannot change under them. A failing executor is recorded (exit
    code, timed out) and verification still runs: the evidence decides, not the executor.
    """

    item = state["work_item"]
    attempt = state.get("attempt", 0) + 1
    mood = Mood(state["mood"])
    isolation = executor_isolation(item.executor)
    if isolation == "none" and not state["policy"].moods[mood].allow_unsafe_isolation:
        raise UserError(f"mood {mood.value} refuses an unsandboxed executor (work item "
                        f"{item.id}); install bubblewrap, or drop 'sandbox: none' under "
                        "'executor:', or choose another mood")
    emit({"kind": "execute", "work_item": item.id, "attempt": attempt, "state": "running",
          "isolation": isolation})
    run_id = state["run_id"] if item.split_of is None else f"{state['run_id']}-{item.id}"

    with pinned_gate(state["config"], state["policy"], Mood(state["mood"])):
        output = await asyncio.to_thread(get_executor(item.executor.kind), item, attempt,
                                         state.get("feedback", []), run_id=run_id)
    failpoint("execute:done")
    ended = ("timed out" if output.timed_out else
             "done" if output.exit_code is None else f"exited {output.exit_code}")
    emit({"kind": "execute", "work_item": item.id, "attempt": attempt, "state": "done",
          "exit_code": output.exit_code, "timed_out": output.timed_out,
          "isolation": output.isolation, "output": output.artifact})
    target = snapshot_round(Path(item.repo), item.id, state.get("target"))
    return {"attempt": attempt, "target": target, "executor_output": output.artifact,
            "executor_exit": output.exit_code, "executor_timed_out": output.timed_out,
            "executor_isolation": output.isolation,
            "usage": [("executor", u) for u in output.usage], "nested": 0,
            "round_kind": "primary", "runs": Overwrite([]), "attestations": {},
            "events": [f"execute {item.id} attempt {attempt}: executor {ended} "
                       f"(isolation {output.isolation})"]}


async def direct(state: RunState) -> dict[str, Any]:
    """The Director picks this round's green threads (and may ask its model)."""
    item = state["work_item"]
    config, policy = state["config"], state["policy"]
    mood = Mood(state["mood"])
    kind = state.get("round_kind", "primary")
    runs = state.get("runs", [])
    usage: list[Any] = []
    need = policy.moods[mood].reruns
    floor = list(state.get("floor", []))
    if kind == "nested":
        chosen = VerifierPlan(mood=mood, verifiers=tuple(nested_plan(
            verdicts(runs, need), runs, config.verifiers, need)),
            reason=f"nested round {state.get('nested', 0)}: other lenses")
    elif kind == "broaden":
        done = {r.verifier for r in runs}
        chosen = VerifierPlan(mood=mood, reason="BOLD: the core is green, broadening",
                              verifiers=tuple(PlannedVerifier(name=n, replica=r) for n in
                                              policy.moods[mood].broaden if n not in done
                                              for r in range(need)))
    elif item.split_of is not None:
        chosen = part_plan(item, policy, mood, config.verifiers)
    else:
        # the floor: a mood switch may add verifiers, never drop one an earlier round ran
        required = tuple(dict.fromkeys([*item.required_verifiers, *floor]))
        chosen = plan(policy, mood, config.verifiers, required=required)
        if config.models.director:
            advice = await suggest(config.models.director, item, mood=mood,
                                   attempt=state.get("attempt", 1),
                                   planned=[p.name for p in chosen.verifiers if p.replica == 0],
                                   specs=config.verifiers, last=state.get("feedback", []))
            usage.append(("director", advice.usage))
            chosen = plan(policy, mood, config.verifiers, required=required,
                          suggestion=advice.names, reason=advice.reason)
    emit({"kind": "plan", "work_item": item.id, "mood": mood.value, "round_kind": kind,
          "verifiers": [f"{p.name}#{p.replica}" + ("" if p.lens == "default" else f" ({p.lens})")
                        for p in chosen.verifiers],
          "dropped": list(chosen.dropped), "reason": chosen.reason})
    event = f"plan ({kind}): {', '.join(p.name for p in chosen.verifiers) or 'nothing'}"
    if chosen.dropped:
        event += f"; dropped, never run: {', '.join(chosen.dropped)}"
    event += f"; why: {chosen.reason}"
    if kind != "nested" and item.split_of is None:
        floor = list(dict.fromkeys([*floor, *(p.name for p in chosen.verifiers)]))
    return {"plan": chosen, "floor": floor, "usage": usage, "events": [event]}


def fan_out(state: RunState) -> list[Send] | str:
    """One green thread per planned verifier; an empty plan goes straight to judgement."""
    item = state["work_item"]
    round_no = state.get("round", 0)
    sends = [Send("green", GreenIn(
        work_item=item, config=state["config"], policy=state["policy"], planned=pv,
        target=state["target"], mood=state["mood"],
        run_id=f"{state['run_id']}-r{round_no}-{pv.name}-{pv.replica}"))
        for pv in state["plan"].verifiers]
    return sends or "attest"


async def attest(state: RunState) -> dict[str, Any]:
    """Mint an attestation for every run on this tree that has none yet."""

    config, policy = state["config"], state["policy"]
    store, signer, atts = ArtifactStore(), load_signer(), AttestationStore()
    minted = dict(state.get("attestations", {}))
    usage = []
    for run in state.get("runs", []):
        if not run.report_hash or run.run_id in minted:
            continue
        planned = PlannedVerifier(name=run.verifier, lens=run.lens,  # type: ignore[arg-type]
                                  replica=run.replica, tests=run.tests)
        spec = lens_spec(config.verifiers[run.verifier], planned)
        minted[run.run_id] = attest_run(
            run, spec, store=store, signer=signer, attestations=atts, policy_hash=policy.hash,
            mood=state["mood"],
            executor_isolation=state.get("executor_isolation"),  # type: ignore[arg-type]
        ).id
        if run.report.usage.model:
            usage.append(("reporter", run.report.usage))
    failpoint("attest:minted")
    new = len(minted) - len(state.get("attestations", {}))
    events = [f"attested {new}"]
    from choir.verification.session import seal_round

    round_id = f"{state['run_id']}-r{state.get('round', 0)}"
    this_round = [r for r in state.get("runs", []) if r.run_id.startswith(round_id + "-")]
    if seal_round(round_id, this_round, minted, mood=state["mood"]):
        events.append(f"episode sealed: runs/{round_id}/manifest.json")
    return {"attestations": minted, "usage": usage, "events": events}


def approve(state: RunState) -> dict[str, Any]:
    answer = interrupt({"work_item": state["work_item"].id, "asserted": state.get("asserted")})
    ok = bool(answer.get("approved")) if isinstance(answer, dict) else False
    return {"status": "asserted" if ok else "rejected",
            "events": ["approved" if ok else "rejected by a human"]}


def build() -> Any:
    builder = StateGraph(RunState)
    builder.add_node("execute", execute)
    builder.add_node("direct", direct)
    builder.add_node("green", _green_graph())
    builder.add_node("attest", attest)
    builder.add_node("adjudicate", adjudicate_node)
    builder.add_node("approve", approve)
    builder.add_edge(START, "execute")
    builder.add_edge("execute", "direct")
    builder.add_conditional_edges("direct", fan_out, ["green", "attest"])
    builder.add_edge("green", "attest")
    builder.add_edge("attest", "adjudicate")
    builder.add_edge("approve", END)
    return builder
