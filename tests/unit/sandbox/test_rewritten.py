"""``choir.sandbox.rewritten``: pytest's rewritten test modules, made by Choir's own pytest.

Each case runs the pytest preset's real wrapper (``$CHOIR_PYTEST``) with this venv's pytest
on a tree, the way a step runs it, with ``PYTEST_DEBUG`` on: pytest's own trace says which
modules it found a cached rewrite for, and which it rewrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from choir.sandbox import rewritten
from choir.sandbox.base import pytest_source

CALC = "def add(a, b):\n    return a + b\n"
TESTS = {"calc.py": CALC,
         "tests/test_calc.py":
             "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 6\n",
         "tests/conftest.py": "import sys, os\nsys.path.insert(0, os.getcwd())\n",
         "other_test.py": "def test_ok():\n    assert True\n"}


def tree_of(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def step(tree: Path, folder: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DEBUG": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "CHOIR_PYTEST_PYC": str(folder or ""), "CHOIR_PYTEST_ROOT": str(tree)}
    return subprocess.run([sys.executable, "-c", pytest_source(), "-q", "-p",
                           "no:cacheprovider", *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


def found(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return sorted(Path(line.split("found cached rewritten pyc for ")[1].split()[0]).name
                  for line in (proc.stdout + proc.stderr).splitlines()
                  if "found cached rewritten pyc for " in line)


@pytest.fixture
def cache(choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if rewritten.tail() is None:
        pytest.skip("this pytest keeps no checked-hash rewrites (before 9.2)")
    monkeypatch.setattr(rewritten, "_filling", [True])
    monkeypatch.setattr(rewritten, "_pending", {})
    monkeypatch.setattr(rewritten, "_kept", [0])
    return rewritten.root()


def test_a_filled_rewrite_is_loaded_by_the_step_and_fails_as_pytests_own(
        tmp_path: Path, cache: Path) -> None:
    first = tree_of(tmp_path / "first", TESTS)
    with rewritten.for_step(first) as folder:
        assert folder is None  # nothing made yet: noted for the fill
    assert rewritten.fill() == 3  # both test modules and the conftest
    made = [p for p in cache.rglob("*") if p.is_file()]
    assert all(oct(p.stat().st_mode & 0o777) == "0o444" for p in made)
    assert not any(str(first).encode() in p.read_bytes() for p in made)  # no tree's path
    tree = tree_of(tmp_path / "second", TESTS)  # the same bytes, sealed at another path
    plain = step(tree, None)
    with rewritten.for_step(tree) as folder:
        assert folder is not None
        served = step(tree, folder)
        assert found(served) == ["conftest.py", "other_test.py", "test_calc.py"], served.stderr
    assert not folder.exists()  # one step's folder, removed after it
    assert found(plain) == []  # the control: without the folder pytest rewrote each itself
    # the same failure, said the same way: pytest's assertion rewrite, at this tree's path
    # (the code was compiled at the first tree's: pytest fixes the name as it loads it)
    assert served.returncode == plain.returncode == 1
    for proc in (plain, served):
        assert "assert 5 == 6" in proc.stdout, proc.stdout
        assert "\ntests/test_calc.py:4: AssertionError" in proc.stdout, proc.stdout
        assert str(first) not in proc.stdout


def test_only_the_modules_whose_bytes_were_made_get_a_rewrite(tmp_path: Path,
                                                              cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", TESTS)
    with rewritten.for_step(tree):
        pass
    rewritten.fill()
    (tree / "tests" / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 7\n")
    with rewritten.for_step(tree) as folder:
        assert folder is not None
        linked = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pyc"))
        tail = rewritten.tail()
        assert linked == [f"other_test{tail}", f"tests/conftest{tail}"], linked
        proc = step(tree, folder)
    assert found(proc) == ["conftest.py", "other_test.py"]
    assert "assert 5 == 7" in proc.stdout  # the changed module, rewritten by the step
    assert list(rewritten._pending) != []  # noted for the next fill


def test_a_module_whose_rewrite_warns_is_left_to_the_step(tmp_path: Path,
                                                          cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", {
        "test_tuple.py": "def test_t():\n    assert (1 == 2, 'always true')\n"})
    with rewritten.for_step(tree):
        pass
    assert rewritten.fill() == 0  # pytest warns when it rewrites it: the step must too
    proc = step(tree, None, "-W", "error::pytest.PytestAssertRewriteWarning")
    assert proc.returncode != 0 and "assertion is always true" in proc.stdout + proc.stderr


def test_a_project_with_the_pass_hook_rewrites_its_own(tmp_path: Path, cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", {
        **TESTS, "pytest.ini": "[pytest]\nenable_assertion_pass_hook = true\n"})
    with rewritten.for_step(tree):
        pass
    assert rewritten.fill() == 3
    with rewritten.for_step(tree) as folder:
        proc = step(tree, folder)
    assert found(proc) == [], "a rewrite made without the pass hook's calls was loaded"


def test_a_venvs_or_a_builds_test_modules_are_never_read(tmp_path: Path, cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", {
        **TESTS, "build/lib/test_built.py": "def test_b():\n    pass\n",
        "env/pyvenv.cfg": "home = /usr/bin\n",
        "env/lib/site-packages/pkg/test_pkg.py": "def test_p():\n    pass\n"})
    with rewritten.for_step(tree):
        pass
    assert sorted(Path(path).name for path, _data in rewritten._pending.values()) == [
        "conftest.py", "other_test.py", "test_calc.py"]
