"""Every output a step produces is bounded: file count and depth of ``$CHOIR_OUT``, and the
size of the attestation that names them.

The attack: a step writes tens of thousands of empty files. They pass the byte cap, and each
one used to be listed in the run manifest and again in the attestation, which then grew past
what Choir itself reads back (4 MiB): ``choir verify`` crashed and every later ``choir
audit`` stayed red. Real bwrap sandbox, real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.workitems import PY, STEP_PY

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

SPAM = ("import os; d = os.environ['CHOIR_OUT']; "
        "[open(os.path.join(d, format(i, '0160d')), 'w').close() for i in range({n})]")
DEEP = ("import os; d = os.environ['CHOIR_OUT']; "
        "os.makedirs(os.path.join(d, *['d'] * {n})); "
        "open(os.path.join(d, *['d'] * {n}, 'leaf'), 'w').close()")


def spam_repo(path: Path, command: str, limits: str = "") -> Path:
    path.mkdir(parents=True)
    (path / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          spam:
            kind: build
            steps:
              - name: spam
                command: {STEP_PY} -c "{command}"
        """) + (f"    limits: {limits}\n" if limits else "") + "sandbox: {backend: bwrap}\n")
    return path


def choir(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                          timeout=600)


def largest_attestation(home: Path) -> int:
    return max(p.stat().st_size for p in (home / "attestations").rglob("*.json"))


@pytest.mark.slow  # about 20 s: 25,000 files made in a sandbox, then counted
def test_many_empty_files_in_choir_out_fail_on_the_file_cap_and_stay_auditable(
        tmp_path: Path, choir_home: Path) -> None:
    repo = spam_repo(tmp_path / "repo", SPAM.format(n=25_000))
    proc = choir("verify", "--repo", str(repo), "--json")
    assert proc.returncode == 1 and proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "FAIL"
    assert "limits.out_files" in json.dumps(out), out["reports"]
    assert largest_attestation(choir_home) < 64 << 10
    audit = choir("audit")
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]


def test_a_configured_file_cap_and_depth_cap_hold(tmp_path: Path, choir_home: Path) -> None:
    few = spam_repo(tmp_path / "few", SPAM.format(n=30), limits="{out_files: 20}")
    out = json.loads(choir("verify", "--repo", str(few), "--json").stdout)
    assert out["status"] == "FAIL" and "more than 20 files" in json.dumps(out)
    deep = spam_repo(tmp_path / "deep", DEEP.format(n=40), limits="{out_depth: 8}")
    out = json.loads(choir("verify", "--repo", str(deep), "--json").stdout)
    assert out["status"] == "FAIL" and "deeper than 8 folders" in json.dumps(out)
    ok = spam_repo(tmp_path / "ok", SPAM.format(n=20), limits="{out_files: 20}")
    out = json.loads(choir("verify", "--repo", str(ok), "--json").stdout)
    assert out["status"] == "PASS", out
    assert choir("audit").returncode == 0
    assert os.path.isdir(choir_home / "attestations")
