"""``choir attest bundle`` and ``choir gate --vsa``: Choir's evidence for in-toto tools.

A bundle is JSON Lines of DSSE envelopes (the in-toto bundle format), two per attestation:
Choir's own statement and the in-toto test result (``choir.attest.standard``). Only
attestations that re-verify now (id, signature, stored evidence) and were signed by a pinned,
unrevoked key are bundled: a bundle never vouches for what ``choir gate`` would refuse. A gate
decision becomes a SLSA verification summary, PASSED or FAILED, on the attestations the gate
checked. Every envelope is signed by the broker (``choir.trusted.checks`` decides what it signs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from choir.app.gate import GateAnswer
from choir.attest import AttestationStore, load_signer, trust_root, verify_attestation
from choir.attest.intoto import sign_statement
from choir.attest.standard import bundle, summary_statement
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError, UserError
from choir.models import Attestation
from choir.verification.session import belongs_to, session_attestations


def bundle_envelopes(ids: Sequence[str] = (), session: str | None = None) -> list[dict[str, Any]]:
    """The envelopes of the attestations named by ``ids`` (unique prefixes) and of the
    ``choir verify`` session ``session``, in that order, each once.

    Raises:
        UserError: nothing named, or an id that matches no attestation or several.
        NotFoundError: no such session.
        IntegrityError: an attestation does not re-verify or its key is not trusted (each
            named), or it is not the session's.
    """
    store, artifacts = AttestationStore(), ArtifactStore()
    named = [store.find(prefix) for prefix in ids]
    chosen = list(named)
    if session is not None:
        chosen += session_attestations(artifacts, session)
    if not chosen:
        raise UserError("attest bundle: name attestation ids or --session RUN_ID")
    root = trust_root()
    loaded: list[Attestation] = []
    problems: list[str] = []
    for att_id in dict.fromkeys(chosen):
        att = store.get(att_id)
        problems += [f"attestation {att_id[:12]}: {v.kind}: expected {v.expected}, found "
                     f"{v.found}" for v in verify_attestation(att, artifacts=artifacts,
                                                              trusted_keys=root.keys,
                                                              revoked_keys=root.revoked)]
        if session is not None and att_id not in named and not belongs_to(session, att.body.run_id):
            problems.append(f"attestation {att_id[:12]}: run {att.body.run_id} is not of "
                            f"session {session}")
        loaded.append(att)
    if problems:
        raise IntegrityError("not bundled: " + "; ".join(problems))
    return bundle(loaded, load_signer(), artifacts)


def gate_envelope(answer: GateAnswer, resource_uri: str | None = None) -> dict[str, Any]:
    """The signed SLSA verification summary of one gate decision.

    ``resource_uri`` names what was verified for the consumer (in CI: the repository and
    ref); default ``choir:claim:NAME``.

    Raises:
        UserError: the gate decided on no tree and no commit, so there is no subject.
    """
    if answer.tree_hash is None and answer.commit_sha is None:
        raise UserError(f"gate: no tree or commit was checked for {answer.work_item}, so no "
                        "verification summary can name one")
    store = AttestationStore()
    checked = [store.get(att_id) for att_id in answer.attestations]
    try:
        statement = summary_statement(
            claim=answer.work_item, tree_hash=answer.tree_hash, commit_sha=answer.commit_sha,
            passed=answer.passed, attestations=checked,
            resource_uri=resource_uri or f"choir:claim:{answer.work_item}")
    except ValidationError as err:
        raise UserError(f"gate --vsa: no verification summary can be made: {err}"[:800]
                        + "\n  fix: a --resource-uri of at most 1024 characters, no controls"
                        ) from None
    return sign_statement(statement, load_signer())
