"""Review 23b, end to end in bubblewrap: no sandbox reaches a host socket through a folder
that holds a shared temp root, and the binds a verifier's steps saw are in its attestation.

The stand-in for /var is a private folder whose ``scratch`` is made a shared root
(``SHARED_ROOTS``), with a host service listening there on a Unix socket.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.models import WorkItem
from choir.sandbox import _toolchain
from tests.hostsocket import Listener, connecting

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short path (a socket's fits in 108 bytes), traversable by the sandbox's nobody."""
    root = Path(tempfile.mkdtemp(prefix="c23-", dir="/tmp"))
    root.chmod(0o755)
    (root / "scratch").mkdir(mode=0o755)
    monkeypatch.setattr(_toolchain, "SHARED_ROOTS", (str(root / "scratch"),))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_an_executor_beside_a_shared_root_reaches_no_socket_and_still_works(box: Path) -> None:
    from choir.executors import run_command

    repo = box / "repo"
    repo.mkdir(mode=0o755)
    sock = box / "scratch" / "s.sock"
    server = Listener(sock)
    try:
        item = WorkItem(id="var", goal="g", repo=str(repo), executor={  # type: ignore[arg-type]
            "kind": "command", "command": connecting(sock)})
        out = run_command(item, 1, [])
    finally:
        heard = server.close()
    assert heard == [], f"the executor reached a host socket beside its repo: {heard}"
    assert out.isolation == "namespace"
    assert (repo / "seen.txt").read_text() == "done\n"  # the repo itself is bound, writable


def test_a_verify_with_a_bind_records_it_in_its_attestation(tmp_path: Path) -> None:
    from choir.app.verify import verify_tree
    from choir.attest.store import AttestationStore
    from choir.models import Mood

    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "seed.txt").write_text("SEED\n")
    repo = tmp_path / "repo"
    repo.mkdir(mode=0o755)
    (repo / "choir.yaml").write_text(textwrap.dedent(f"""\
        sandbox:
          binds: [{data}]
        verifiers:
          seed:
            kind: smoke
            steps:
              - {{name: read, command: "grep -q SEED {data}/seed.txt"}}
        """))
    contract = verify_tree(repo, mood=Mood.CALM, sandbox_name="bwrap").contract
    assert contract["reports"][0]["result"] == "PASS", contract["tail_log"]
    body = AttestationStore().get(contract["attestations"][0]).body
    assert body.environment.binds == (os.path.realpath(data),)
