"""The interpreter the verifiers run is evidence, checked across runs.

The attack: between two runs, something the executor controls (a ``sandbox: none``
executor, a process it left behind) plants a ``.pth`` in the repo's ignored ``.venv`` that
makes every Python exit 0 at start-up; the next ``choir verify`` ran it and PASSed a buggy
tree. Real venvs, real git, real bwrap; ``choir verify`` as users run it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from choir.app.verify import verify_tree
from choir.attest import AttestationStore
from choir.exceptions import UserError
from choir.models import Mood

pytestmark = pytest.mark.skipif(not shutil.which("bwrap") and not os.environ.get("CI"),
                                reason="bubblewrap is not installed")
PLANT = "import os; os._exit(0)\n"  # every interpreter start ends here, "passing"


def _venv(path: Path) -> Path:
    base = os.path.realpath(sys.base_prefix) + "/bin/python3"
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    path = tmp_path / "proj"
    path.mkdir()
    _venv(path / ".venv")
    (path / ".gitignore").write_text(".venv*\n")
    (path / "mod.py").write_text("def add(a, b):\n    return a - b\n")  # the bug
    (path / "check.py").write_text("import mod\nassert mod.add(2, 2) == 4, 'add is wrong'\n")
    (path / "choir.yaml").write_text(textwrap.dedent("""\
        verifiers:
          check:
            kind: smoke
            steps:
              - name: check
                command: python3 check.py
    """))
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t",
                    "commit", "-qm", "buggy"], check=True)
    return path


def _verify(repo: Path, mood: Mood = Mood.CALM) -> dict:  # type: ignore[type-arg]
    return verify_tree(repo, mood=mood, sandbox_name="bwrap").contract


def test_a_pth_planted_between_runs_is_refused_not_run(repo: Path) -> None:
    assert _verify(repo)["status"] == "FAIL"  # the bug is seen; the venv is trusted now
    (_site(repo / ".venv") / "zz_choir_plant.pth").write_text(PLANT)
    with pytest.raises(UserError, match="not the one trusted"):
        _verify(repo)


def _slow_vouch(venv: Path) -> None:
    """A sparse GiB in the venv: the vouch must read it whole, so it takes a while (it runs
    in a thread of its own while the round gets ready: ``open_sandbox(beside=True)``)."""
    with open(_site(venv) / "zz_big.bin", "wb") as fh:
        fh.truncate(1 << 30)


@pytest.mark.parametrize("sandbox", ["bwrap", "local"])
def test_a_planted_interpreter_never_runs_while_a_slow_vouch_decides(
    repo: Path, tmp_path: Path, sandbox: str
) -> None:
    """The vouch runs beside the snapshot and the round's set-up, not before them; a review
    made it slow (a sparse GiB to hash) while the steps had already started: the planted
    ``.pth`` ran to its end in bwrap, and in the ``local`` sandbox it rewrote the trust
    record the vouch had yet to read, with the digest the vouch would measure (the
    algorithm is public), and the buggy tree PASSed, attested. Every step now waits for the
    vouch: the plant never runs, nothing is attested, the trust record stays as it was."""
    from choir.evidence.artifacts import ArtifactStore
    from choir.sandbox import resolve_sandbox
    from choir.sandbox._interpreter import _trust_file, measure

    mood = Mood.CALM if sandbox == "bwrap" else Mood.BOLD  # BOLD allows no isolation
    assert verify_tree(repo, mood=mood, sandbox_name=sandbox).contract["status"] == "FAIL"
    trusted = _trust_file(repo).read_bytes()
    _slow_vouch(repo / ".venv")
    marker, forged = tmp_path / "planted-ran", tmp_path / "forged.txt"
    plant = textwrap.dedent(f"""\
        import json, os
        for where in (os.environ.get("CHOIR_OUT", ""), {str(tmp_path)!r}):
            try:
                open(os.path.join(where, "planted-ran"), "w").write("ran")
            except OSError:
                pass
        try:
            d = open({str(forged)!r}).read().split("\\t")
            open({str(_trust_file(repo))!r}, "w").write(
                json.dumps({{"python": d[0], "digest": d[1]}}))
        except OSError:
            pass
        os._exit(0)
        """)
    (_site(repo / ".venv") / "zz_choir_plant.pth").write_text(
        "import os; exec(" + repr(plant) + ")\n")  # a .pth runs lines that start so
    box = resolve_sandbox(sandbox)
    try:
        found = measure(box.toolchain(repo), repo, full=True)  # what the vouch will find
    finally:
        box.close()
    forged.write_text(f"{found.python}\t{found.digest}")
    attested = set(AttestationStore().ids())
    with pytest.raises(UserError, match="not the one trusted"):
        verify_tree(repo, mood=mood, sandbox_name=sandbox)
    assert not marker.exists()
    assert not list(ArtifactStore().root.rglob("planted-ran"))  # nor in a run's $CHOIR_OUT
    assert _trust_file(repo).read_bytes() == trusted
    assert set(AttestationStore().ids()) == attested


def test_a_venv_link_swapped_to_a_planted_venv_is_refused(repo: Path) -> None:
    """A fresh venv under a new name has no trust record of its own: it is a change."""
    assert _verify(repo)["status"] == "FAIL"
    planted = _venv(repo / ".venv-planted")
    (_site(planted) / "zz_choir_plant.pth").write_text(PLANT)
    shutil.rmtree(repo / ".venv")
    (repo / ".venv").symlink_to(".venv-planted")
    with pytest.raises(UserError, match="not the one trusted"):
        _verify(repo)


def test_a_change_trusted_explicitly_runs_and_every_attestation_names_the_interpreter(
    repo: Path
) -> None:
    from choir.config import load_repo_config
    from choir.verification import trust_interpreter

    first = _verify(repo)
    assert first["status"] == "FAIL"
    (_site(repo / ".venv") / "harmless.pth").write_text("\n")
    trusted = trust_interpreter(load_repo_config(repo), "bwrap")
    assert trusted is not None and trusted.trust == "trusted" and trusted.scope == "tree"
    again = _verify(repo)
    assert again["status"] == "FAIL"
    env = AttestationStore().get(again["attestations"][0]).body.environment
    assert env.interpreter is not None
    assert env.interpreter.venv == os.path.realpath(repo / ".venv")
    assert env.interpreter.digest == trusted.digest and env.interpreter.in_repo
    assert env.interpreter.trust == "trusted"


def test_paranoid_refuses_an_interpreter_inside_the_repo(repo: Path) -> None:
    with pytest.raises(UserError, match="refuses the interpreter"):
        _verify(repo, Mood.PARANOID)


def test_a_venv_planted_in_a_repo_that_had_none_is_refused_not_trusted(repo: Path) -> None:
    """A repo whose verifiers ran the base Python had no trust record, so a ``.venv`` an
    executor made between runs was trusted on first use, and the next verify ran it and
    PASSed the buggy tree (a review found it, end to end through ``choir run`` too). The
    first interpreter is recorded wherever it is: one that appears in the repo later is a
    change, refused with the fix."""
    shutil.rmtree(repo / ".venv")
    assert _verify(repo)["status"] == "FAIL"  # the base Python: the bug is seen
    _venv(repo / ".venv")
    (_site(repo / ".venv") / "zz_choir_plant.pth").write_text(PLANT)
    with pytest.raises(UserError, match="not the one trusted"):
        _verify(repo)
