"""One verifier, end to end: sandbox run -> artifacts -> bounded report -> attestation.

Both ``choir verify`` and the orchestrator's green threads go through these two functions, so
there is one way evidence is made. ``run_verifier_thread`` is the green thread's body: what it
returns for the control loop (``VerifierRun``) holds the report and hashes only; the raw
``PipelineResult`` (with its tail log) is for ``choir verify``'s human-facing output and never
enters graph state. ``attest_run`` mints the attestation from what is stored, so re-running it
(a resumed graph) yields the very same content-addressed attestation.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from choir._core.canonical import canonical_json, hash_json
from choir._core.failpoints import failpoint
from choir._version import __version__
from choir.ahdb import open_ahdb
from choir.attest import mint
from choir.exceptions import UserError
from choir.models import (
    Attestation,
    AttestationBody,
    Environment,
    Interpreter,
    RunManifest,
    SpecChange,
    Target,
    VerifierHistory,
    VerifierRun,
    VerifierSpec,
)
from choir.models.attestation import attested_artifacts
from choir.report import abuild_report
from choir.sandbox import resolve_sandbox, stop
from choir.sandbox._interpreter import refuse_reached, trust, vouch
from choir.verification.pipeline import run_verifier

if TYPE_CHECKING:
    from choir.attest import AttestationStore, SigningKey
    from choir.config import RepoConfig
    from choir.config.policy import Policy
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Mood
    from choir.sandbox import Sandbox
    from choir.verification.pipeline import PipelineResult


# Sandbox calls block: they run here, bounded by the policy's max_parallel semaphore and not
# by the default executor's few workers (6 on a 2-core machine).
_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="choir-green")
HISTORY_WAIT_S = 5.0  # a step not started by then: the record is read anyway


def sandbox_options(config: RepoConfig) -> dict[str, object]:
    """The sandbox options ``choir.yaml`` sets; only those set: a plugin backend may take none."""
    options: dict[str, object] = {}
    for key in ("image", "python", "binds", "transfer"):
        if getattr(config.sandbox, key):
            options[key] = getattr(config.sandbox, key)
    return options


def open_sandbox(config: RepoConfig, policy: Policy, mood: Mood,
                 name: str | None = None, *, beside: bool = False) -> Sandbox:
    """The sandbox a repo's verifiers run in (``choir.yaml``'s backend and image, or ``name``).

    The interpreter the steps will run is vouched for here (``_interpreter.vouch``): one
    the repo reaches must be the one trusted for it, digest included. ``beside``: the vouch
    (a ``stat`` of every file of a ``.venv``, 8 ms of a core for 2,700 files) runs in a
    thread of its own while the caller gets on (the snapshot, the round's set-up), and
    every run waits for it before anything of it starts, locally or on a cluster
    (``Sandbox.vouched``: ``run_verifier_thread``, ``pipeline.run_verifier``): no step ever
    runs an interpreter the vouch has not passed. The mood's refusal of an interpreter the
    repo reaches is said here either way.

    Raises:
        UserError: the mood refuses a sandbox without isolation or one that cannot apply
            resource limits (PARANOID), or the name is unknown; the repo's interpreter
            changed since it was trusted, or lies in the repo under PARANOID.
    """

    sandbox = resolve_sandbox(name or config.sandbox.backend, **sandbox_options(config))
    if not getattr(sandbox, "has_image", lambda: True)():
        fix = sandbox.missing_image_fix()  # type: ignore[attr-defined]
        sandbox.close()
        raise UserError(fix)
    if sandbox.isolation == "none" and not policy.moods[mood].allow_unsafe_isolation:
        sandbox.close()
        raise UserError(
            f"mood {mood.value} refuses the '{sandbox.name}' sandbox (no isolation); "
            "install bubblewrap or start a Docker engine, or choose another mood"
        )
    if policy.moods[mood].require_limits:
        if not sandbox.limits_enforceable():
            sandbox.close()
            raise UserError(
                f"mood {mood.value} requires resource limits, but the '{sandbox.name}' sandbox "
                "cannot apply memory and pids limits here (bwrap needs writable cgroup v1 "
                "pids and memory controllers, i.e. root on a cgroup-v1 host); use the docker "
                "sandbox, or choose another mood"
            )
        sandbox.require_limits = True  # a step that loses them at run time is INCONCLUSIVE
    try:
        tools = sandbox.toolchain(Path(config.path))
        if tools is not None:
            refuse = not policy.moods[mood].allow_unsafe_isolation
            check = functools.partial(vouch, tools, Path(config.path), refuse_in_repo=refuse)
            if beside:
                if refuse:
                    refuse_reached(tools, Path(config.path))
                sandbox.vouching = _beside(check)
            else:  # refused here, before a step runs, when it changed untrusted
                sandbox.interpreter = check()
    except BaseException:
        sandbox.close()
        raise
    return sandbox


def _beside(check: Callable[[], Interpreter]) -> Future[Interpreter]:
    """``check()`` in a thread of its own (not a pool's: a fork of a process whose pool had
    threads would wait on threads the fork does not have); its answer or its error. A
    daemon: a command that ends early (a configuration error) does not wait for it."""
    done: Future[Interpreter] = Future()

    def work() -> None:
        try:
            done.set_result(check())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            done.set_exception(exc)

    threading.Thread(target=work, name="choir-vouch", daemon=True).start()
    return done


def trust_interpreter(config: RepoConfig, name: str | None = None) -> Interpreter | None:
    """Record the interpreter ``config``'s verifiers run, fully re-hashed now, as the one
    trusted for its repo (after a deliberate change: ``pip install`` into the repo's venv).
    None when the sandbox runs no host interpreter (an image's own)."""
    sandbox = resolve_sandbox(name or config.sandbox.backend, **sandbox_options(config))
    try:
        tools = sandbox.toolchain(Path(config.path))
    finally:
        sandbox.close()
    return trust(tools, Path(config.path)) if tools is not None else None


def _history_once(verifier: str, started: threading.Event) -> VerifierHistory | None:
    """``verifier_history``, once ``started`` is set (the run's step launched, or the run is
    over)."""
    started.wait(HISTORY_WAIT_S)
    return verifier_history(verifier)


def verifier_history(verifier: str) -> VerifierHistory | None:
    """The AHDB's record of ``verifier`` for calibrating confidence; None when the AHDB
    cannot be read (the report then says nothing of history, and never more than the
    table)."""
    try:
        return open_ahdb().verifier_history(verifier)
    except Exception:  # noqa: BLE001 - calibration is advice to lower, never a fault
        return None


async def run_verifier_thread(
    spec: VerifierSpec,
    *,
    repo: Path,
    target: Target,
    sandbox: Sandbox,
    store: ArtifactStore,
    run_id: str,
    reporter: str | None = None,
    reporter_name: str | None = None,
    lens: str = "default",
    replica: int = 0,
    diagnostic: bool = False,
    tests: tuple[str, ...] = (),
    runner: Callable[..., PipelineResult] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[VerifierRun, PipelineResult]:
    """Run ``spec`` in ``sandbox`` and turn its artifacts into a stored report.

    The sandbox call blocks, so it runs in a worker thread; verifiers run side by side.
    ``runner`` replaces the local ``choir.verification.pipeline.run_verifier`` (same signature): the
    distributed fan-out (``choir.distributed``) runs the step on a worker and lands the
    sealed run here; the report and attestation below are the same either way.
    """

    loop = asyncio.get_running_loop()
    if sandbox.vouching is not None:  # nothing starts, here or on a cluster, before it holds
        await asyncio.wrap_future(sandbox.vouching)
    with stop.begun(run_id) as started:
        running = loop.run_in_executor(
            _POOL,
            functools.partial(runner or run_verifier, spec, repo=repo, sandbox=sandbox,
                              store=store, run_id=run_id, target=target, env=env),
        )
        running.add_done_callback(lambda _done: started.set())  # no step of it ran here
        # the verifier's record, read while its step runs (nothing of this run is in it
        # either way: its attestation is minted after the report), once the step has
        # started: read beside the launch, it held the interpreter lock the launch's system
        # calls wait for (the step's launch took 12 ms instead of 3 in a warm toolz request)
        # (``verifier_history`` never raises)
        history = loop.run_in_executor(None, _history_once, spec.name, started)
        result = await running
    failpoint("green:ran")
    report = await abuild_report(result, spec=spec, store=store, target=target, reporter=reporter,
                                 reporter_name=reporter_name, lens=lens,
                                 history=await history)
    report_hash = store.ingest_bytes(canonical_json(report))
    run = VerifierRun(
        verifier=spec.name,
        run_id=run_id,
        lens=lens,
        replica=replica,
        diagnostic=diagnostic,
        tests=tests,
        report=report,
        report_hash=report_hash,
        manifest_hash=result.manifest_hash,
        infra=result.infra_error is not None,
    )
    return run, result


def load_manifest(store: ArtifactStore, manifest_hash: str) -> RunManifest:
    """The run manifest stored under ``manifest_hash``."""
    return RunManifest.model_validate_json(store.read_bytes(manifest_hash))


def attest_run(
    run: VerifierRun,
    spec: VerifierSpec,
    *,
    store: ArtifactStore,
    signer: SigningKey,
    attestations: AttestationStore,
    policy_hash: str | None,
    mood: str | None,
    executor_isolation: Literal["namespace", "none", "tools"] | None = None,
    spec_hash: str | None = None,
    spec_change: SpecChange | None = None,
) -> Attestation:
    """Mint and store the attestation for one verifier run (idempotent: content-addressed).

    Everything the body states is read back from the stored manifest and report, not taken
    on trust from the caller, so the attestation says how the verifier actually ran.
    """

    manifest = load_manifest(store, run.manifest_hash)
    platform = manifest.platform
    body = AttestationBody(
        run_id=run.run_id,
        verifier=spec.name,
        verifier_kind=spec.kind.value,
        verifier_version=f"choir/{__version__}",
        verifier_config_hash=hash_json(spec),
        commands=tuple(step.command for step in spec.steps),
        target=run.report.target,
        result=run.report.result,
        report_hash=run.report_hash,
        manifest_hash=run.manifest_hash,
        artifacts=attested_artifacts(manifest.files, run.report.artifacts),
        environment=Environment(
            sandbox=platform.sandbox,
            isolation=platform.isolation,
            network=spec.network or bool(spec.hosts),
            hosts=spec.hosts,
            binds=platform.binds,
            image=platform.container_image,
            image_digest=platform.image_digest,
            os=platform.os,
            arch=platform.arch,
            choir_version=__version__,
            limits_applied=platform.limits_applied,
            interpreter=platform.interpreter,
        ),
        policy_hash=policy_hash,
        mood=mood,
        lens=run.lens,
        executor_isolation=executor_isolation,
        spec_hash=spec_hash,
        spec_change=spec_change,
        heldout=spec.heldout.files_hash if spec.heldout is not None else None,
        started_at=manifest.timestamp_start,
        ended_at=manifest.timestamp_end,
    )
    attestation = mint(body, signer)
    attestations.put(attestation)

    open_ahdb().record_outcome(attestation.id)  # anchors it in the log; a FAIL demotes
    return attestation
