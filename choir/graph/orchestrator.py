"""The orchestrator: execute -> direct -> green threads (Send x N) -> attest -> adjudicate.

Side effects that must not repeat (minting attestations, AHDB writes) happen in nodes before
any interrupt, and are idempotent on replay: attestations are content-addressed, and the
AHDB refuses a second promotion of the same claim. The approval interrupt lives in this
parent graph (PLATFORM.md: subgraph resumes are fragile).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Overwrite, Send, interrupt

from choir.config import load_repo_config
from choir.director import adjudicate, plan, signatures
from choir.graph.state import GreenIn, GreenOut, RunState
from choir.models import (
    Counts,
    Mood,
    Result,
    VerificationReport,
)
from choir.policy import load_policy
from choir.verification import VerifierRun

_SEMAPHORES: dict[tuple[int, int], asyncio.Semaphore] = {}


def _limiter(n: int) -> asyncio.Semaphore:
    """Bounded parallelism for green threads (policy ``max_parallel``), per event loop."""
    key = (id(asyncio.get_running_loop()), n)
    return _SEMAPHORES.setdefault(key, asyncio.Semaphore(n))


def _crash_report(state: GreenIn, error: BaseException) -> VerifierRun:
    """A crashed green thread becomes INCONCLUSIVE evidence, not a crashed run."""
    planned = state["planned"]
    report = VerificationReport(
        verifier=planned.name, verifier_type="crashed", target=state["target"],
        result=Result.INCONCLUSIVE, summary=f"verifier crashed: {type(error).__name__}",
        next_actions=("Rerun; the verifier itself failed, not the code under test.",),
        confidence=0.0, hyperthesis=("The verifier crashed: nothing was ruled out.",),
        counts=Counts())
    return VerifierRun(verifier=planned.name, run_id=state["run_id"], report=report,
                       report_hash="", manifest_hash="", lens=planned.lens,
                       replica=planned.replica)


async def green_thread(state: GreenIn) -> GreenOut:
    """One verifier in its own sandbox; raw output stays in the artifact store."""
    from choir.artifacts import ArtifactStore
    from choir.sandbox import resolve_sandbox
    from choir.verification import run_verifier_thread

    item = state["work_item"]
    config = load_repo_config(Path(item.repo))
    planned = state["planned"]
    async with _limiter(load_policy(config).max_parallel):
        try:
            sandbox = resolve_sandbox(config.sandbox.backend)
            try:
                run, _ = await run_verifier_thread(
                    config.verifiers[planned.name], repo=Path(item.repo),
                    target=state["target"], sandbox=sandbox, store=ArtifactStore(),
                    run_id=state["run_id"], reporter=config.models.reporter,
                    lens=planned.lens, replica=planned.replica)
            finally:
                sandbox.close()
        except Exception as exc:  # noqa: BLE001 - a crash is evidence of nothing
            run = _crash_report(state, exc)
    return {"runs": [run]}


def _green_graph() -> Any:
    builder = StateGraph(GreenOut, input_schema=GreenIn, output_schema=GreenOut)
    builder.add_node("verify", green_thread)
    builder.add_edge(START, "verify")
    builder.add_edge("verify", END)
    return builder.compile()


async def execute(state: RunState) -> dict[str, Any]:
    from choir.executors import get_executor
    from choir.verify import resolve_target

    item = state["work_item"]
    attempt = state.get("attempt", 0) + 1
    output = await asyncio.to_thread(get_executor(item.executor.kind), item, attempt,
                                     state.get("feedback", []), run_id=state["run_id"])
    target = resolve_target(Path(item.repo), item.id)
    return {"attempt": attempt, "target": target, "executor_output": output.artifact,
            "usage": [("executor", u) for u in output.usage], "reruns": 0,
            "runs": Overwrite([]), "events": [f"execute attempt {attempt}"]}


def direct(state: RunState) -> list[Send]:
    item = state["work_item"]
    config = load_repo_config(Path(item.repo))
    policy = load_policy(config)
    mood = Mood(state["mood"])
    chosen = plan(policy, mood, config.verifiers, required=item.required_verifiers)
    round_no = state.get("round", 0)
    return [Send("green", GreenIn(
        work_item=item, planned=pv, target=state["target"],
        run_id=f"{state['run_id']}-r{round_no}-{pv.name}-{pv.replica}"))
        for pv in chosen.verifiers]


async def attest(state: RunState) -> dict[str, Any]:
    from choir.artifacts import ArtifactStore
    from choir.attest import AttestationStore, load_signer
    from choir.verification import attest_run

    item = state["work_item"]
    config = load_repo_config(Path(item.repo))
    policy = load_policy(config)
    store, signer, atts = ArtifactStore(), load_signer(), AttestationStore()
    ids = [attest_run(run, config.verifiers[run.verifier], store=store, signer=signer,
                      attestations=atts, policy_hash=policy.hash, mood=state["mood"]).id
           for run in state.get("runs", []) if run.report_hash]
    return {"attestations": ids, "events": [f"attested {len(ids)}"]}


async def adjudicate_node(
    state: RunState,
) -> Command[Literal["execute", "rerun", "approve", "__end__"]]:
    from choir.ahdb import open_ahdb
    from choir.attest import AttestationStore

    item = state["work_item"]
    config = load_repo_config(Path(item.repo))
    policy = load_policy(config)
    mood = Mood(state["mood"])
    runs = state.get("runs", [])
    decision = adjudicate(runs, policy=policy, mood=mood, attempt=state["attempt"],
                          max_attempts=item.max_attempts, history=state.get("history", []),
                          reruns_done=state.get("reruns", 0))
    db = open_ahdb()
    tree = state["target"].tree_hash
    by_id = {a: AttestationStore().get(a) for a in state.get("attestations", [])}
    base = {"mood": decision.mood.value, "reason": decision.reason,
            "round": state.get("round", 0) + 1}
    event = f"round {base['round']}: {decision.action} ({decision.reason})"
    if decision.action == "done":
        if db.is_asserted(item.id, tree) is None:
            claim = db.propose(claim=f"{item.id}: {item.goal}"[:900], work_item=item.id,
                               tree_hash=tree, commit_sha=state["target"].commit_sha,
                               required_verifiers=sorted({r.verifier for r in runs}))
            claim = db.promote(claim.id, list(by_id))
            db.assert_work_item(item.id, tree, references=[claim.id],
                                claim=f"{item.id} done", commit_sha=state["target"].commit_sha)
        asserted = db.is_asserted(item.id, tree)
        update = {**base, "status": "asserted", "asserted": asserted.id if asserted else "",
                  "events": [event]}
        if policy.needs_approval(item.blast_radius):
            return Command(update={**update, "status": "awaiting_approval"}, goto="approve")
        return Command(update=update, goto="__end__")
    failing = [a for a, att in by_id.items() if att.body.result is Result.FAIL]
    if failing:
        first = next((s for r in runs if r.report.result is Result.FAIL
                      for s in r.report.failure_signatures), None)
        test = (f"rerun {first.test_id or first.kind}; it must pass" if first
                else "rerun the failing step; it must exit 0")
        db.hypothesize(item.id, tree, claim=f"the change does not yet meet: {item.goal}"[:900],
                       discriminating_test=test, attestation_ids=failing)
    others = [a for a, att in by_id.items() if att.body.result is not Result.PASS
              and a not in failing]
    if others:
        db.hyperthesis(item.id, tree, claim="some verification was flaky or inconclusive",
                       attestation_ids=others)
    history = [*state.get("history", []), signatures(runs)]
    if decision.action == "retry":
        return Command(update={**base, "history": history, "status": "running",
                               "feedback": [r.report for r in runs], "events": [event]},
                       goto="execute")
    if decision.action == "rerun":
        return Command(update={**base, "reruns": state.get("reruns", 0) + 1,
                               "runs": Overwrite([]), "events": [event]}, goto="rerun")
    return Command(update={**base, "history": history, "status": "halted", "events": [event]},
                   goto="__end__")


def rerun(state: RunState) -> dict[str, Any]:
    return {"events": ["nested rerun"]}


def approve(state: RunState) -> dict[str, Any]:
    answer = interrupt({"work_item": state["work_item"].id, "asserted": state.get("asserted")})
    ok = bool(answer.get("approved")) if isinstance(answer, dict) else False
    return {"status": "asserted" if ok else "rejected",
            "events": ["approved" if ok else "rejected by a human"]}


def build() -> Any:
    builder = StateGraph(RunState)
    builder.add_node("execute", execute)
    builder.add_node("green", _green_graph())
    builder.add_node("attest", attest)
    builder.add_node("adjudicate", adjudicate_node)
    builder.add_node("rerun", rerun)
    builder.add_node("approve", approve)
    builder.add_edge(START, "execute")
    builder.add_conditional_edges("execute", direct, ["green"])
    builder.add_conditional_edges("rerun", direct, ["green"])
    builder.add_edge("green", "attest")
    builder.add_edge("attest", "adjudicate")
    builder.add_edge("approve", END)
    return builder
