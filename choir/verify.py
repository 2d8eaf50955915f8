"""``choir verify``: verify the working tree now, outside any work item.

Plans through the Director (the mood policy, the director model when one is configured, and
BOLD's broadening once the core is green), runs the plan's verifiers side by side in fresh
sandboxes, mints one attestation per report, and assembles the seed-001 output contract
(``status``, ``run_id``, ``tail_log``, ``artifact_paths``, ``manifest``) plus ``mood``,
``plan``, ``reports`` and ``attestations``. The tail log is for the person at the terminal
only.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from choir.config import load_repo_config
from choir.models import Mood, PlannedVerifier, Result, Target, WorkItem
from choir.policy import load_policy
from choir.tree import Snapshot, inspect_tree, remove_snapshot, snapshot, snapshot_root

TAIL_LINES = 200


@dataclass
class VerifyOutcome:
    """The result of ``verify_tree``: the contract JSON and whether it passed."""

    status: str
    contract: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def new_run_id(prefix: str) -> str:
    """A sortable, unique run id: prefix, UTC time, random suffix."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


def target_of(snap: Snapshot, work_item: str | None = None) -> Target:
    """The Target for a hashed tree: the commit only when the tree is exactly that commit's."""
    return Target(work_item=work_item, commit_sha=snap.commit_sha, tree_hash=snap.tree_hash,
                  tree_sha256=snap.sha256)


def resolve_target(repo: Path, work_item: str | None = None) -> Target:
    """The exact tree (and, when clean, commit) evidence will be bound to."""
    return target_of(inspect_tree(repo), work_item)


def snapshot_target(repo: Path, root: Path,
                    work_item: str | None = None) -> tuple[Target, Path]:
    """Hash ``repo`` and copy exactly the hashed files into a sealed snapshot, in one pass.

    Verifiers read the snapshot, never the live tree, so what they see is what the target
    names (issue #11, items 1-2). The caller removes it (``remove_snapshot``) when done.
    """
    snap = snapshot(repo, root)
    assert snap.path is not None
    return target_of(snap, work_item), snap.path


def _tail(results: list[Any]) -> str:
    lines: list[str] = []
    for result in results:
        body = result.tail_log.splitlines()
        if not body:
            continue
        lines.append(f"==> {result.run_id} <==")
        lines.extend(body)
    return "\n".join(lines[-TAIL_LINES:])


async def averify_tree(
    repo: Path, *, mood: Mood | None = None, sandbox_name: str | None = None
) -> VerifyOutcome:
    """Verify ``repo``'s working tree now. See the module docstring.

    Raises:
        UserError: bad configuration, or a policy that refuses the sandbox available.
    """
    from choir.artifacts import ArtifactStore
    from choir.attest import AttestationStore, load_signer
    from choir.director import plan as director_plan
    from choir.verification import attest_run, load_manifest, open_sandbox, run_verifier_thread

    repo = repo.expanduser().resolve()
    config = load_repo_config(repo)
    policy = load_policy(config)
    mood = mood or Mood.CALM
    plan = director_plan(policy, mood, config.verifiers)
    if config.models.director:
        from choir.director_model import suggest

        advice = await suggest(
            config.models.director, WorkItem(id="verify", goal="verify the tree as it is",
                                             repo=str(repo)),
            mood=mood, attempt=1, planned=[p.name for p in plan.verifiers if p.replica == 0],
            specs=config.verifiers, last=[])
        plan = director_plan(policy, mood, config.verifiers, suggestion=advice.names,
                             reason=advice.reason)
    sandbox = open_sandbox(config, policy, mood, sandbox_name)
    store, signer, attestations = ArtifactStore(), load_signer(), AttestationStore()
    session = new_run_id("verify")
    snapshots = snapshot_root() / session  # this invocation's own: removed when it ends
    try:
        target, verified = snapshot_target(repo, snapshots)
    except BaseException:
        sandbox.close()
        remove_snapshot(snapshots)
        raise
    semaphore = asyncio.Semaphore(policy.max_parallel)
    started = time.monotonic()

    async def one(planned: PlannedVerifier) -> Any:
        spec = config.verifiers[planned.name]
        async with semaphore:
            return await run_verifier_thread(
                spec,
                repo=verified,
                target=target,
                sandbox=sandbox,
                store=store,
                run_id=f"{session}-{planned.name}-{planned.replica}",
                reporter=config.models.reporter,
                lens=planned.lens,
                replica=planned.replica,
            )

    planned = list(plan.verifiers)
    try:
        pairs = await asyncio.gather(*(one(pv) for pv in planned))
        core_green = all(run.report.result is Result.PASS for run, _ in pairs)
        if mood is Mood.BOLD and core_green:  # BOLD broadens once the core is green
            wider = [PlannedVerifier(name=n) for n in policy.moods[mood].broaden
                     if n not in {pv.name for pv in planned}]
            planned += wider
            pairs += await asyncio.gather(*(one(pv) for pv in wider))
    finally:
        sandbox.close()
        remove_snapshot(snapshots)
    runs = [run for run, _ in pairs]
    results = [result for _, result in pairs]
    atts = [
        attest_run(
            run,
            config.verifiers[run.verifier],
            store=store,
            signer=signer,
            attestations=attestations,
            policy_hash=policy.hash,
            mood=mood.value,
        )
        for run in runs
    ]
    passed = bool(runs) and all(run.report.result is Result.PASS for run in runs)
    status = "PASS" if passed else "FAIL"
    manifests = [load_manifest(store, run.manifest_hash) for run in runs]
    commands = [
        {**cmd.model_dump(mode="json", include={"name", "command", "exit_code", "duration_ms"}),
         "name": f"{m.verifier}/{cmd.name}"}
        for m in manifests
        for cmd in m.commands_executed
    ]
    first = manifests[0].platform if manifests else None
    contract: dict[str, Any] = {
        "status": status,
        "run_id": session,
        "tail_log": _tail(results),
        "artifact_paths": [str(result.run_dir) for result in results],
        "summary": "; ".join(
            f"{run.verifier}: {run.report.result.value} ({run.report.summary[:120]})"
            for run in runs
        ),
        "manifest": {
            "run_id": session,
            "timestamp_start": min((m.timestamp_start for m in manifests), default=None),
            "timestamp_end": max((m.timestamp_end for m in manifests), default=None),
            "commit_sha": target.commit_sha,
            "tree_hash": target.tree_hash,
            "commands_executed": commands,
            "platform": {
                "os": first.os if first else "",
                "arch": first.arch if first else "",
                "container_image": first.container_image if first else None,
                "sandbox": sandbox.name,
                "isolation": sandbox.isolation,
            },
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
        "mood": mood.value,
        "plan": [pv.name for pv in planned],
        "plan_dropped": list(plan.dropped),
        "plan_reason": plan.reason,
        "reports": [run.report.model_dump(mode="json") for run in runs],
        "attestations": [att.id for att in atts],
    }
    for key in ("timestamp_start", "timestamp_end"):
        value = contract["manifest"][key]
        contract["manifest"][key] = value.isoformat() if value else None
    return VerifyOutcome(status=status, contract=contract)


def verify_tree(
    repo: Path, *, mood: Mood | None = None, sandbox_name: str | None = None
) -> VerifyOutcome:
    """Synchronous ``averify_tree``."""
    return asyncio.run(averify_tree(repo, mood=mood, sandbox_name=sandbox_name))
