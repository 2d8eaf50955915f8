"""The one plan runner: a round runs planned verifiers on one sealed tree and attests them.

``choir verify``, the orchestrator's green threads and the ``llm`` executor's gate all run
their plans here, so a verifier is run, reported, named and attested the same way whoever
asked for it:

- every green thread's run id is ``{round id}-{verifier}-{replica}`` (``thread_run_id``); a
  round id is a session's (``verify-...``), a ``choir run`` round's (``{run}-r{N}``) or a
  gate check's (``{agent run}-check{hex}``);
- a planned verifier runs through its lens (``lens_spec``), at most ``max_parallel`` at once
  per event loop, with the same progress events (queued, running, done) for the live view;
- a green thread that crashes is INCONCLUSIVE evidence of nothing, never a crashed round;
- every sealed run is attested (``attest_round``) through its lens's spec, and only sealed
  runs are: a crashed thread has nothing to sign.

The orchestrator fans out one round per verifier (``Send``: each green thread is checkpointed
on its own) and mints in its ``attest`` node, before any interrupt; ``choir verify`` and the
gate run the whole plan at once with one sandbox.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from choir._core.ids import thread_run_id
from choir.attest import AttestationStore, load_signer
from choir.director.lenses import lens_spec
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import UserError
from choir.models import (
    Counts,
    PlannedVerifier,
    Result,
    Target,
    VerificationReport,
    VerifierKind,
    VerifierRun,
    VerifierSpec,
    WorkItem,
)
from choir.telemetry import span
from choir.verification import attest_run, open_sandbox, run_verifier_thread, sandbox_options

if TYPE_CHECKING:
    from choir.config import RepoConfig
    from choir.config.policy import Policy
    from choir.models import Attestation, Mood, SpecChange
    from choir.sandbox import Sandbox
    from choir.verification.pipeline import PipelineResult

Event = Callable[[dict[str, Any]], None]
# a verifier kind that runs in Choir's own process, not in a sandbox (the trace verifier):
# (planned, run id, target, store) -> its sealed run
InProcess = Callable[[PlannedVerifier, str, Target, ArtifactStore], VerifierRun]
Thread = tuple[VerifierRun, "PipelineResult | None"]


def _nobody(event: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Round:
    """What every green thread of one round shares: the plan's context and the sealed tree.

    ``tree`` is the sealed snapshot of ``target`` that the verifiers read, never a live
    working tree. ``work_item`` hands its context to postconditions (none outside a run).
    """

    id: str
    config: RepoConfig
    policy: Policy
    mood: Mood
    target: Target
    tree: Path
    work_item: WorkItem | None = None
    on_event: Event = _nobody
    in_process: Mapping[VerifierKind, InProcess] = field(default_factory=dict)
    sandbox_name: str | None = None
    # a ``choir run``'s base tree: the manifest of its Python files as they were when the
    # run started (``choir.evidence.spec.pin_spec``), what a mutation check diffs against
    base: str | None = None

    @functools.cached_property
    def store(self) -> ArtifactStore:
        """The artifact store, opened on first use: a round refused before anything ran
        leaves nothing behind."""
        return ArtifactStore()


_LIMITS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


def limiter(n: int) -> asyncio.Semaphore:
    """At most ``n`` green threads at once (policy ``max_parallel``) in this event loop.

    Keyed by the loop itself, not its ``id()``: a new loop can reuse a dead one's id, and a
    semaphore bound to a dead loop refuses the new one.
    """
    loop = asyncio.get_running_loop()
    return _LIMITS.setdefault(loop, {}).setdefault(n, asyncio.Semaphore(n))


def crashed(planned: PlannedVerifier, run_id: str, target: Target,
            error: BaseException) -> VerifierRun:
    """A crashed green thread: INCONCLUSIVE evidence of nothing, with no report to attest."""
    report = VerificationReport(
        verifier=planned.name, verifier_type="crashed", target=target,
        result=Result.INCONCLUSIVE, summary=f"verifier crashed: {type(error).__name__}: "
                                            f"{str(error)[:200]}",
        next_actions=("Rerun; the verifier itself failed, not the code under test.",),
        confidence=0.0, hyperthesis=("The verifier crashed: nothing was ruled out.",),
        counts=Counts())
    return VerifierRun(verifier=planned.name, run_id=run_id, report=report, report_hash="",
                       manifest_hash="", lens=planned.lens, replica=planned.replica,
                       diagnostic=planned.diagnostic, tests=planned.tests, infra=True)


async def run_green(rnd: Round, planned: PlannedVerifier, *, sandbox: Sandbox | None,
                    runner: Callable[..., PipelineResult] | None = None) -> Thread:
    """One planned verifier through its lens, as one green thread of ``rnd``.

    Never raises for what the verifier did: a crash is an INCONCLUSIVE run (unsealed).
    """
    run_id = thread_run_id(rnd.id, planned.name, planned.replica)
    label = {"kind": "green", "key": run_id, "verifier": planned.name, "lens": planned.lens,
             "replica": planned.replica}
    rnd.on_event({**label, "state": "queued"})
    result: PipelineResult | None = None
    async with limiter(rnd.policy.max_parallel), span(
            "choir.green_thread", _thread_attrs(run_id, planned, sandbox), key=run_id) as tel:
        rnd.on_event({**label, "state": "running"})
        started = time.monotonic()
        try:
            spec = lens_spec(rnd.config.verifiers[planned.name], planned)
            own = rnd.in_process.get(spec.kind)
            if own is not None:
                run = await asyncio.to_thread(own, planned, run_id, rnd.target, rnd.store)
            elif sandbox is None:
                raise RuntimeError(f"no sandbox for verifier {planned.name}")
            elif spec.kind is VerifierKind.MUTATION:
                from choir.director.mutation import run_mutation

                async def one(spec: VerifierSpec, planned: PlannedVerifier, run_id: str,
                              tree: Path, target: Target) -> Thread:
                    """One mutant's run, attested as what it is: the steps on that tree."""
                    assert sandbox is not None
                    run, result = await _run_sandboxed(rnd, spec, planned, run_id, sandbox,
                                                       runner, tree=tree, target=target)
                    if run.report_hash:
                        await asyncio.to_thread(
                            attest_run, run, spec, store=rnd.store, signer=load_signer(),
                            attestations=AttestationStore(), policy_hash=rnd.policy.hash,
                            mood=rnd.mood.value)
                    return run, result

                run = await run_mutation(rnd, spec, planned, run_id, sandbox.name, one)
            else:
                run, result = await _run_sandboxed(rnd, spec, planned, run_id, sandbox,
                                                   runner)
        except UserError:
            raise  # a configuration the user must fix (no scheduler answers): not evidence
        except Exception as exc:  # noqa: BLE001 - a crash is evidence of nothing
            run, result = crashed(planned, run_id, rnd.target, exc), None
        tel.set({"choir.verdict": run.report.result.value, "choir.report_hash": run.report_hash,
                 "choir.manifest_hash": run.manifest_hash,
                 "choir.duration_s": round(time.monotonic() - started, 3)})
    rnd.on_event({**label, "state": "done", "result": run.report.result.value,
                  "seconds": round(time.monotonic() - started, 2),
                  "summary": run.report.summary[:160]})
    return run, result


def _thread_attrs(run_id: str, planned: PlannedVerifier,
                  sandbox: Sandbox | None) -> dict[str, object]:
    """A green thread's span attributes known before it runs."""
    return {"choir.run_id": run_id, "choir.verifier": planned.name, "choir.lens": planned.lens,
            "choir.replica": planned.replica,
            "choir.sandbox": sandbox.name if sandbox is not None else "in-process",
            "choir.isolation": sandbox.isolation if sandbox is not None else "none"}


async def _run_sandboxed(rnd: Round, spec: VerifierSpec, planned: PlannedVerifier, run_id: str,
                         sandbox: Sandbox, runner: Callable[..., PipelineResult] | None, *,
                         tree: Path | None = None, target: Target | None = None) -> Thread:
    """``spec`` in ``sandbox`` on ``tree`` (default: the round's); a held-out verifier reads
    a private copy with its files added, removed after (``choir.evidence.heldout``)."""
    from choir.evidence.heldout import heldout_tree
    from choir.evidence.tree import remove_snapshot, snapshot_root
    from choir.postconditions.context import context_env

    tree = tree or rnd.tree
    private = None
    if spec.heldout is not None:
        root = snapshot_root()
        root.mkdir(parents=True, exist_ok=True)
        private = tree = await asyncio.to_thread(heldout_tree, tree, spec.heldout, root)
    try:
        return await run_verifier_thread(
            spec, repo=tree, target=target or rnd.target, sandbox=sandbox, store=rnd.store,
            run_id=run_id, reporter=rnd.config.models.reporter,
            reporter_name=rnd.config.reporter_name(), lens=planned.lens,
            replica=planned.replica, diagnostic=planned.diagnostic, tests=planned.tests,
            runner=runner, env=context_env(spec, rnd.work_item, run_id=run_id))
    finally:
        if private is not None:
            await asyncio.to_thread(remove_snapshot, private)


@dataclass
class Backend:
    """Where a round's verifiers run: one sandbox, and a cluster client when
    ``CHOIR_SCHEDULER`` names one (else local threads)."""

    sandbox: Sandbox | None
    fanout: Any = None

    @classmethod
    def open(cls, config: RepoConfig, policy: Policy, mood: Mood, *, name: str | None = None,
             on_event: Event = _nobody) -> Backend:
        """Open the sandbox ``config`` (or ``name``) names, and the cluster client; ``close``
        it after. Needs no tree: ``choir verify`` opens it while the snapshot is taken. The
        interpreter's vouch runs while the round gets ready (``open_sandbox(beside=True)``);
        every run waits for it before it starts, and a refusal is a UserError from the
        round.

        Raises:
            UserError: the mood refuses the sandbox available, or its name is unknown.
        """
        from choir.distributed import fanout_from_env

        sandbox = open_sandbox(config, policy, mood, name, beside=True)
        try:
            on_event({"kind": "sandbox", "name": sandbox.name, "isolation": sandbox.isolation,
                      "why": sandbox.chosen_because})
            # reruns are independent votes: on a cluster, each on a worker of its own
            return cls(sandbox, fanout_from_env(sandbox_options(config),
                                                distinct=policy.moods[mood].reruns > 1))
        except BaseException:
            sandbox.close()
            raise

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if self.fanout is not None:
            self.fanout.close()


# backends shared by the green threads of one round that run as separate graph nodes (the
# orchestrator's Sends): per event loop, by round id, with how many threads hold each
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[Any]]] = (
    weakref.WeakKeyDictionary())


def _open(rnd: Round) -> Backend:
    return Backend.open(rnd.config, rnd.policy, rnd.mood, name=rnd.sandbox_name,
                        on_event=rnd.on_event)


def _acquire(rnd: Round) -> Backend:
    held = _SHARED.setdefault(asyncio.get_running_loop(), {})
    if rnd.id not in held:  # opened without an await: no second opener can slip in
        held[rnd.id] = [_open(rnd), 0]
    held[rnd.id][1] += 1
    backend: Backend = held[rnd.id][0]
    return backend


def _release(rnd: Round) -> None:
    held = _SHARED[asyncio.get_running_loop()]
    held[rnd.id][1] -= 1
    if held[rnd.id][1] == 0:
        held.pop(rnd.id)[0].close()


async def run_round(rnd: Round, planned: Sequence[PlannedVerifier], *,
                    backend: Backend | None = None, shared: bool = False) -> list[Thread]:
    """Run ``planned`` side by side on ``backend`` (opened here and closed after when not
    given), results in plan order.

    ``shared``: the calls for one round id in this event loop share one backend, open while
    any of them runs (the orchestrator runs each green thread as its own node: one sandbox
    and one cluster client per round, so the snapshot is shipped to a cluster once).

    Raises:
        UserError: the mood refuses the sandbox available, or its name is unknown (nothing
            ran).
    """
    needs = any(rnd.config.verifiers[p.name].kind not in rnd.in_process for p in planned)
    share = backend is None and shared and needs
    own = backend is None and not share
    use = (_acquire(rnd) if share else (_open(rnd) if needs else Backend(None)) if own
           else backend)
    assert use is not None
    try:
        runner = use.fanout.run_verifier if use.fanout is not None else None
        return list(await asyncio.gather(*(
            run_green(rnd, p, sandbox=use.sandbox, runner=runner) for p in planned)))
    finally:
        if share:
            _release(rnd)
        elif own:
            use.close()


def attest_round(rnd: Round, runs: Sequence[VerifierRun], *,
                 executor_isolation: Literal["namespace", "none", "tools"] | None = None,
                 minted: Mapping[str, str] | None = None, spec_hash: str | None = None,
                 spec_change: SpecChange | None = None) -> dict[str, Attestation]:
    """Mint the attestation of every sealed run not yet in ``minted`` (run id -> id).

    The attestation signs the spec the run executed (its lens's), read back against what is
    stored; minting again yields the same content-addressed attestation. ``spec_hash`` and
    ``spec_change``: the pinned spec of a ``choir run`` and how the verified tree differs.
    """
    signer, store = load_signer(), AttestationStore()
    done = minted or {}
    out: dict[str, Attestation] = {}
    for run in runs:
        if not run.report_hash or run.run_id in done:
            continue  # a crashed thread sealed nothing
        planned = PlannedVerifier(name=run.verifier, lens=run.lens,  # type: ignore[arg-type]
                                  replica=run.replica, tests=run.tests)
        spec = lens_spec(rnd.config.verifiers[run.verifier], planned)
        # a child of the run's green thread, which ended before anything was minted
        with span("choir.attest", {
                "choir.run_id": run.run_id, "choir.verifier": run.verifier,
                "choir.verdict": run.report.result.value}, parent=run.run_id) as tel:
            out[run.run_id] = attest_run(run, spec, store=rnd.store, signer=signer,
                                         attestations=store, policy_hash=rnd.policy.hash,
                                         mood=rnd.mood.value,
                                         executor_isolation=executor_isolation,
                                         spec_hash=spec_hash, spec_change=spec_change)
            tel.set({"choir.attestation.id": out[run.run_id].id})
    return out
