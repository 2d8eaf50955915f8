"""The ``llm`` executor: a Choir Agent that edits the work item's repo through file tools.

Its verifier is the green-thread verification itself: when the agent calls
``final_output``, the mood's plan runs on the current tree in fresh sandboxes, and a FAIL
comes back as a ``<verification_rejected>`` block built from bounded reports (summaries,
failing test ids, next actions: never raw output). An INCONCLUSIVE round is a system error,
retried and never counted against the agent. The Director loop then verifies again and
attests, so the agent's own "done" never promotes anything.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from choir._core.ids import check_run_id
from choir._core.paths import choir_home
from choir._core.resources import load_text
from choir.agent.agent import TRANSIENT, Agent, AgentResult
from choir.agent.feedback import one_line
from choir.agent.files import RepoFiles
from choir.agent.injection import tool_threads
from choir.agent.store import SqliteContextStore
from choir.config import CONFIG_NAME, load_repo_config
from choir.config.policy import load_policy
from choir.director import outside_a_run, plan
from choir.director.rounds import Round, attest_round, run_round
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.target import snapshot_target
from choir.evidence.tree import remove_snapshot, snapshot_root
from choir.exceptions import (
    ConfigError,
    ModelUnavailableError,
    SandboxError,
    VerificationRejected,
)
from choir.executors import interpreter_in_repo, masked_paths, spec_in_repo
from choir.executors.pinned import GateContext, current_gate
from choir.executors.prompt import work_prompt
from choir.models import (
    ExecutorOutput,
    PlannedVerifier,
    Result,
    VerificationReport,
    VerifierRun,
    WorkItem,
)
from choir.sandbox.stop import forget, stop_runs


class ChangeSummary(BaseModel):
    """What the agent says it changed (validated before verification)."""

    summary: str = Field(min_length=1, max_length=2_000)

# what verifies the executor's work is not the executor's to edit
# the allowlist, and the repo's .venv: ignored, so outside the tree hash, yet it is the
# interpreter the verifiers run (a planted .pth would pass every step)
PROTECTED = (CONFIG_NAME, ".venv")


def _rejection(runs: Sequence[VerifierRun], tree_hash: str) -> VerificationRejected:
    failing = [r for r in runs if r.report.result is Result.FAIL]
    tests = [s.test_id or s.kind for r in failing for s in r.report.failure_signatures]
    actions = [a for r in failing for a in r.report.next_actions]
    return VerificationRejected(
        "; ".join(f"{r.verifier}: {r.report.summary}" for r in failing),
        code="verification_failed",
        metadata={"failing_verifiers": [r.verifier for r in failing],
                  "failing_tests": tests, "next_actions": actions},
        candidate=tree_hash)  # a new tree under the same summary is a new attempt


def green_verifier(item: WorkItem, run_id: str) -> Any:
    """A verifier that runs the work item's plan in sandboxes on the current tree.

    Configuration, policy and mood come from the run (``choir.executors.pinned``), never from
    the working tree the agent edits; outside a run they are read once, when the agent is
    built. Every check is sealed and attested like any green thread (lens
    ``executor_gate``): ``choir audit`` accounts for it, and its FAIL counts as evidence
    on that tree; it never promotes anything (only the Director loop's rounds do).
    """

    repo = Path(item.repo)
    pinned = current_gate()
    if pinned is None:
        config = load_repo_config(repo)
        pinned = GateContext(config, load_policy(config), item.mood)

    async def verify(output: ChangeSummary) -> ChangeSummary:
        config, policy, mood = pinned.config, pinned.policy, pinned.mood
        # held-out checks are never the agent's to run (its gate would read their reports),
        # nor the Director's mutation checks (they need the run's base tree)
        config = config.model_copy(update={"verifiers": {
            n: s for n, s in config.verifiers.items()
            if s.heldout is None and s.mutates is None}})
        chosen = outside_a_run(plan(policy, mood, config.verifiers,
                                    required=item.required_verifiers), config.verifiers)
        planned = [PlannedVerifier(name=name, lens="executor_gate") for name in
                   dict.fromkeys(p.name for p in chosen.verifiers)]
        check = check_run_id(run_id)  # fresh per check, also after a resumed agent run
        snapshots = snapshot_root() / check
        try:
            # the agent waits while its tree is verified; the verifiers read a sealed copy
            target, tree = await asyncio.to_thread(
                partial(snapshot_target, repo, snapshots, item.id,
                        full=policy.moods[mood].rehash == "full"))
            rnd = Round(id=check, config=config, policy=policy, mood=mood, target=target,
                        tree=tree, work_item=item)
            rounding = asyncio.ensure_future(run_round(rnd, planned))
            try:
                runs = [run for run, _ in await asyncio.shield(rounding)]
            except asyncio.CancelledError:
                # the executor's time is up (or its run was cancelled): a step's thread
                # would run on to its own timeout, on a snapshot removed under it, and seal
                # a run nothing attests. Its steps alone are killed (not other rounds' of
                # this process; one still being prepared is killed as it starts), the round
                # ends on what they did and is attested, whatever cancels this meanwhile.
                stop_runs(check)
                try:
                    runs = [run for run, _ in await _through(rounding)]
                    await _through(asyncio.ensure_future(
                        asyncio.to_thread(attest_round, rnd, runs)))
                finally:
                    forget(check)
                raise
            await asyncio.to_thread(attest_round, rnd, runs)
        finally:
            await asyncio.to_thread(remove_snapshot, snapshots)
        if any(r.report.result is Result.FAIL for r in runs):
            raise _rejection(runs, target.tree_hash)
        if all(r.report.result is Result.PASS for r in runs):
            return output
        raise SandboxError("verification was inconclusive: "
                           + ", ".join(f"{r.verifier}={r.report.result.value}" for r in runs))

    return verify


async def _through(future: asyncio.Future[Any]) -> Any:
    """``future``'s result, awaited to its end however often the caller is cancelled
    meanwhile (it is shielded; a ``future`` itself cancelled raises)."""
    while True:
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                return future.result()


def build_agent(item: WorkItem, run_id: str, *, model: str | Any,
                model_settings: dict[str, Any] | None = None) -> tuple[Agent, RepoFiles]:
    repo = Path(item.repo).resolve()
    # and whatever else of the run's pinned interpreter lies in the repo, as for the
    # sandboxed executors (a sandbox.python inside it), and the run's pinned spec paths they
    # bind read-only: its checks, and the work item file when it lies in the repo (a model
    # told to rewrote its own item, ``mood: CALM``; review 21's doubt)
    pinned = tuple(p.relative_to(repo).as_posix()
                   for p in (*interpreter_in_repo(repo), *spec_in_repo(repo)))
    # Choir's stores in the repo, which a sandboxed executor has masked (masked_paths)
    hidden = tuple(p.relative_to(repo).as_posix() for p in masked_paths()
                   if p.is_relative_to(repo) and p != repo)
    files = RepoFiles(repo, protected=tuple(dict.fromkeys((*PROTECTED, *pinned))),
                      hidden=hidden)
    instructions = load_text("prompts", "executor_system.md")
    if item.executor.instructions:
        instructions += "\n\nThe work item's own instructions:\n" + item.executor.instructions
    agent = Agent(instructions=instructions, model=model, model_settings=model_settings,
                  tools=[files.list_files, files.read_file, files.search, files.write_file,
                         files.apply_patch],
                  output_type=ChangeSummary, verifier=green_verifier(item, run_id),
                  verifier_max_attempts=item.executor.verifier_max_attempts,
                  max_turns=item.executor.max_turns, name=item.id)
    return agent, files


def query(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport]) -> str:
    return work_prompt(item, attempt, feedback)


def run_llm(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
            run_id: str | None = None) -> ExecutorOutput:
    """One agent run per attempt; its context is durable under ``CHOIR_HOME``.

    A resumed Choir run that re-executes the same attempt continues the same agent run
    (same id), so a crash never repeats the model calls already made.
    """

    model = item.executor.model or load_repo_config(Path(item.repo)).models.executor
    if not model:
        raise ConfigError(f"work item '{item.id}': executor kind 'llm' needs a model",
                          hint="set executor.model in the work item, or models.executor "
                               "in choir.yaml (any litellm model name)")
    agent_run = f"{run_id or 'adhoc-' + secrets.token_hex(4)}-exec{attempt}"
    agent, files = build_agent(item, agent_run, model=model,
                               model_settings={"max_tokens": item.executor.max_tokens})
    store = SqliteContextStore(choir_home() / "agents.sqlite")

    # the tools run on a pool of their own, left behind at the timeout (asyncio.run would
    # wait for the default one), and see the same deadline: a search stops at it
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"choir-tools-{agent_run}")

    async def go() -> AgentResult:
        files.deadline = time.monotonic() + item.executor.timeout_s
        with tool_threads(pool):
            return await asyncio.wait_for(agent.run(query(item, attempt, feedback),
                                                    run_id=agent_run, store=store),
                                          timeout=item.executor.timeout_s)

    try:
        result: AgentResult | None = asyncio.run(go())
    except TimeoutError:
        result = None
    finally:
        files.stop()  # a tool left running reads on briefly, but never writes again
        pool.shutdown(wait=False, cancel_futures=True)
    if result is not None and result.status == "failed" and result.error == "model_error" \
            and result.message.startswith(f"model_error: {TRANSIENT}"):
        # the model did not answer, after the agent's retries (a server down or overloaded,
        # a timeout): the infrastructure failed, not the work. The run is put back as it
        # stood before that call, so a resume asks again from there, and the attempt is not
        # recorded: none of the item's budget is spent on an outage. A refusal (a bad
        # request: a conversation past the model's context; a key refused) is the attempt's,
        # as before: the next attempt starts a fresh agent run
        store.save(agent_run, result.context.model_copy(update={"status": "running",
                                                                 "error": None}))
        raise ModelUnavailableError(
            f"the executor's model {model} did not answer ({one_line(result.message)[:300]});"
            " no attempt was charged for it: `choir run --resume` asks again")
    record: dict[str, Any] = {"agent_run": agent_run, "changed_files": files.changed_files()}
    if result is None:
        record.update(status="failed", error="timeout")
        usage: tuple[Any, ...] = ()
    else:
        record.update(status=result.status, error=result.error, events=list(result.events),
                      attempts_used=result.context.verification.attempts_used,
                      output=result.context.output, usage=result.usage.model_dump())
        usage = (result.usage,)
    blob = json.dumps(record, indent=1, default=str).encode()
    return ExecutorOutput(artifact=ArtifactStore().ingest_bytes(blob), usage=usage)


run_llm.isolation = "tools"  # type: ignore[attr-defined]  # acts only through file tools
