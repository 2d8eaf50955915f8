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

from tests import forked
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
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
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


def script_repo(path: Path, script: str, limits: str) -> Path:
    """A repo whose one step runs ``script`` (a file: no quoting to get right)."""
    path.mkdir(parents=True)
    (path / "step.py").write_text(textwrap.dedent(script))
    (path / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          step:
            kind: build
            steps:
              - name: step
                command: {STEP_PY} step.py
            limits: {limits}
        sandbox: {{backend: bwrap}}
        """))
    return path


def test_bytes_below_a_path_longer_than_path_max_fail_the_byte_cap(tmp_path: Path,
                                                                  choir_home: Path) -> None:
    """Review 21b: 17 folders of 250-character names, walked down by ``chdir``, hid 54 MiB
    from the watchdog (ENAMETOOLONG below 4,096 bytes of path) and the run PASSed with
    ``out_mb: 10`` recorded as held. Sparse files: the cap counts them whole, the disk not."""
    repo = script_repo(tmp_path / "repo", """\
        import os
        os.chdir(os.environ["CHOIR_OUT"])
        for i in range(17):
            os.mkdir(chr(97 + i) * 250)
            os.chdir(chr(97 + i) * 250)
        for n in range(6):
            with open(f"blob{n}", "wb") as fh:
                fh.truncate(9 << 20)
        """, "{out_mb: 10}")
    out = json.loads(choir("verify", "--repo", str(repo), "--json").stdout)
    assert out["status"] == "FAIL" and "limits.out_mb" in json.dumps(out), out


def test_empty_files_past_out_files_stop_the_step_and_nothing_is_kept(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 21b: empty files cost no bytes, and ``out_files`` was checked only after the
    step (7,000 files a second for its whole timeout); over it, ``out/`` was kept under
    ``aborted/`` for good. Now the watchdog stops the step and nothing is kept."""
    repo = script_repo(tmp_path / "repo", """\
        import os, time
        os.chdir(os.environ["CHOIR_OUT"])
        end, n = time.monotonic() + 30, 0
        while time.monotonic() < end:
            if n % 1000 == 0:
                os.mkdir(f"d{n // 1000}")
            open(f"d{n // 1000}/{n}", "w").close()
            n += 1
        """, "{out_mb: 1, out_files: 50}")
    proc = choir("verify", "--repo", str(repo), "--json")
    out = json.loads(proc.stdout)
    assert out["status"] == "FAIL" and "limits.out_files" in json.dumps(out), out
    runs = json.dumps(out)
    assert "timed out" not in runs
    aborted = choir_home / "artifacts" / "aborted"
    kept = [p for p in aborted.rglob("*") if p.is_file()] if aborted.exists() else []
    assert kept == []
