"""``choir.sandbox.rewritten``: pytest's rewritten test modules, made by Choir's own pytest,
and the plain modules' compiled code, made by Choir's compile.

Each case runs the pytest preset's real wrapper (``$CHOIR_PYTEST``) with this venv's pytest
on a tree, the way a step runs it, with ``PYTEST_DEBUG`` and ``PYTHONVERBOSE`` on: pytest's
own trace says which modules it found a cached rewrite for, and the import system's which
compiled files it loaded code from.
"""

from __future__ import annotations

import errno
import importlib.util
import marshal
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import blake3
import pytest

from choir.sandbox import rewritten
from choir.sandbox.base import pytest_command, pytest_source

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


def step(tree: Path, folder: Path | None, *args: str, options: tuple[str, ...] = (),
         wrapper: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DEBUG": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONVERBOSE": "1",
           "CHOIR_PYTEST_PYC": str(folder or ""), "CHOIR_PYTEST_ROOT": str(tree)}
    return subprocess.run([sys.executable, *options, "-c", wrapper or pytest_source(), "-q",
                           "-s", "-p",
                           "no:cacheprovider", *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)  # -s: the import system's trace is seen


def found(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return sorted(Path(line.split("found cached rewritten pyc for ")[1].split()[0]).name
                  for line in (proc.stdout + proc.stderr).splitlines()
                  if "found cached rewritten pyc for " in line)


def loaded(proc: subprocess.CompletedProcess[str], folder: Path | None) -> list[str]:
    """The compiled files under ``folder`` the step's interpreter took code from."""
    return sorted(Path(line.split("code object from ")[1].strip("'")).name
                  for line in proc.stderr.splitlines()
                  if folder is not None and line.startswith(f"# code object from '{folder}"))


def kept(cache: Path) -> list[str]:
    """The step folders kept (and any maker's leftover), not the lock file beside them."""
    return sorted(p.name for p in (cache / "steps").iterdir() if p.name != rewritten.LOCK)


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
    assert rewritten.fill() == 5  # both test modules and the conftest, calc.py, the wrapper
    made = [p for p in cache.rglob("*") if p.is_file() and p.name != rewritten.LOCK]
    assert all(oct(p.stat().st_mode & 0o777) == "0o444" for p in made)
    assert not any(str(first).encode() in p.read_bytes() for p in made)  # no tree's path
    tree = tree_of(tmp_path / "second", TESTS)  # the same bytes, sealed at another path
    plain = step(tree, None)
    with rewritten.for_step(tree) as folder:
        assert folder is not None
        served = step(tree, folder)
        assert found(served) == ["conftest.py", "other_test.py", "test_calc.py"], served.stderr
        assert loaded(served, folder) == [f"calc{rewritten.compiled()}"]
        stub = step(tree, folder, wrapper=pytest_command())  # $CHOIR_PYTEST: the wrapper
        # from the folder's compiled copy
    inode = folder.stat().st_ino  # kept: the next step given the same links binds it
    with rewritten.for_step(first) as again:  # the same bytes at the same places
        assert again == folder and again.stat().st_ino == inode
    assert kept(cache) == [folder.name]
    untimed = [re.sub(r" in [0-9.]+s", "", proc.stdout) for proc in (stub, served)]
    assert stub.returncode == served.returncode and untimed[0] == untimed[1]
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
        assert linked == [f".choir/pytest{rewritten.compiled()}", f"calc{rewritten.compiled()}",
                          f"other_test{tail}", f"tests/conftest{tail}"], linked
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
    assert rewritten.fill() == 1  # the wrapper alone: pytest warns when it rewrites the
    # module, and the step must too
    proc = step(tree, None, "-W", "error::pytest.PytestAssertRewriteWarning")
    assert proc.returncode != 0 and "assertion is always true" in proc.stdout + proc.stderr


def test_a_project_with_the_pass_hook_rewrites_its_own(tmp_path: Path, cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", {
        **TESTS, "pytest.ini": "[pytest]\nenable_assertion_pass_hook = true\n"})
    with rewritten.for_step(tree):
        pass
    assert rewritten.fill() == 5
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
        "<string>", "calc.py", "conftest.py", "other_test.py", "test_calc.py"]


def test_a_plain_module_changed_since_its_fill_is_compiled_by_the_step(
        tmp_path: Path, cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", {
        **TESTS, "pkg/__init__.py": "", "pkg/util.py": "def one():\n    return 1\n",
        "tests/test_pkg.py": "from pkg.util import one\n\ndef test_one():\n"
                             "    assert one() == 1\n"})
    with rewritten.for_step(tree):
        pass
    assert rewritten.fill() == 8
    (tree / "pkg" / "util.py").write_text("def one():\n    return 2\n")
    with rewritten.for_step(tree) as folder:
        assert folder is not None
        proc = step(tree, folder, "tests/test_pkg.py")
    assert loaded(proc, folder) == [f"__init__{rewritten.compiled()}"], proc.stderr[-3000:]
    assert proc.returncode == 1 and "assert 2 == 1" in proc.stdout  # the source's code ran
    assert list(rewritten._pending) == [("compiled", blake3.blake3(
        b"def one():\n    return 2\n").hexdigest())]  # and is noted for the next fill


def test_a_plain_module_whose_compile_warns_is_left_to_the_step(tmp_path: Path,
                                                              cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", {
        "calc.py": "import re\nDIGIT = re.compile('\\d')\n",
        "test_calc.py": "import calc\n\ndef test_ok():\n    assert calc.DIGIT\n"})
    with rewritten.for_step(tree):
        pass
    assert rewritten.fill() == 2  # the test module and the wrapper: compiling calc.py warns
    calc = blake3.blake3((tree / "calc.py").read_bytes()).hexdigest()
    objects = cache / rewritten.compiled().lstrip(".")
    assert sorted(p.name for p in objects.iterdir() if p.name != rewritten.COUNTED) == \
        sorted([blake3.blake3(pytest_source().encode()).hexdigest(), calc + ".none"])
    with rewritten.for_step(tree) as folder:
        assert rewritten._pending == {}  # refused once: never made again (its compile may
        # also be one that takes seconds)
        proc = step(tree, folder, "-W", "error::DeprecationWarning",
                    "-W", "error::SyntaxWarning")
    assert proc.returncode != 0 and "invalid escape sequence" in proc.stdout + proc.stderr


def test_the_trees_own_pycache_is_never_read_and_optimised_runs_look_where_they_always_do(
        tmp_path: Path, cache: Path) -> None:
    tree = tree_of(tmp_path / "tree", TESTS)
    with rewritten.for_step(tree):
        pass
    rewritten.fill()
    # a plant: calc's bytecode in the tree's own cache, with an add that passes the test
    planted = tree / "__pycache__" / f"calc{rewritten.compiled()}"
    planted.parent.mkdir()
    code = compile("def add(a, b):\n    return 6\n", "calc.py", "exec")
    planted.write_bytes(importlib.util.MAGIC_NUMBER + (0b10).to_bytes(4, "little")
                        + importlib.util.source_hash(CALC.encode()) + marshal.dumps(code))
    with rewritten.for_step(tree) as folder:
        proc = step(tree, folder)
        optimised = step(tree, folder, options=("-O",))  # asserts stripped: not its code
    assert loaded(proc, folder) == [f"calc{rewritten.compiled()}"]
    assert proc.returncode == 1 and "assert 5 == 6" in proc.stdout
    assert str(planted) not in proc.stderr
    assert loaded(optimised, folder) == [] and str(planted) not in optimised.stderr
    assert f"# code object from {tree / 'calc.py'}\n" in optimised.stderr  # compiled


@pytest.mark.parametrize("case", ["its own text", "another text", "another magic", "-O"])
def test_the_wrapper_runs_from_the_folders_copy_only_for_its_own_text(
        tmp_path: Path, case: str) -> None:
    """``$CHOIR_PYTEST`` runs the compiled copy in the step's folder only when its header
    names this interpreter and the wrapper's very text (``base.PYTEST_STUB``): a copy that
    prints instead of running pytest shows which ran."""
    tree = tree_of(tmp_path / "tree", TESTS)
    folder = tmp_path / "folder"
    (folder / ".choir").mkdir(parents=True)
    text = pytest_source() if case != "another text" else pytest_source() + "# more\n"
    magic = importlib.util.MAGIC_NUMBER if case != "another magic" else b"\x00\x00\r\n"
    copy = compile("print('the copy ran')", "<string>", "exec")
    (folder / ".choir" / f"pytest{rewritten.compiled()}").write_bytes(
        magic + (0b11).to_bytes(4, "little") + importlib.util.source_hash(text.encode())
        + marshal.dumps(copy))
    proc = step(tree, folder, wrapper=pytest_command(),
                options=("-O",) if case == "-O" else ())
    if case == "its own text":
        assert (proc.returncode, proc.stdout) == (0, "the copy ran\n")
    else:
        assert "the copy ran" not in proc.stdout and proc.returncode == 1, proc.stdout


def test_a_tree_folder_named_like_a_modules_compiled_file_costs_that_module_its_copy_only(
        tmp_path: Path, cache: Path) -> None:
    """A folder ``pkg/calc.cpython-311.pyc/`` in the tree stands where ``pkg/calc.py``'s
    copy would be linked: the step compiles that module (a link never takes a folder's
    place, nor a folder a link's), the others still get theirs, and the step runs."""
    made = rewritten.compiled()
    tree = tree_of(tmp_path / "tree", {
        **TESTS, "pkg/__init__.py": "", "pkg/calc.py": "def add(a, b):\n    return a + b\n",
        f"pkg/calc{made}/x.py": "X = 1\n"})
    with rewritten.for_step(tree):
        pass
    rewritten.fill()
    with rewritten.for_step(tree) as folder:
        assert folder is not None
        assert (folder / f"calc{made}").is_file()  # the root's calc.py still linked
        assert (folder / "pkg" / f"__init__{made}").is_file()
        proc = step(tree, folder)
    assert proc.returncode == 1 and "assert 5 == 6" in proc.stdout, proc.stdout


def test_a_module_below_a_dot_folder_is_never_looked_for_in_the_steps_folder(
        tmp_path: Path, cache: Path) -> None:
    """The wrapper's own copy is in the step's folder under ``.choir/``: a tree module at
    ``.choir/pytest.py`` (here the wrapper's very text, so that the copy's header fits it)
    loaded by its path is compiled from its source, never looked for there."""
    tree = tree_of(tmp_path / "tree", {
        **TESTS, ".choir/pytest.py": pytest_source(),
        "test_dot.py": "import importlib.util, os\n\ndef test_dot():\n"
                       "    spec = importlib.util.spec_from_file_location(\n"
                       "        'dot', os.path.join(os.getcwd(), '.choir', 'pytest.py'))\n"
                       "    module = importlib.util.module_from_spec(spec)\n"
                       "    spec.loader.exec_module(module)\n"
                       "    assert module.JUnitWriter\n"})
    with rewritten.for_step(tree):
        pass
    rewritten.fill()
    with rewritten.for_step(tree) as folder:
        assert (folder / ".choir" / f"pytest{rewritten.compiled()}").is_file()
        proc = step(tree, folder, "test_dot.py", wrapper=pytest_command())
    assert proc.returncode == 0, proc.stdout
    assert f"# code object from {tree / '.choir' / 'pytest.py'}\n" in proc.stderr


def test_the_wrappers_lookup_stays_in_the_steps_folder(tmp_path: Path) -> None:
    """``$CHOIR_PYTEST_ROOT//tmp/x/calc.py`` names a file of the tree (``root/tmp/x``), but
    joined as it was written it named ``/tmp/x/calc.cpython-311.pyc``: a folder the step
    can write, with bytecode planted there. Such a path, and one below a dot folder, is
    looked for where the interpreter always looks."""
    script = textwrap.dedent(f"""\
        import sys
        sys.argv = ["x"]
        source = {pytest_source()!r}
        exec(compile(source.replace('if __name__ == "__main__":', 'if False:'), "w", "exec"))
        _compiled("/folder", "/root")
        from importlib import _bootstrap_external as ext
        for path in ("/root/pkg/calc.py", "/root//tmp/x/calc.py", "/root/../x/calc.py",
                     "/root/.choir/pytest.py", "/elsewhere/calc.py"):
            print(ext.cache_from_source(path))
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    tag = sys.implementation.cache_tag
    assert proc.stdout.split() == [
        f"/folder/pkg/calc.{tag}.pyc", f"/root//tmp/x/__pycache__/calc.{tag}.pyc",
        f"/root/../x/__pycache__/calc.{tag}.pyc", f"/root/.choir/__pycache__/pytest.{tag}.pyc",
        f"/elsewhere/__pycache__/calc.{tag}.pyc"], proc.stdout


def test_a_module_that_takes_minutes_to_compile_never_holds_the_fill_past_its_limit(
        tmp_path: Path, cache: Path) -> None:
    """``def f(): return 1`` repeated compiles in quadratic time (440 KB: 13 s here, 2 MiB:
    590 s): the fill's child is killed at its limit, nothing half-written is left, and what
    it made before stays made."""
    tree = tree_of(tmp_path / "tree", {"calc.py": CALC,
                                       "zslow.py": "def f(): return 1\n" * 24_000})
    with rewritten.for_step(tree):
        pass
    start = time.monotonic()
    made = rewritten.fill(limit_s=1.0)
    took = time.monotonic() - start
    assert took < 1.0 + rewritten.FILL_GRACE_S + 3.0, took  # the child's start besides
    objects = cache / rewritten.compiled().lstrip(".")
    names = sorted(p.name for p in objects.iterdir() if p.name != rewritten.COUNTED)
    slow = blake3.blake3((tree / "zslow.py").read_bytes()).hexdigest()
    assert not [n for n in names if slow in n], names  # neither made, half-made nor refused
    assert made == len(names) >= 1  # the wrapper and calc.py, made before it, are kept


def test_a_folder_that_cannot_be_made_gives_the_step_none(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while the step's folder is made: the step makes its own code, as on any
    read-only tree, and nothing of the folder is left (it used to escape the sandbox's
    ``exec`` and crash the verifier)."""
    tree = tree_of(tmp_path / "tree", TESTS)
    with rewritten.for_step(tree):
        pass
    rewritten.fill()

    def full(*_args: object, **_kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with rewritten.for_step(tree) as folder:
        assert folder is None
    assert kept(cache) == []


def _filled(root: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """A tree of ``files``, its modules' code made, and its step's folder."""
    tree = tree_of(root, files)
    with rewritten.for_step(tree):
        pass
    rewritten.fill()
    with rewritten.for_step(tree) as folder:
        assert folder is not None
    return tree, folder


def test_a_kept_folder_serves_only_a_step_that_would_get_the_same_links(
        tmp_path: Path, cache: Path) -> None:
    """A kept folder is never another tree's: the second tree's test module differs by one
    assert, and its step gets a folder of its own whose rewrite is of its own bytes (it
    passes where the first tree's code would fail); the first tree's folder is untouched."""
    first, one = _filled(tmp_path / "first", TESTS)
    fixed = dict(TESTS, **{"tests/test_calc.py": TESTS["tests/test_calc.py"].replace("6", "5")})
    second, two = _filled(tmp_path / "second", fixed)
    assert one != two and one.is_dir() and two.is_dir()

    def code(folder: Path, tree: Path) -> Path:
        return cache / (rewritten.tail() or "").lstrip(".") / blake3.blake3(
            (tree / "tests/test_calc.py").read_bytes()).hexdigest()

    linked = one / "tests" / f"test_calc{rewritten.tail()}"
    assert linked.stat().st_ino == code(one, first).stat().st_ino
    assert (two / linked.relative_to(one)).stat().st_ino == code(two, second).stat().st_ino
    served = step(second, two)
    assert served.returncode == 0 and found(served), served.stdout + served.stderr
    assert step(first, one).returncode == 1


def test_two_steps_making_the_same_folder_share_the_one_made_first(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree, folder = _filled(tmp_path / "tree", TESTS)
    shutil.rmtree(folder)
    build = rewritten._build

    def raced(temp: Path, links: list[tuple[str, str, str]]) -> int:
        build(folder, links)  # another step's, renamed into place while this one made its own
        return build(temp, links)

    monkeypatch.setattr(rewritten, "_build", raced)
    with rewritten.for_step(tree) as again:
        assert again == folder
    assert kept(cache) == [folder.name]  # no temp left


def _filled_trees(tmp_path: Path, count: int) -> list[Path]:
    """``count`` trees that differ in ``calc.py`` alone, every module's code made."""
    trees = [tree_of(tmp_path / f"t{n}", {**TESTS, "calc.py": CALC + f"N = {n}\n"})
             for n in range(count)]
    for tree in trees:
        with rewritten.for_step(tree):
            pass
    rewritten.fill()
    return trees


def test_kept_folders_are_bounded_and_one_in_use_stays(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past twice ``KEEP_STEPS`` folders the least recently used go, down to ``KEEP_STEPS``,
    with a maker's leftover, when the next step starts; one used within ``PRUNE_AFTER_S``
    never does."""
    monkeypatch.setattr(rewritten, "KEEP_STEPS", 2)
    steps = cache / "steps"
    trees = _filled_trees(tmp_path, 7)
    assert kept(cache) == []  # nothing was cached for the steps before the fill

    def made(tree: Path) -> Path:
        with rewritten.for_step(tree) as folder:
            assert folder is not None
        return folder

    folders = [made(tree) for tree in trees[:5]]  # not past 4 yet: every one stays
    assert kept(cache) == sorted(f.name for f in folders)
    leftover = steps / ".tmp-0123456789abcdef"  # a maker that died
    leftover.mkdir()
    os.utime(leftover, (time.time() - 10_000,) * 2)
    folders.append(made(trees[5]))  # six entries before it: five in use (just made)
    assert kept(cache) == sorted(f.name for f in folders)
    for age, folder in enumerate(folders[:5]):  # unused for hours now; the sixth just made
        os.utime(folder, (time.time() - 10_000 + age,) * 2)
    last = made(trees[6])  # six before it: the four oldest go, then its own is made
    assert kept(cache) == sorted([folders[4].name, folders[5].name, last.name])


def test_no_folder_is_pruned_while_a_step_holds_one(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 29: a prune that began before another step reused its folder removed it
    under that step, whose bind then failed (a FAIL that was no one's). A step holds the
    steps' lock (shared) from its folder's lookup to its end; a prune (exclusive), in this
    process or another, that cannot take it removes nothing, and the next step past the
    bound prunes."""
    monkeypatch.setattr(rewritten, "KEEP_STEPS", 1)
    monkeypatch.setattr(rewritten, "PRUNE_AFTER_S", 0.0)
    trees = _filled_trees(tmp_path, 5)
    with rewritten.for_step(trees[0]) as held:  # a step, running
        assert held is not None
        for tree in trees[1:4]:  # past twice the bound: each tries to prune first
            with rewritten.for_step(tree):
                pass
        child = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; "
             "from choir.sandbox import rewritten as r; r.KEEP_STEPS = 1; "
             "r.PRUNE_AFTER_S = 0.0; r._prune(Path(sys.argv[1]))", str(cache / "steps")],
            capture_output=True, text=True, timeout=60)
        assert child.returncode == 0, child.stderr
        assert held.is_dir() and len(kept(cache)) == 4  # nothing removed under the step
    with rewritten.for_step(trees[4]) as folder:  # no step holds one: pruned to the bound
        assert folder is not None
    assert len(kept(cache)) == 2 and folder.name in kept(cache)


def test_a_cached_file_with_every_link_the_disk_allows_is_copied(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 29: kept folders hold their links, and every empty module links the one object
    of empty bytes: at the file system's link limit (ext4: 65,000) each later folder failed
    and no tree got one. Such a file is copied, read-only, instead."""
    tree, first = _filled(tmp_path / "tree", TESTS)
    real = os.link

    def full(src: object, dst: object, **kw: object) -> None:
        raise OSError(errno.EMLINK, "Too many links")

    monkeypatch.setattr(os, "link", full)
    other = tree_of(tmp_path / "other", {**TESTS, "calc.py": CALC + "N = 1\n"})
    with rewritten.for_step(other):
        pass
    monkeypatch.setattr(os, "link", real)
    rewritten.fill()
    monkeypatch.setattr(os, "link", full)
    with rewritten.for_step(other) as folder:
        assert folder is not None and folder != first
        copy = folder / f"calc{rewritten.compiled()}"
        assert copy.stat().st_nlink == 1 and copy.stat().st_mode & 0o777 == 0o444
        assert loaded(step(other, folder), folder) == [copy.name]


def _objects_of(cache: Path, count: int, age_s: float) -> list[Path]:
    """``count`` cached files of plain modules' code, made ``age_s`` ago, oldest first."""
    objects = cache / (rewritten.compiled() or "").lstrip(".")
    objects.mkdir(parents=True, exist_ok=True)
    made = []
    for n in range(count):
        path = objects / blake3.blake3(f"module {age_s} {n}".encode()).hexdigest()
        path.write_bytes(b"code")
        os.utime(path, (time.time() - age_s + n,) * 2)
        made.append(path)
    return made


def test_the_cached_code_is_bounded_oldest_made_first(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache of made code had no bound: a service that saw many trees kept every
    module's code it ever made. Past twice ``KEEP_OBJECTS`` files the oldest made go, down
    to ``KEEP_OBJECTS``, none made in the last ``PRUNE_AFTER_S``; the folder is counted at
    most once in that time."""
    monkeypatch.setattr(rewritten, "KEEP_OBJECTS", 3)
    old = _objects_of(cache, 7, 10_000)
    objects = old[0].parent
    rewritten._prune_objects(objects)
    assert sorted(p.name for p in objects.iterdir() if p.name != rewritten.COUNTED) == sorted(
        p.name for p in old[-3:])
    again = _objects_of(cache, 7, 20_000)  # made since, older by their time: counted soon
    rewritten._prune_objects(objects)  # after the last count: not counted again yet
    assert all(p.exists() for p in again)
    os.utime(objects / rewritten.COUNTED, (time.time() - rewritten.PRUNE_AFTER_S - 1,) * 2)
    fresh = _objects_of(cache, 4, 1)  # made a second ago: never removed
    rewritten._prune_objects(objects)
    assert all(p.exists() for p in fresh) and not any(p.exists() for p in again)


def test_the_cached_codes_bytes_are_bounded_too(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewritten, "KEEP_OBJECT_BYTES", 10)  # each file holds 4 bytes
    made = _objects_of(cache, 6, 10_000)  # 24 bytes: past twice 10
    rewritten._prune_objects(made[0].parent)
    assert [p.exists() for p in made] == [False] * 4 + [True] * 2


def test_a_fill_bounds_the_cache_it_adds_to(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewritten, "KEEP_OBJECTS", 2)
    old = _objects_of(cache, 6, 10_000)
    _filled(tmp_path / "tree", TESTS)  # its modules' code made, then the cache counted
    assert not any(p.exists() for p in old)
    with rewritten.for_step(tree_of(tmp_path / "again", TESTS)) as folder:
        assert folder is not None  # what the fill made stays (made just now)
