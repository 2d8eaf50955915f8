"""Make real evidence for tests: a real verifier run in a real sandbox, a real report, a real
signed attestation. Nothing here is mocked."""

from __future__ import annotations

import asyncio
from pathlib import Path

from choir.attest import AttestationStore, load_signer
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.models import Attestation, StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import get_sandbox
from choir.verification import attest_run, run_verifier_thread

_counter = 0


def make_repo(path: Path, content: str = "x = 1\n") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "mod.py").write_text(content)
    return path


def attest(repo: Path, verifier: str, command: str, *, work_item: str | None = "wi",
           sandbox: str = "local") -> Attestation:
    """Run ``command`` as verifier ``verifier`` against ``repo`` and return its attestation."""
    global _counter
    _counter += 1
    spec = VerifierSpec(name=verifier, kind=VerifierKind.UNIT_TESTS,
                        steps=(StepSpec(name="check", command=command),), timeout_s=30)
    target = Target(work_item=work_item, tree_hash=tree_hash(repo))
    store = ArtifactStore()
    run, _ = asyncio.run(run_verifier_thread(
        spec, repo=repo, target=target, sandbox=get_sandbox(sandbox), store=store,
        run_id=f"t{_counter}-{verifier}"))
    return attest_run(run, spec, store=store, signer=load_signer(),
                      attestations=AttestationStore(), policy_hash=None, mood="CALM")
