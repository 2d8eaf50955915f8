"""``choir verify``: verify the working tree now, outside any work item.

Plans through the Director (the mood policy, the director model when one is configured, and
BOLD's broadening once the core is green), runs the plan's verifiers side by side in fresh
sandboxes, mints one attestation per report, and assembles the output contract (docs/concepts.md)
(``status``, ``run_id``, ``tail_log``, ``artifact_paths``, ``manifest``) plus ``mood``,
``plan``, ``reports`` and ``attestations``. The tail log is for the person at the terminal
only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from choir._core import fsopen
from choir._core.ids import new_run_id
from choir._core.terminal import plain_lines, shorten
from choir.app.claim import check_claim_name, record_claim
from choir.attest.store import clear_stale_temps
from choir.config import load_repo_config
from choir.config.policy import full_rehash, load_policy
from choir.director import outside_a_run, with_additions
from choir.director import plan as director_plan
from choir.director.advisor import suggest
from choir.director.rounds import Backend, Round, attest_round, run_round
from choir.evidence.base import Base, Judged, judge_against, read_base
from choir.evidence.spec import ADDITIONS_REPLICA
from choir.evidence.target import snapshot_target
from choir.evidence.tree import remove_snapshot, snapshot_root
from choir.exceptions import UserError
from choir.models import Mood, PlannedVerifier, Result, WorkItem
from choir.postconditions.episode import episode
from choir.telemetry import span
from choir.verification import load_manifest
from choir.verification.session import (
    SessionCommand,
    SessionManifest,
    platform_of,
    write_session,
)
from choir.verification.session_logs import run_order, write_session_logs

TAIL_LINES = 200
_SOURCE_MAX = 4 << 20  # a test module read to find a def's line


@dataclass
class VerifyOutcome:
    """The result of ``verify_tree``: the contract JSON and whether it passed."""

    status: str
    contract: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def _tail(results: list[Any]) -> str:
    lines: list[str] = []
    for result in results:
        body = plain_lines(result.tail_log).splitlines()  # ANSI in a JSON field is noise
        if not body:
            continue
        lines.append(f"==> {result.run_id} <==")
        lines.extend(body)
    return "\n".join(lines[-TAIL_LINES:])


_DEF = r"^\s*(?:async\s+)?def\s+{name}\b"


def pytest_node(repo: Path, test_id: str, location: str | None) -> tuple[str, str | None]:
    """A pytest node id a user can paste, and ``file:line`` of the test's ``def``.

    JUnit names a test ``package.module.Class::name``; pytest wants
    ``package/module.py::Class::name``. The module is the longest dotted prefix that is a
    file in the repo (never outside it); without one, the id is returned as it was.
    """
    import re

    head, _, name = test_id.rpartition("::")
    parts = [p for p in head.split("::") if p] if ".py" in head else head.split(".")
    found: Path | None = None
    rest: list[str] = []
    if parts and parts[0].endswith(".py"):
        found, rest = repo / parts[0], parts[1:]
    else:
        for cut in range(len(parts), 0, -1):
            candidate = repo.joinpath(*parts[:cut]).with_suffix(".py") if parts[:cut] else None
            if candidate is not None and candidate.is_file():
                found, rest = candidate, parts[cut:]
                break
    if found is None and location and location.endswith(".py"):
        found = repo / location
    rel = _inside(repo, found) if found is not None else None
    if rel is None:
        return test_id, location
    node = "::".join([rel.as_posix(), *rest, name])
    base = re.escape(name.split("[", 1)[0])
    try:
        text = fsopen.read_bytes(repo, rel.as_posix(), _SOURCE_MAX)  # never through a link
        lines = text.decode("utf-8", "replace").splitlines()
    except OSError:
        return node, rel.as_posix()
    pattern = re.compile(_DEF.format(name=base))
    line = next((i for i, text in enumerate(lines, 1) if pattern.match(text)), None)
    return node, f"{rel.as_posix()}:{line}" if line else rel.as_posix()


def _inside(repo: Path, found: Path) -> Path | None:
    """``found`` relative to ``repo`` when it is a regular file there reached through no
    link: a name pointing outside the repo, or through a link (to a file whose name is no
    text, a review's crash of the CI entry), is not followed."""
    try:
        rel = found.relative_to(repo)
    except ValueError:
        return None
    if not rel.parts or ".." in rel.parts or any(
            repo.joinpath(*rel.parts[:n]).is_symlink() for n in range(1, len(rel.parts) + 1)):
        return None
    return rel if (repo / rel).is_file() else None


def failing_tests(repo: Path, runs: list[Any]) -> list[dict[str, Any]]:
    """The failing tests of every run that did not pass, as pytest node ids with file:line."""
    out: list[dict[str, Any]] = []
    for run in runs:
        if run.report.result is Result.PASS:
            continue
        for sig in run.report.failure_signatures:
            if not sig.kind.startswith("test") or not sig.test_id:
                continue
            node, where = pytest_node(repo, sig.test_id, sig.location)
            out.append({"verifier": run.verifier, "replica": run.replica, "node_id": node,
                        "location": where, "excerpt": sig.excerpt})
    return out


OnEvent = Callable[[str, dict[str, Any]], None]


def _quiet(kind: str, data: dict[str, Any]) -> None:
    return None


async def averify_tree(
    repo: Path, *, mood: Mood | None = None, sandbox_name: str | None = None,
    on_event: OnEvent | None = None, claim: str | None = None, session: str | None = None,
    required: tuple[str, ...] = (), pinned: str | None = None, plan_item: bool = False,
    base: str | None = None, approve_spec: bool = False,
) -> VerifyOutcome:
    """Verify ``repo``'s working tree now. See the module docstring.

    ``on_event`` gets the same ``("progress", {...})`` events ``choir run`` streams (the plan,
    the sandbox, each verifier queued/running/done), so the CLI draws the same live view.

    ``claim``: record the verdict in the AHDB under this name, so ``choir gate NAME``
    answers for the tree (``choir.app.claim``).

    ``session``: the session's run id (default: a new one). A caller that records it before
    the session starts can run it again after a crash: the verifier runs that sealed are
    reused, the ones cut short set aside (``choir.verification.pipeline``), and the claim's
    writes are keyed by it; a session whose record is written cannot run again.

    ``required``: verifiers that run whatever the mood plans, and without whose PASS the
    claim is not ASSERTed (a plan item's, when it is checked whole on the integration head).

    ``plan_item``: ``claim`` is a plan's own (``PLAN.ITEM``: the plan driver's rounds); no
    other claim may hold a ``.`` (``choir.app.claim.check_claim_name``).

    ``pinned``: the blake3 of the choir.yaml bytes the caller accepts (``choir mcp``'s pin):
    other bytes are a ConfigError before anything runs or is recorded, the claim included.

    ``base``: verify with the checks of this commit of the repo (``choir.evidence.base``):
    its choir.yaml, and its spec files in place of the tree's. A tree that changes or deletes
    one of them, or adds a file changing how every check runs, is held (never PASS, no
    ASSERT) unless ``approve_spec`` (a person approved the change); one that adds a file
    shadowing a module the checks import is refused.

    Raises:
        UserError: bad configuration, a bad claim name, or a policy that refuses the sandbox
            available.
    """

    if claim is not None:
        check_claim_name(claim, plan_item=plan_item)
    session = session or new_run_id("verify")
    with span("choir.verify", {"choir.run_id": session}, key=session) as root:
        outcome = await _verify(repo.expanduser().resolve(), session, mood=mood,
                                sandbox_name=sandbox_name, on_event=on_event, claim=claim,
                                required=required, pinned=pinned, base=base,
                                approve_spec=approve_spec)
        root.set({"choir.status": outcome.status, "choir.verdict": outcome.verdict,
                  "choir.mood": outcome.contract["mood"],
                  "choir.tree_hash": outcome.contract["manifest"]["tree_hash"],
                  "choir.verifiers": len(outcome.contract["threads"]),
                  "choir.crashed": len(outcome.contract["manifest"]["crashed"])})
        return outcome


async def _verify(repo: Path, session: str, *, mood: Mood | None, sandbox_name: str | None,
                  on_event: OnEvent | None, claim: str | None,
                  required: tuple[str, ...] = (), pinned: str | None = None,
                  base: str | None = None, approve_spec: bool = False) -> VerifyOutcome:
    """``averify_tree``'s work, inside its session's span."""
    loop = asyncio.get_running_loop()
    snapshots = snapshot_root() / session  # this invocation's own: removed when it ends
    # The snapshot (git, hashing, copying: mostly waiting on git and the disk) is taken while
    # the configuration is parsed and the plan made; nothing runs on it before both are done,
    # and a configuration error still wins (the snapshot is then removed).
    full = full_rehash(mood or Mood.CALM)  # PARANOID reads every file: no stat cache
    taking = loop.run_in_executor(None, partial(snapshot_target, repo, snapshots, full=full))
    emit = on_event or _quiet
    backend: Backend | None = None
    against: Base | None = None
    try:
        if base is not None:
            if pinned is not None:  # the caller's pin holds for the tree's file too, though
                # the base's is the one read: an edit refuses the run before anything runs
                from choir.config import CONFIG_NAME
                from choir.config._yaml import check_pinned

                check_pinned(repo / CONFIG_NAME, repo, pinned)
            against = read_base(repo, base)
            config = load_repo_config(repo, committed=(
                f"{against.commit[:12]} (the base, {against.ref}: fix it on the base branch)",
                against.config))
        else:
            config = load_repo_config(repo, pinned=pinned)
        policy = load_policy(config)
        mood = mood or Mood.CALM
        # opened while the snapshot is taken, before the plan: its interpreter's vouch (a
        # walk of the venv, in a thread of its own) starts as early as the configuration
        # allows, and a sandbox the mood refuses is refused before anything runs. What it
        # says is shown after the plan, as the live view has it.
        said: list[dict[str, Any]] = []
        backend = Backend.open(config, policy, mood, name=sandbox_name, on_event=said.append)
        plan = director_plan(policy, mood, config.verifiers)
        if config.models.director:
            advice = await suggest(
                config.models.director, WorkItem(id="verify", goal="verify the tree as it is",
                                                 repo=str(repo)),
                mood=mood, attempt=1,
                planned=[p.name for p in plan.verifiers if p.replica == 0],
                specs=config.verifiers, last=[])
            plan = director_plan(policy, mood, config.verifiers, suggestion=advice.names,
                                 reason=advice.reason)
        plan = with_required(outside_a_run(plan, config.verifiers), required, config.verifiers)
        emit("progress", _plan_event(plan, mood))
        for event in said:
            emit("progress", event)
        target, verified = await taking
        judged = None if against is None else await loop.run_in_executor(None, partial(
            judge_against, against, config.spec, verified, target.tree_hash, snapshots,
            approve=approve_spec))
    except BaseException:
        if backend is not None:
            backend.close()
        await asyncio.wait([taking])  # never remove a snapshot still being written
        remove_snapshot(snapshots)
        raise
    rnd = Round(id=session, config=config, policy=policy, mood=mood, target=target,
                tree=judged.alone if judged else verified,
                on_event=lambda event: emit("progress", event), sandbox_name=sandbox_name)
    # the admitted new checks run beside the base's, as twins of every voting run: they may
    # add evidence, never make a base check pass that fails alone
    beside: Round | None = None
    if judged is not None and judged.beside is not None:
        beside = replace(rnd, tree=judged.beside)
        plan = with_additions(plan, judged.change)
        emit("progress", _plan_event(plan, mood))
    started = time.monotonic()
    planned = list(plan.verifiers)

    async def threads(chosen: list[PlannedVerifier]) -> list[Any]:
        """``chosen``'s threads, the twins on the view with the new checks beside."""
        twins = [p for p in chosen if p.replica >= ADDITIONS_REPLICA]
        if beside is None or not twins:
            return await run_round(rnd, chosen, backend=backend)
        alone = [p for p in chosen if p.replica < ADDITIONS_REPLICA]
        first, second = await asyncio.gather(run_round(rnd, alone, backend=backend),
                                             run_round(beside, twins, backend=backend))
        return first + second

    with span("choir.round", {"choir.round": session, "choir.round.kind": "verify",
                              "choir.mood": mood.value, "choir.tree_hash": target.tree_hash,
                              "choir.verifiers": len(planned)}) as this_round:
        try:
            pairs = await threads(planned)
            core_green = all(run.report.result is Result.PASS for run, _ in pairs)
            if mood is Mood.BOLD and core_green:  # BOLD broadens once the core is green
                wider = [PlannedVerifier(name=n) for n in policy.moods[mood].broaden
                         if n not in {pv.name for pv in planned}]
                planned += wider
                pairs += await threads(wider)
        except BaseException:
            backend.close()
            remove_snapshot(snapshots)
            raise
        backend.close()
        # removed beside the attestations (a few hundred unlinks), and awaited before
        # returning; with what writers killed mid-write left (housekeeping: off the path to
        # the first step, where its stats would compete with the snapshot and the launch)
        removing = loop.run_in_executor(None, remove_snapshot, snapshots)
        clearing = loop.run_in_executor(None, clear_stale_temps)
        try:
            outcome = _conclude(repo, rnd, backend, plan, planned, pairs, started, claim,
                                required, judged)
        finally:
            await removing
            await clearing  # never raises
        this_round.set({"choir.verdict": outcome.verdict, "choir.verifiers": len(planned)})
        return outcome


def _plan_event(plan: Any, mood: Mood) -> dict[str, Any]:
    """The live view's ``plan`` event for a verify session's plan."""
    return {"kind": "plan", "mood": mood.value, "round_kind": "verify",
            "verifiers": [f"{p.name}#{p.replica}" for p in plan.verifiers],
            "dropped": list(plan.dropped), "reason": plan.reason}


def with_required(plan: Any, required: tuple[str, ...], specs: Mapping[str, Any]) -> Any:
    """``plan`` with each ``required`` verifier it lacks added (one run each).

    Raises:
        UserError: a required verifier is not in the allowlist.
    """
    unknown = sorted(set(required) - set(specs))
    if unknown:
        raise UserError(f"required verifier(s) {', '.join(unknown)} are not in choir.yaml's "
                        f"allowlist: {', '.join(sorted(specs))}")
    have = {p.name for p in plan.verifiers}
    extra = [PlannedVerifier(name=n) for n in dict.fromkeys(required) if n not in have]
    if not extra:
        return plan
    return plan.model_copy(update={
        "verifiers": (*plan.verifiers, *extra),
        "reason": f"{plan.reason}; required: {', '.join(p.name for p in extra)}"[:500]})


def _conclude(repo: Path, rnd: Round, backend: Backend, plan: Any,
              planned: list[PlannedVerifier], pairs: list[Any], started: float,
              claim: str | None = None, required: tuple[str, ...] = (),
              judged: Judged | None = None) -> VerifyOutcome:
    """Attest every sealed run, write the session folder and assemble the contract."""

    session, mood, target, store = rnd.id, rnd.mood, rnd.target, rnd.store
    minted = attest_round(rnd, [run for run, _ in pairs],
                          spec_hash=judged.pin if judged else None,
                          spec_change=judged.change if judged else None)
    runs = [run for run, _ in pairs]
    sealed = [(run, result) for run, result in pairs if run.run_id in minted]
    results = [result for _, result in sealed]
    atts = [minted[run.run_id] for run, _ in sealed]
    blocked = judged.blocked if judged else None
    passed = bool(runs) and all(run.report.result is Result.PASS for run in runs) \
        and blocked is None
    status = "PASS" if passed else "FAIL"
    # per verifier, as the loop judges it: a PASS beside an INCONCLUSIVE the step made is a
    # disagreement (FLAKY, a failure), not "nothing failed" (review 17h)
    from choir.director import verdicts

    judged_runs = [*(run.report.result for run in runs), *verdicts(runs).values()]
    verdict = "FAIL" if blocked else session_verdict(judged_runs,
                                                     crashed=len(runs) - len(sealed))
    manifests = [load_manifest(store, run.manifest_hash) for run, _ in sealed]
    commands = [
        SessionCommand(name=cmd.name, verifier=m.verifier, replica=run.replica, run_id=m.run_id,
                       command=cmd.command, exit_code=cmd.exit_code, duration_ms=cmd.duration_ms)
        for (run, _), m in zip(sealed, manifests, strict=True)
        for cmd in m.commands_executed
    ]
    first = manifests[0].platform if manifests else None
    start = min((m.timestamp_start for m in manifests), default=None)
    end = max((m.timestamp_end for m in manifests), default=None)
    sandbox = backend.sandbox
    session_manifest = SessionManifest(
        run_id=session, status=status, mood=mood.value, repo=str(repo),
        timestamp_start=start.isoformat() if start else None,
        timestamp_end=end.isoformat() if end else None,
        commit_sha=target.commit_sha, tree_hash=target.tree_hash,
        commands_executed=tuple(commands),
        platform=platform_of(first, sandbox.name if sandbox else "none",
                             sandbox.isolation if sandbox else "none"),
        duration_ms=int((time.monotonic() - started) * 1000),
        runs={run.run_id: run.manifest_hash for run, _ in sealed},
        crashed=tuple(run.run_id for run in runs if run.run_id not in minted),
        attestations=tuple(att.id for att in atts),
        verification=episode((run, minted[run.run_id]) for run, _ in sealed))
    manifest_json = session_manifest.model_dump(mode="json")
    write_session(store, session, manifest_json)
    write_session_logs(store.run_dir(session),
                       run_order(session_manifest.commands_executed, list(session_manifest.runs)))
    contract: dict[str, Any] = {
        "status": status,
        "verdict": verdict,
        "run_id": session,
        "tail_log": _tail(results),
        "artifact_paths": [str(result.run_dir) for result in results],
        "summary": "; ".join(
            f"{run.verifier}: {run.report.result.value} ({shorten(run.report.summary, 120)})"
            for run in runs
        ),
        "manifest": manifest_json,
        "mood": mood.value,
        "plan": [pv.name for pv in planned],
        "plan_dropped": list(plan.dropped),
        "plan_reason": plan.reason,
        "reports": [run.report.model_dump(mode="json") for run in runs],
        "threads": [{"verifier": run.verifier, "replica": run.replica, "lens": run.lens,
                     "run_id": run.run_id, "result": run.report.result.value} for run in runs],
        "failing_tests": failing_tests(repo, runs),
        "attestations": [att.id for att in atts],
    }
    if judged is not None:
        contract["base"] = _base_section(judged)
        if blocked:
            contract["summary"] = f"spec {blocked}; " + contract["summary"]
    if claim is not None and blocked:
        contract["claim"] = {"name": claim, "asserted": None, "reason": f"spec {blocked}"}
    elif claim is not None:
        asserted, reason = record_claim(
            claim, session=session, mood=mood.value, tree_hash=target.tree_hash,
            commit_sha=target.commit_sha, runs=runs,
            minted={r: a.id for r, a in minted.items()}, required=required)
        contract["claim"] = {"name": claim, "asserted": asserted, "reason": reason}
    return VerifyOutcome(status=status, contract=contract, verdict=verdict)


def _base_section(judged: Judged) -> dict[str, Any]:
    """The contract's ``base``: which checks ran, and how the tree changed them."""
    change = judged.change
    return {"ref": judged.base.ref, "commit": judged.base.commit, "spec_hash": judged.pin,
            "blocked": judged.blocked, "approved": change.approved, "diff": change.diff,
            **{name: list(getattr(change, name)) for name in (
                "modified", "deleted", "added", "refused", "held")}}


def session_verdict(results: list[Result], *, crashed: int = 0) -> str:
    """PASS, FAIL or INCONCLUSIVE for a whole session. ``status`` stays PASS/FAIL (the
    output contract, docs/concepts.md); this says whether anything actually failed: a session
    whose verifiers could only not decide (a missing tool, a timeout) is INCONCLUSIVE, not
    FAIL. A crashed thread or a flaky verifier is a failure."""
    if results and not crashed and all(r is Result.PASS for r in results):
        return "PASS"
    if crashed or not results or any(r in (Result.FAIL, Result.FLAKY) for r in results):
        return "FAIL"
    return "INCONCLUSIVE"


def verify_tree(
    repo: Path, *, mood: Mood | None = None, sandbox_name: str | None = None,
    on_event: OnEvent | None = None, claim: str | None = None, pinned: str | None = None,
    base: str | None = None, approve_spec: bool = False,
) -> VerifyOutcome:
    """Synchronous ``averify_tree``."""
    return asyncio.run(averify_tree(repo, mood=mood, sandbox_name=sandbox_name,
                                    on_event=on_event, claim=claim, pinned=pinned, base=base,
                                    approve_spec=approve_spec))
