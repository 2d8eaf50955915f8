"""``remove_new_bytecode``: what an attempt compiled goes, when it is a cache or outside the
tree; a sourceless module in the tree stays for the spec to refuse (review 18b #4)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from choir.evidence.bytecode import remove_new_bytecode


def test_caches_and_ignored_bytecode_go_and_a_module_in_the_tree_stays(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "__pycache__").mkdir(parents=True)
    (repo / "build").mkdir()
    (repo / ".gitignore").write_text("build/\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "build" / "old.pyc").write_bytes(b"before the attempt")
    time.sleep(0.1)
    began = time.time_ns()
    time.sleep(0.1)
    for rel in ("__pycache__/calc.cpython-311.pyc", "build/gen.pyc", "pytest.pyc"):
        (repo / rel).write_bytes(b"made by the attempt")
    assert remove_new_bytecode(repo, began) == ["__pycache__/calc.cpython-311.pyc",
                                                "build/gen.pyc"]
    assert (repo / "pytest.pyc").exists()  # a module in the tree: the spec's to refuse
    assert (repo / "build" / "old.pyc").exists()  # not the attempt's
