"""Bytecode an executor leaves in the working tree (review 18b #4): an unchecked-hash
``__pycache__/calc.*.pyc`` beside a correct ``calc.py``, in a folder git ignores, is outside
the tree hash and every snapshot, so the run ASSERTed the source while whoever runs the
working tree after the gate opened got the planted bytecode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY

pytestmark = pytest.mark.bwrap

FIX = """\
import importlib.util, os, py_compile, sys, tempfile
os.chdir(sys.argv[1])
evil = os.path.join(tempfile.mkdtemp(), "evil.py")
open(evil, "w").write("def add(a, b):\\n    return a * 100\\n")
py_compile.compile(evil, cfile=importlib.util.cache_from_source("calc.py"),
                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
open("calc.py", "w").write("def add(a, b):\\n    return a + b\\n")
"""


def test_bytecode_the_executor_leaves_in_the_working_tree_is_removed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text("__pycache__/\n")
    (repo / "choir.yaml").write_text("sandbox: {backend: bwrap}\nverifiers:\n"
                                     "  unit: {uses: pytest}\n")
    (repo / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n"
                                       "    assert add(2, 3) == 5\n")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    (tmp_path / "fix.py").write_text(FIX)
    item = tmp_path / "item.yaml"
    item.write_text("id: fix-add\ngoal: add must return the sum\nrepo: ./repo\nmood: CALM\n"
                    f"executor: {{kind: command, command: '{sys.executable} ../fix.py .', "
                    "sandbox: bwrap}\n")
    env = {**os.environ, "CHOIR_HOME": str(tmp_path / "home"),
           "CHOIR_ARTIFACT_DIR": str(tmp_path / "home" / "artifacts")}
    ran = forked.run([PY, "-m", "choir", "run", str(item)], capture_output=True, text=True,
                     timeout=300, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "bytecode" in ran.stdout + ran.stderr, ran.stderr  # the run says what it removed
    assert not list((repo / "__pycache__").glob("calc.*.pyc"))
    used = subprocess.run([sys.executable, "-c", "from calc import add; print(add(2, 3))"],
                          cwd=repo, capture_output=True, text=True, check=True)
    assert used.stdout.strip() == "5"
