"""A session record: the manifest of a whole ``choir verify`` (and of one action's round in
``choir run``) at ``runs/{run_id}/manifest.json``, how it is written once, and how ``choir
audit`` checks it against the attestations it lists.

The manifest says things no attestation signs (its commands, times, mood, platform), so it is
sealed (``choir.verification.seal``): ``seal.json`` beside it holds the home key's signature
over the manifest's blake3. A changed byte, a missing seal, or a session whose attestations
remain but whose folder is gone is a named violation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import Field

from choir._core.canonical import blake3_hex, canonical_json
from choir.attest import AttestationStore
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError, NotFoundError
from choir.models import Result
from choir.models._base import Frozen
from choir.models.manifest import Platform
from choir.postconditions.episode import VerificationOutcome, check_episode, episode
from choir.verification import load_manifest
from choir.verification.seal import Seal, make_seal, open_record, seal_problem
from choir.verification.session_logs import check_session_logs, run_order

if TYPE_CHECKING:
    from choir.attest import SigningKey
    from choir.models import Attestation

SESSION_KIND: Final = "verify_session"
SEAL = "seal.json"
MAX_SEAL = 4096
MAX_MANIFEST = 16 << 20
# a `choir verify` green thread's run id: the session's id, the verifier, the replica
_SESSION_THREAD = re.compile(r"^(verify-\d{8}T\d{6}-[0-9a-f]{6})-.+-\d+$")


class SessionCommand(Frozen):
    """One executed step of a ``choir verify``: named by its step, with its verifier beside."""

    name: str
    verifier: str
    replica: int = 0
    run_id: str
    command: str
    exit_code: int
    duration_ms: int


class SessionManifest(Frozen):
    """The manifest of a whole ``choir verify``, at ``runs/{run_id}/manifest.json``.

    It holds no evidence of its own: ``runs`` maps each verifier run folder to the hash of its
    manifest, which an attestation signs, so ``choir audit`` can check every claim here
    against signed evidence (a session listing an unattested manifest is a violation).
    """

    schema_version: int = 1
    kind: str = Field(default=SESSION_KIND, pattern=f"^{SESSION_KIND}$")
    run_id: str
    status: str = Field(pattern="^(PASS|FAIL)$")
    mood: str
    # the repo verified, as given resolved: one CHOIR_HOME serves many repos, and runs must be
    # told apart (None in sessions written before it was recorded)
    repo: str | None = None
    timestamp_start: str | None
    timestamp_end: str | None
    commit_sha: str | None
    tree_hash: str
    commands_executed: tuple[SessionCommand, ...]
    platform: dict[str, str | None]
    duration_ms: int
    runs: dict[str, str]
    # green threads that crashed: no evidence, nothing attested, and the session FAILs
    crashed: tuple[str, ...] = ()
    attestations: tuple[str, ...]
    # postconditions' outcomes, each re-derived from its attestation by the audit
    verification: tuple[VerificationOutcome, ...] = ()


def is_session_manifest(data: object) -> bool:
    """True for a parsed ``manifest.json`` written by ``choir verify`` for its session."""
    return isinstance(data, dict) and data.get("kind") == SESSION_KIND


def is_session_folder(manifest_path: Path) -> bool:
    """True when ``manifest_path`` parses as JSON and says it is a verify session's."""
    return _session_bytes(manifest_path.parent) is not None


def _read_manifest(path: Path) -> bytes:
    """A session manifest's bytes, size-capped, never through a link or from a FIFO.

    Raises:
        OSError: unreadable. IntegrityError: a link, not a regular file, or too large.
    """
    with open_record(path) as fh:
        data = fh.read(MAX_MANIFEST + 1)
    if len(data) > MAX_MANIFEST:
        raise IntegrityError(f"{path}: larger than {MAX_MANIFEST} bytes")
    return data


def _check_seal(run_dir: Path, data: bytes, trusted: Collection[str]) -> str | None:
    """Why ``seal.json`` does not vouch for the manifest bytes ``data``, or None."""
    try:
        with open_record(run_dir / SEAL) as fh:
            seal = Seal.model_validate_json(fh.read(MAX_SEAL + 1))
    except FileNotFoundError:
        return "absent"
    except (OSError, ValueError, IntegrityError) as exc:
        return f"unreadable: {str(exc)[:150]}"
    return seal_problem(seal, kind=SESSION_KIND, subject=run_dir.name, digest=blake3_hex(data),
                        trusted=trusted)


def _session_bytes(run_dir: Path) -> tuple[bytes, dict[str, Any]] | None:
    """A verify session's ``manifest.json``, its bytes and parsed, read as ``check_session``
    reads it: never through a link or from a FIFO (a planted one would hang the reader),
    size-capped. None when the folder holds no such record."""
    try:
        data = _read_manifest(run_dir / "manifest.json")
        parsed = json.loads(data)
    except (OSError, ValueError, IntegrityError):
        return None
    return (data, parsed) if is_session_manifest(parsed) else None


def read_session(run_dir: Path) -> dict[str, Any] | None:
    """A verify session's manifest as stored (its seal unchecked), or None. Every reader of
    a session's record outside the audit goes through here or ``read_sealed_session``:
    ``runs list/show``, the viewer, ``choir mcp``."""
    read = _session_bytes(run_dir)
    return read[1] if read is not None else None


UNCHECKED = "UNCHECKED: no key is pinned on this home yet"


def read_sealed_session(run_dir: Path, trusted: Collection[str] | None
                        ) -> tuple[dict[str, Any], str] | None:
    """``read_session`` and its seal's verdict over the very bytes read: ``valid``, or
    ``INVALID: why`` (the status it says is then vouched for by nobody), or ``UNCHECKED``
    when ``trusted`` is None (a home where no key is pinned: nothing could vouch)."""
    read = _session_bytes(run_dir)
    if read is None:
        return None
    if trusted is None:
        return read[1], UNCHECKED
    problem = _check_seal(run_dir, read[0], trusted)
    return read[1], "valid" if problem is None else f"INVALID: {problem}"


def check_session(run_dir: Path, attestations: Any,
                  trusted: Collection[str]) -> list[tuple[str, str, str]]:
    """What ``choir audit`` finds wrong with a verify session's folder, as (kind, expected,
    found). The folder holds its manifest, its seal and its logs only; the seal is by a
    trusted key over exactly these manifest bytes; every run the manifest lists is backed by a
    valid attestation in the list, with the same target; PASS only if every one of them passed.
    """

    problems: list[tuple[str, str, str]] = []
    extra = sorted(p.name for p in run_dir.iterdir()
                   if p.name not in ("manifest.json", "logs", SEAL))
    if extra:
        problems.append(("session_extra_file", f"manifest.json, logs/ and {SEAL} only",
                         ", ".join(extra)[:200]))
    try:
        data = _read_manifest(run_dir / "manifest.json")
        session = SessionManifest.model_validate_json(data)
    except (OSError, ValueError, IntegrityError) as exc:
        return [*problems, ("session_manifest", "a valid verify session manifest",
                            str(exc)[:200])]
    unsealed = _check_seal(run_dir, data, trusted)
    if unsealed is not None:
        problems.append(("session_seal", "manifest.json sealed by a trusted key",
                         unsealed[:200]))
    if (run_dir / "logs").exists() or session.repo is not None:
        # every session written since the run-folder logs were added has them (a verify
        # session also names its repo, so deleting its logs/ is caught too)
        problems += check_session_logs(run_dir, run_order(session.commands_executed,
                                                          list(session.runs)))
    if session.run_id != run_dir.name:
        problems.append(("session_run_id", run_dir.name, session.run_id))
    backed: dict[str, Any] = {}
    for att_id in session.attestations:
        try:
            body = attestations.get(att_id).body
        except (IntegrityError, OSError, ValueError) as exc:
            problems.append(("session_attestation", f"attestation {att_id}", str(exc)[:200]))
            continue
        if session.runs.get(body.run_id) != body.manifest_hash:
            problems.append(("session_run_unattested", f"{body.run_id}: {body.manifest_hash}",
                             str(session.runs.get(body.run_id))))
        if body.target.tree_hash != session.tree_hash:
            problems.append(("session_target", session.tree_hash, body.target.tree_hash))
        backed[body.run_id] = body
    problems += check_episode(session.verification, backed)
    for run_id in sorted(set(session.runs) - set(backed)):
        problems.append(("session_run_unattested", f"an attestation of {run_id}", "none"))
    for cmd in session.commands_executed:
        if cmd.run_id not in session.runs:
            problems.append(("session_command", "a run of this session", cmd.run_id))
    # a tree verified against a base (``choir verify --base``) whose change to the base's
    # checks was refused, or held with no approval, is no PASS: each attestation signs it
    passed = (bool(backed) and not session.crashed
              and all(b.result is Result.PASS for b in backed.values())
              and not any(b.spec_change is not None and b.spec_change.blocks
                          for b in backed.values()))
    if session.status != ("PASS" if passed else "FAIL"):
        problems.append(("session_status", "PASS" if passed else "FAIL", session.status))
    return problems


def session_attestations(store: ArtifactStore, run_id: str) -> tuple[str, ...]:
    """The ids of the attestations a ``choir verify`` session minted, from its manifest.

    Only attestations of the session's own green threads are listed: whoever uses them loads
    each by id, which re-derives it, and judges its signature (``choir attest bundle``).

    Raises:
        UserError: ``run_id`` is not a run id. NotFoundError: no session of that id.
        IntegrityError: its manifest is a link, oversized or not a session's.
    """
    path = store.run_dir(run_id) / "manifest.json"
    try:
        session = SessionManifest.model_validate_json(_read_manifest(path))
    except FileNotFoundError:
        raise NotFoundError(f"no choir verify session {run_id} (no {path})") from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path}: not a verify session's manifest: {exc}"[:300]) from None
    return session.attestations


def belongs_to(session: str, run_id: str) -> bool:
    """True when ``run_id`` is a green thread of the ``choir verify`` session ``session``."""
    found = _SESSION_THREAD.match(run_id)
    return found is not None and found.group(1) == session


def platform_of(first: Platform | None, sandbox: str, isolation: str) -> dict[str, str | None]:
    return {"os": first.os if first else "", "arch": first.arch if first else "",
            "container_image": first.container_image if first else None,
            "sandbox": sandbox, "isolation": isolation}


def missing_sessions(store: ArtifactStore,
                     attestations: Iterable[Attestation]) -> list[tuple[str, str, str, str]]:
    """(kind, object, expected, found) for each ``choir verify`` session that minted one of
    ``attestations`` (the valid ones) but whose sealed record is gone."""
    found: list[tuple[str, str, str, str]] = []
    for session in sorted({m.group(1) for att in attestations
                           if (m := _SESSION_THREAD.match(att.body.run_id))}):
        if not is_session_folder(store.run_dir(session) / "manifest.json"):
            found.append(("session_missing", session, "the session's sealed manifest, as its "
                          "attestations were minted", "absent"))
    return found


def _write_sealed(store: ArtifactStore, session: str, data: bytes,
                  signer: SigningKey | None) -> None:
    """The manifest and its seal, each written once: the seal signed first, then both
    written and linked back to back (``write_run_files``), so a ``choir verify`` killed
    there leaves a manifest without its seal only in the gap between two ``link`` calls
    (it was a signature, a write and two fsyncs). Signing is deterministic (ed25519), so a
    replay writes the very same seal."""
    from choir.attest import load_signer

    seal = make_seal(SESSION_KIND, session, 0, blake3_hex(data), signer or load_signer())
    store.write_run_files(session, [
        ("manifest.json", data, f"run {session}: manifest already written"),
        (SEAL, canonical_json(seal) + b"\n", f"run {session}: seal already written")])


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"


def write_session(store: Any, session: str, manifest: dict[str, Any],
                  signer: SigningKey | None = None) -> None:
    """Write the session's run folder: ``runs/{session}/manifest.json`` and its seal, once,
    read-only (``signer``: the home's by default)."""
    folder = store.run_dir(session)
    folder.mkdir(parents=True, exist_ok=False)
    _write_sealed(store, session, _manifest_bytes(manifest), signer)


def seal_round(session: str, runs: Iterable[Any], minted: Mapping[str, str], *,
               mood: str) -> str | None:
    """Seal the record of one action in ``choir run``: the round's attested runs, under
    ``runs/{session}/manifest.json`` in the verify-session shape, with the postconditions'
    outcomes under ``verification``. ``choir audit`` checks it like a verify session (every
    run attested, status and outcomes re-derived). Only rounds with a postcondition get one;
    a replayed node finds the record already sealed and writes nothing.
    """
    store, atts = ArtifactStore(), AttestationStore()
    pairs = [(run, atts.get(minted[run.run_id])) for run in runs if run.run_id in minted]
    entries = episode(pairs)
    if not entries:
        return None
    if (store.run_dir(session) / SEAL).exists():
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
        platform=platform_of(first.platform, first.platform.sandbox, first.platform.isolation),
        duration_ms=int((max(m.timestamp_end for m in manifests)
                         - min(m.timestamp_start for m in manifests)).total_seconds() * 1000),
        runs={run.run_id: run.manifest_hash for run, _ in pairs},
        attestations=tuple(att.id for _, att in pairs), verification=entries)
    try:
        write_session(store, session, record.model_dump(mode="json"))
    except FileExistsError:  # an earlier replay died between the folder and the seal
        _write_sealed(store, session,
                      _manifest_bytes(record.model_dump(mode="json")), None)
    return session
