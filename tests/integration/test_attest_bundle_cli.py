"""``choir attest bundle`` and ``choir gate --vsa`` on a real verify session.

The bundle vouches for nothing the gate would refuse: an attestation that does not re-verify
or was signed by a key that is not pinned is not bundled, and neither is one a session's
folder lists but that is not the session's own.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from choir.evidence.artifacts import ArtifactStore
from tests.integration.test_verify_cli import CALC_BUG, CALC_OK, make_repo, run, sandbox_name

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes


def verified(tmp_path: Path, source: str = CALC_OK, claim: str = "feature") -> dict[str, Any]:
    repo = make_repo(tmp_path / "repo", source)
    proc = run("verify", "--repo", str(repo), "--json", "--claim", claim,
               "--sandbox", sandbox_name())
    assert proc.returncode in (0, 1), proc.stderr
    contract: dict[str, Any] = json.loads(proc.stdout)
    return contract


def statements(path: Path) -> list[dict[str, Any]]:
    return [json.loads(base64.b64decode(json.loads(line)["payload"]))
            for line in path.read_text().splitlines()]


def test_a_session_bundles_and_the_gate_writes_its_vsa(tmp_path: Path) -> None:
    contract = verified(tmp_path)
    out = tmp_path / "b.jsonl"
    proc = run("attest", "bundle", "--session", contract["run_id"], "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    stmts = statements(out)
    assert len(stmts) == 2 * len(contract["attestations"])
    assert {s["predicate"]["id"] for s in stmts[::2]} == set(contract["attestations"])
    by_id = run("attest", "bundle", contract["attestations"][0][:12])
    assert by_id.returncode == 0 and len(by_id.stdout.splitlines()) == 2
    vsa = tmp_path / "vsa.json"
    gate = run("gate", "feature", "--repo", str(tmp_path / "repo"), "--vsa", str(vsa),
               "--resource-uri", "git+https://example.com/r")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    [summary] = statements(vsa)
    assert summary["predicate"]["verificationResult"] == "PASSED"
    assert summary["predicate"]["resourceUri"] == "git+https://example.com/r"


def test_a_refused_gate_writes_a_failed_vsa(tmp_path: Path) -> None:
    verified(tmp_path, CALC_BUG)
    vsa = tmp_path / "vsa.json"
    gate = run("gate", "feature", "--repo", str(tmp_path / "repo"), "--vsa", str(vsa))
    assert gate.returncode == 1
    [summary] = statements(vsa)
    assert summary["predicate"]["verificationResult"] == "FAILED"
    assert summary["predicate"]["resourceUri"] == "choir:claim:feature"
    bad = run("gate", "feature", "--repo", str(tmp_path / "repo"), "--vsa", str(vsa),
              "--resource-uri", "u" * 1025)
    assert bad.returncode == 2 and "--resource-uri" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_an_untrusted_or_broken_attestation_is_not_bundled(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    contract = verified(tmp_path)
    out = tmp_path / "b.jsonl"
    monkeypatch.setenv("CHOIR_TRUSTED_KEYS", "0" * 32)
    proc = run("attest", "bundle", "--session", contract["run_id"], "--out", str(out))
    assert proc.returncode == 1 and "not bundled" in proc.stderr and "untrusted" in proc.stderr
    assert not out.exists()
    monkeypatch.delenv("CHOIR_TRUSTED_KEYS")
    report = json.loads(run("attest", "show", contract["attestations"][0]).stdout)
    blob = ArtifactStore().path_of(report["body"]["report_hash"])
    blob.chmod(0o644)
    blob.write_bytes(b"{}")
    proc = run("attest", "bundle", "--session", contract["run_id"], "--out", str(out))
    assert proc.returncode == 1 and "not bundled" in proc.stderr
    assert not out.exists()


def test_a_session_folder_cannot_lend_another_sessions_attestations(tmp_path: Path) -> None:
    contract = verified(tmp_path)
    runs = Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "runs"
    planted = runs / "verify-20260101T000000-abcdef"
    planted.mkdir()
    shutil.copy(runs / contract["run_id"] / "manifest.json", planted / "manifest.json")
    proc = run("attest", "bundle", "--session", planted.name)
    assert proc.returncode == 1 and f"is not of session {planted.name}" in proc.stderr
    missing = run("attest", "bundle", "--session", "verify-20260101T000000-000000")
    assert missing.returncode != 0 and "no choir verify session" in missing.stderr
    assert run("attest", "bundle").returncode == 2
