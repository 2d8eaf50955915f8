"""The ``verification`` field of a sealed run record (seed 003's Episode): what each
postcondition said about the action, each entry naming the attestation that proves it.

``choir audit`` re-derives every entry from its signed attestation, so an edited outcome,
severity or a listed verifier without its attestation is a violation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from choir.models import Result
from choir.models._base import Frozen

Outcome = Literal["pass", "fail", "inconclusive"]
Severity = Literal["yellow", "red"]
_OUTCOME: dict[Result, Outcome] = {Result.PASS: "pass", Result.FAIL: "fail",
                                   Result.INCONCLUSIVE: "inconclusive",
                                   Result.FLAKY: "inconclusive"}
_SEVERITY: dict[str, Severity | None] = {"pass": None, "fail": "yellow", "inconclusive": "red"}


class VerificationOutcome(Frozen):
    verifier: str
    run_id: str
    outcome: Outcome
    severity: Severity | None = None
    attestation: str


def outcome_of(verifier: str, run_id: str, result: Result,
               attestation: str) -> VerificationOutcome:
    outcome = _OUTCOME[result]
    return VerificationOutcome(verifier=verifier, run_id=run_id,
                               outcome=outcome,
                               severity=_SEVERITY[outcome], attestation=attestation)


def episode(pairs: Iterable[tuple[Any, Any]]) -> tuple[VerificationOutcome, ...]:
    """``(VerifierRun, Attestation)`` pairs -> the postconditions' outcomes, in plan order."""
    return tuple(outcome_of(run.verifier, run.run_id, att.body.result, att.id)
                 for run, att in pairs if att.body.verifier_kind == "postcondition")


def check_episode(entries: Iterable[VerificationOutcome],
                  bodies: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Audit: each entry against the signed attestation body of its run (run id -> body),
    and every attested postcondition run present."""
    problems: list[tuple[str, str, str]] = []
    seen = set()
    for entry in entries:
        seen.add(entry.run_id)
        body = bodies.get(entry.run_id)
        if body is None or body.verifier_kind != "postcondition":
            problems.append(("episode_unattested", f"a postcondition attestation of "
                                                   f"{entry.run_id}", "none"))
            continue
        want = outcome_of(body.verifier, body.run_id, body.result, entry.attestation)
        if entry != want:
            problems.append(("episode_outcome", want.model_dump_json(),
                             entry.model_dump_json()[:200]))
    for run_id, body in sorted(bodies.items()):
        if body.verifier_kind == "postcondition" and run_id not in seen:
            problems.append(("episode_missing", f"the outcome of {run_id}", "none"))
    return problems


def seal_round(session: str, runs: Iterable[Any], minted: Mapping[str, str], *,
               mood: str) -> str | None:
    """Seal the record of one action in ``choir run``: the round's attested runs, under
    ``runs/{session}/manifest.json`` in the verify-session shape, with the postconditions'
    outcomes under ``verification``. ``choir audit`` checks it like a verify session (every
    run attested, status and outcomes re-derived). Only rounds with a postcondition get one;
    a replayed node finds the record already sealed and writes nothing.
    """
    from choir.artifacts import ArtifactStore
    from choir.attest import AttestationStore
    from choir.verification import load_manifest
    from choir.verify import SessionCommand, SessionManifest, _platform, _write_session

    store, atts = ArtifactStore(), AttestationStore()
    pairs = [(run, atts.get(minted[run.run_id])) for run in runs if run.run_id in minted]
    entries = episode(pairs)
    if not entries:
        return None
    if (store.run_dir(session) / "manifest.json").exists():
        return session
    manifests = [load_manifest(store, run.manifest_hash) for run, _ in pairs]
    first = manifests[0]
    passed = all(att.body.result is Result.PASS for _, att in pairs)
    record = SessionManifest(
        run_id=session, status="PASS" if passed else "FAIL", mood=mood,
        timestamp_start=min(m.timestamp_start for m in manifests).isoformat(),
        timestamp_end=max(m.timestamp_end for m in manifests).isoformat(),
        commit_sha=first.commit_sha, tree_hash=first.tree_hash,
        commands_executed=tuple(
            SessionCommand(name=c.name, verifier=m.verifier, replica=run.replica,
                           run_id=m.run_id, command=c.command, exit_code=c.exit_code,
                           duration_ms=c.duration_ms)
            for (run, _), m in zip(pairs, manifests, strict=True) for c in m.commands_executed),
        platform=_platform(first.platform, first.platform.sandbox, first.platform.isolation),
        duration_ms=int((max(m.timestamp_end for m in manifests)
                         - min(m.timestamp_start for m in manifests)).total_seconds() * 1000),
        runs={run.run_id: run.manifest_hash for run, _ in pairs},
        attestations=tuple(att.id for _, att in pairs), verification=entries)
    try:
        _write_session(store, session, record.model_dump(mode="json"))
    except FileExistsError:  # an earlier replay died between the folder and the file
        import json

        from choir.artifacts import write_once

        data = json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True).encode()
        write_once(store.run_dir(session) / "manifest.json", data + b"\n",
                   f"run {session}: manifest already written")
    return session
