"""RepoFiles: the llm executor's file tools stay inside the repo, bound every reply, and
apply patches all or nothing (checked against real ``git diff``/``git apply``/``diff -u``)."""

from __future__ import annotations

import difflib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choir.agent.files import RepoFiles
from choir.agent.tools import tool
from choir.exceptions import ToolInputError

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIX = """\
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "deep.py").write_text("VALUE = 1\n")
    (root / "README.md").write_text("# demo\nTODO: more\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / ".hg").mkdir()
    (root / ".hg" / "x.py").write_text("hidden = True\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("SECRET-outside\n")
    return out


def refused(fn: object, *args: object, match: str | None = None) -> str:
    with pytest.raises(ToolInputError, match=match) as info:
        fn(*args)  # type: ignore[operator]
    return str(info.value)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and permission bits (symlinks as their target), .git excluded."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] == ".git" or path.is_dir():
            continue
        if path.is_symlink():
            out[rel] = (os.readlink(path).encode(), 0)
        else:
            out[rel] = (path.read_bytes(), stat.S_IMODE(path.stat().st_mode) & 0o111)
    return out


# -- list_files ------------------------------------------------------------------------


def test_list_files_is_recursive_sorted_and_skips_vcs_folders(repo: Path) -> None:
    files = RepoFiles(repo)
    assert files.list_files().splitlines() == [
        "README.md",
        "calc.py",
        "pkg/__init__.py",
        "pkg/sub/deep.py",
    ]
    assert files.list_files("pkg", "*.py").splitlines() == ["pkg/__init__.py", "pkg/sub/deep.py"]
    assert files.list_files(".", "pkg/sub/*.py") == "pkg/sub/deep.py"
    assert "no files match" in files.list_files(".", "*.rs")


def test_list_files_says_how_many_more_it_did_not_show(repo: Path) -> None:
    for i in range(7):
        (repo / f"m{i}.txt").write_text("x")
    out = RepoFiles(repo, max_results=3).list_files(".", "m*.txt").splitlines()
    assert out == [
        "m0.txt",
        "m1.txt",
        "m2.txt",
        "... 4 more files not shown; narrow path or pattern",
    ]


def test_list_files_marks_symlinks_and_never_walks_out(repo: Path, outside: Path) -> None:
    (repo / "out").symlink_to(outside)
    out = RepoFiles(repo).list_files()
    assert "out (symlink)" in out
    assert "secret" not in out
    refused(RepoFiles(repo).list_files, "out", match="outside the repository")


# -- read_file -------------------------------------------------------------------------


def test_read_file_numbers_lines(repo: Path) -> None:
    out = RepoFiles(repo).read_file("calc.py")
    lines = out.splitlines()
    assert lines[0] == "calc.py (lines 1-6 of 6)"
    assert lines[1] == "     1\tdef add(a, b):"
    assert lines[6] == "     6\t    return a - b"
    assert "truncated" not in out


def test_read_file_in_pieces_says_where_to_continue(repo: Path) -> None:
    (repo / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 1001)))
    files = RepoFiles(repo)
    first = files.read_file("long.txt", max_lines=10)
    assert first.splitlines()[0] == "long.txt (lines 1-10 of 1000)"
    assert "read_file(path='long.txt', start_line=11)" in first
    second = files.read_file("long.txt", start_line=11, max_lines=2).splitlines()
    assert second[1:3] == ["    11\tline 11", "    12\tline 12"]
    last = files.read_file("long.txt", start_line=999)
    assert "1000\tline 1000" in last and "truncated" not in last


def test_read_file_is_bounded_in_bytes(repo: Path) -> None:
    (repo / "wide.txt").write_text("".join(f"{i:04d}" + "x" * 96 + "\n" for i in range(200)))
    out = RepoFiles(repo, max_read_bytes=1000).read_file("wide.txt")
    assert len(out.encode()) < 1500
    assert "the reply limit of 1000 bytes" in out
    shown = [ln for ln in out.splitlines() if "\t" in ln]
    nxt = len(shown) + 1
    assert f"start_line={nxt})" in out and 5 <= len(shown) < 12


def test_read_file_cuts_one_huge_line_and_goes_on(repo: Path) -> None:
    (repo / "min.js").write_text("A" * 50_000 + "\nnext\n")
    files = RepoFiles(repo, max_read_bytes=1000)
    out = files.read_file("min.js")
    assert "[line 1 is cut here]" in out and len(out) < 1500
    assert "start_line=2" in out
    assert files.read_file("min.js", start_line=2).splitlines()[1] == "     2\tnext"


def test_read_file_refuses_binary_and_non_utf8(repo: Path) -> None:
    (repo / "blob.bin").write_bytes(b"\x7fELF\x00\x00\x01")
    (repo / "latin.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    refused(RepoFiles(repo).read_file, "blob.bin", match="binary")
    refused(RepoFiles(repo).read_file, "latin.txt", match="not UTF-8")


def test_read_file_refusals_the_model_can_fix(repo: Path) -> None:
    (repo / "empty.txt").write_text("")
    files = RepoFiles(repo)
    assert files.read_file("empty.txt") == "empty.txt is empty (0 bytes)"
    refused(files.read_file, "nope.py", match="no such file")
    refused(files.read_file, "pkg", match="is a directory")
    refused(files.read_file, "calc.py", 7, match="has 6 lines")
    refused(files.read_file, "calc.py", 0, match="1 or more")


# -- search ----------------------------------------------------------------------------


def test_search_reports_path_line_text(repo: Path) -> None:
    (repo / "blob.bin").write_bytes(b"return a - b\x00\x01")
    out = RepoFiles(repo).search(r"return a [-+] b").splitlines()
    assert out == ["calc.py:2:     return a - b", "calc.py:6:     return a - b"]
    assert RepoFiles(repo).search("TODO", "README.md") == "README.md:2: TODO: more"
    assert RepoFiles(repo).search("VALUE", "pkg") == "pkg/sub/deep.py:1: VALUE = 1"
    assert "no matches" in RepoFiles(repo).search("hidden")  # .hg is never searched


def test_search_is_bounded_and_counts_what_it_left_out(repo: Path) -> None:
    (repo / "many.txt").write_text("hit\n" * 50)
    (repo / "more.txt").write_text("hit " + "y" * 5000 + "\n")
    out = RepoFiles(repo, max_results=5).search("hit").splitlines()
    assert len(out) == 6
    assert out[-1] == "[46 more matches in 2 files not shown; narrow the pattern or path]"
    long_hit = RepoFiles(repo).search("hit y", "more.txt")
    assert len(long_hit) < 400 and "more chars]" in long_hit


def test_search_refuses_bad_and_huge_patterns(repo: Path) -> None:
    refused(RepoFiles(repo).search, "def (", match="invalid regular expression")
    refused(RepoFiles(repo).search, "a" * 1001, match="longer than")


def test_catastrophic_pattern_is_stopped_not_hung(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("regex")
    import choir.agent.files as files_module

    monkeypatch.setattr(files_module, "_SEARCH_SECONDS", 0.5)
    (repo / "evil.txt").write_text("a" * 60 + "b\n")
    started = time.monotonic()
    out = RepoFiles(repo).search(r"(a|aa)+$", "evil.txt")
    assert time.monotonic() - started < 5
    assert "[search stopped after" in out and "evil.txt" in out


def test_search_skips_files_too_large_and_says_so(repo: Path) -> None:
    with open(repo / "big.log", "wb") as fh:
        fh.truncate(4_000_001)
    out = RepoFiles(repo).search("TODO")
    assert out.splitlines()[0] == "README.md:2: TODO: more"
    assert "[1 files over 4000000 bytes were not searched]" in out


# -- write_file ------------------------------------------------------------------------


def test_write_file_creates_dirs_and_reports_the_change(repo: Path) -> None:
    files = RepoFiles(repo)
    assert (
        files.write_file("new/dir/a.txt", "one\ntwo\n") == "created new/dir/a.txt: 8 bytes, 2 lines"
    )
    assert (repo / "new/dir/a.txt").read_text() == "one\ntwo\n"
    assert (
        files.write_file("new/dir/a.txt", "one\ntwo\nthree")
        == "wrote new/dir/a.txt: 8 -> 13 bytes, 2 -> 3 lines"
    )
    assert "unchanged" in files.write_file("calc.py", CALC)
    assert files.changed_files() == ["new/dir/a.txt"]
    assert not [p for p in repo.rglob("*.tmp")]


def test_write_file_replaces_atomically_and_keeps_the_mode(repo: Path, outside: Path) -> None:
    script = repo / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o755)
    alias = outside / "hardlink"
    os.link(script, alias)  # the old inode: an in-place write would show through it
    RepoFiles(repo).write_file("run.sh", "echo new\n")
    assert script.read_text() == "echo new\n"
    assert alias.read_text() == "echo old\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_write_file_size_bound_leaves_the_file_alone(repo: Path) -> None:
    files = RepoFiles(repo, max_write_bytes=100)
    refused(files.write_file, "calc.py", "x" * 101, match="limit is 100")
    assert (repo / "calc.py").read_text() == CALC
    assert files.changed_files() == []


def test_write_file_refuses_directories_and_the_root(repo: Path) -> None:
    refused(RepoFiles(repo).write_file, "pkg", "x", match="is a directory")
    refused(RepoFiles(repo).write_file, ".", "x", match="root")
    refused(RepoFiles(repo).write_file, "calc.py/inner", "x", match="not a directory")


# -- security --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../outside/secret.txt", "pkg/../../x", "a\x00b", "~/.ssh/id_rsa"]
)
def test_every_tool_refuses_paths_that_escape(repo: Path, path: str) -> None:
    files = RepoFiles(repo)
    for call in (
        lambda: files.read_file(path),
        lambda: files.write_file(path, "x"),
        lambda: files.list_files(path),
        lambda: files.search("x", path),
    ):
        with pytest.raises(ToolInputError):
            call()
    assert not (repo.parent / "x").exists() and files.changed_files() == []


def test_symlinked_file_pointing_outside_is_refused(repo: Path, outside: Path) -> None:
    (repo / "link.txt").symlink_to(outside / "secret.txt")
    files = RepoFiles(repo)
    refused(files.read_file, "link.txt", match="outside the repository")
    refused(files.write_file, "link.txt", "pwned", match="outside the repository")
    assert (outside / "secret.txt").read_text() == "SECRET-outside\n"
    assert files.search("-outside").startswith("no matches")


def test_symlinked_parent_directory_pointing_outside_is_refused(repo: Path, outside: Path) -> None:
    (repo / "vendor").symlink_to(outside)
    files = RepoFiles(repo)
    refused(files.read_file, "vendor/secret.txt", match="outside the repository")
    refused(files.write_file, "vendor/planted.txt", "x", match="outside the repository")
    refused(files.write_file, "vendor/new/dir/f.txt", "x", match="outside the repository")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_symlink_created_after_construction_is_refused(repo: Path, outside: Path) -> None:
    files = RepoFiles(repo)
    assert "return a - b" in files.read_file("calc.py")
    (repo / "calc.py").unlink()
    (repo / "calc.py").symlink_to(outside / "secret.txt")
    refused(files.read_file, "calc.py", match="outside the repository")
    refused(files.apply_patch, FIX, match="outside the repository")
    refused(files.write_file, "calc.py", "pwned", match="outside the repository")
    assert (outside / "secret.txt").read_text() == "SECRET-outside\n"


def test_symlink_swapped_in_after_the_check_is_not_followed(
    repo: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: the path was checked, then a directory became a symlink before the open."""
    (repo / "d").mkdir()
    (repo / "d" / "secret.txt").write_text("inside\n")
    files = RepoFiles(repo)
    checked = files._real("d/secret.txt")
    shutil.rmtree(repo / "d")
    (repo / "d").symlink_to(outside)
    monkeypatch.setattr(files, "_real", lambda path: list(checked))
    refused(files.read_file, "d/secret.txt", match="not a directory or changed")
    refused(files.write_file, "d/secret.txt", "pwned", match="not a directory or changed")
    assert (outside / "secret.txt").read_text() == "SECRET-outside\n"


def test_symlink_inside_the_repo_is_followed(repo: Path) -> None:
    (repo / "alias.py").symlink_to("calc.py")
    files = RepoFiles(repo)
    assert "return a - b" in files.read_file("alias.py")
    files.write_file("alias.py", "X = 1\n")
    assert (repo / "calc.py").read_text() == "X = 1\n" and (repo / "alias.py").is_symlink()
    assert files.changed_files() == ["calc.py"]


def test_writes_into_vcs_folders_are_refused(repo: Path) -> None:
    (repo / "g").symlink_to(".git")
    files = RepoFiles(repo)
    refused(files.write_file, ".git/config", "x", match="version-control")
    refused(files.write_file, ".git/hooks/pre-commit", "x", match="version-control")
    refused(files.write_file, "g/config", "x", match="version-control")
    refused(files.write_file, "pkg/.git/config", "x", match="version-control")
    patch = "--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-[core]\n+[evil]\n"
    refused(files.apply_patch, patch, match="version-control")
    assert (repo / ".git" / "config").read_text() == "[core]\n"
    assert not (repo / ".git" / "hooks").exists()


def test_fifos_and_devices_are_refused_without_blocking(repo: Path) -> None:
    os.mkfifo(repo / "pipe")
    files = RepoFiles(repo)
    refused(files.read_file, "pipe", match="fifo")
    refused(files.write_file, "pipe", "x", match="fifo")
    assert stat.S_ISFIFO(os.lstat(repo / "pipe").st_mode)
    assert "pipe" not in files.list_files()
    assert "no matches" in files.search("x", "pipe")
    try:
        os.mknod(repo / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return
    refused(files.read_file, "null", match="device")
    refused(files.write_file, "null", "x", match="device")


# -- apply_patch -----------------------------------------------------------------------


def test_apply_patch_changes_a_file_and_reports_it(repo: Path) -> None:
    files = RepoFiles(repo)
    assert files.apply_patch(FIX) == "applied: 1 file change(s)\nM calc.py (+1 -1)"
    assert (repo / "calc.py").read_text() == CALC.replace("a - b", "a + b", 1)
    assert files.changed_files() == ["calc.py"]


def test_apply_patch_finds_a_hunk_that_moved(repo: Path) -> None:
    (repo / "calc.py").write_text("import os\nimport sys\n\n" + CALC)
    out = RepoFiles(repo).apply_patch(FIX)
    assert "hunk #1 applied at line 4 (offset +3 lines)" in out
    assert "return a + b" in (repo / "calc.py").read_text()


def test_apply_patch_context_mismatch_names_file_and_hunk(repo: Path) -> None:
    patch = FIX + "@@ -5,2 +5,2 @@\n def sub(a, b):\n-    return a * b\n+    return b - a\n"
    msg = refused(RepoFiles(repo).apply_patch, patch)
    assert "calc.py: hunk #2 (@@ -5,2 +5,2 @@) does not apply" in msg
    assert "'    return a * b'" in msg
    assert (repo / "calc.py").read_text() == CALC


def test_apply_patch_is_all_or_nothing_across_files(repo: Path) -> None:
    patch = FIX + (
        "--- a/pkg/sub/deep.py\n+++ b/pkg/sub/deep.py\n@@ -1 +1 @@\n-VALUE = 2\n+VALUE = 3\n"
    )
    files = RepoFiles(repo)
    before = snapshot(repo)
    msg = refused(files.apply_patch, patch, match="pkg/sub/deep.py: hunk #1")
    assert "calc.py" not in msg.split(":")[0]
    assert snapshot(repo) == before and files.changed_files() == []


def test_apply_patch_rolls_back_when_the_disk_step_fails(repo: Path) -> None:
    """Two files plan cleanly; the second cannot be written: the first is put back."""
    (repo / "blocker").write_text("a regular file where a folder is needed\n")
    patch = FIX + "--- /dev/null\n+++ b/blocker/new/x.py\n@@ -0,0 +1 @@\n+x = 1\n"
    before = snapshot(repo)
    refused(RepoFiles(repo).apply_patch, patch, match="not a directory")
    assert snapshot(repo) == before


def test_apply_patch_undoes_files_already_swapped_in_when_a_later_one_fails(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the second rename fails (disk full, EIO): the first is undone,
    the new folder and every temp file are removed."""
    patch = (
        FIX + "--- /dev/null\n+++ b/fresh/dir/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
        "--- a/pkg/sub/deep.py\n+++ b/pkg/sub/deep.py\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n"
    )
    real_replace, calls = os.replace, []

    def flaky(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(*args, **kwargs)  # type: ignore[arg-type]

    before = snapshot(repo)
    files = RepoFiles(repo)
    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="No space left"):
        files.apply_patch(patch)
    monkeypatch.undo()
    assert len(calls) == 3  # calc.py in, new.py failed, calc.py put back
    assert snapshot(repo) == before
    assert not (repo / "fresh").exists() and not list(repo.rglob(".choir-*"))
    assert files.changed_files() == []


def test_apply_patch_creates_and_deletes_files(repo: Path) -> None:
    patch = (
        "--- /dev/null\n+++ b/tools/new.py\n@@ -0,0 +1,2 @@\n+A = 1\n+B = 2\n"
        "--- a/pkg/sub/deep.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-VALUE = 1\n"
    )
    files = RepoFiles(repo)
    out = files.apply_patch(patch)
    assert out.splitlines()[1:] == ["A tools/new.py (+2 -0)", "D pkg/sub/deep.py (-1)"]
    assert (repo / "tools" / "new.py").read_text() == "A = 1\nB = 2\n"
    assert not (repo / "pkg" / "sub" / "deep.py").exists()
    assert files.changed_files() == ["tools/new.py", "pkg/sub/deep.py"]


def test_apply_patch_refuses_inconsistent_creates_and_deletes(repo: Path) -> None:
    files = RepoFiles(repo)
    create = "--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1 @@\n+x = 1\n"
    refused(files.apply_patch, create, match="calc.py: the patch creates it but it exists")
    partial = "--- a/calc.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-def add(a, b):\n-    return a - b\n"
    refused(files.apply_patch, partial, match="does not remove all of its lines")
    missing = "--- a/gone.py\n+++ b/gone.py\n@@ -1 +1 @@\n-a\n+b\n"
    refused(files.apply_patch, missing, match="no such file: gone.py")
    assert (repo / "calc.py").read_text() == CALC


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ("just some words\n", "no file changes found"),
        ("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+x\n", "names no file"),
        (
            "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n def add(a, b):\n-    return a - b\n"
            "+    return a + b\n",
            "ends early",
        ),
        (FIX + "+    extra line beyond the counts\n", "fix the counts"),
        ("--- a/calc.py\n+++ b/calc.py\n@@ bogus @@\n", "bad hunk header"),
        ("diff --git a/x.png b/x.png\nBinary files a/x.png and b/x.png differ\n", "binary"),
        ("--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n?def add(a, b):\n", "is not context"),
    ],
)
def test_apply_patch_refuses_malformed_diffs(repo: Path, patch: str, match: str) -> None:
    refused(RepoFiles(repo).apply_patch, patch, match=match)
    assert (repo / "calc.py").read_text() == CALC


def test_apply_patch_handles_missing_final_newline(repo: Path) -> None:
    (repo / "f.txt").write_text("a\nb")
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
    RepoFiles(repo).apply_patch(patch)
    assert (repo / "f.txt").read_bytes() == b"a\nc\n"


def test_apply_patch_size_bound(repo: Path) -> None:
    patch = "--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1 @@\n+" + "x" * 200 + "\n"
    refused(RepoFiles(repo, max_write_bytes=150).apply_patch, patch, match="limit is 150")
    assert not (repo / "big.txt").exists()


_LINE = st.text(alphabet="ab \t{}()=+-", max_size=6).map(lambda t: t + "\n")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    old=st.lists(_LINE, max_size=30), new=st.lists(_LINE, max_size=30), context=st.integers(0, 3)
)
def test_any_difflib_diff_applies_exactly(
    tmp_path: Path, old: list[str], new: list[str], context: int
) -> None:
    """Whatever the edit, a unified diff of it turns the old text into the new one."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    (root / "f.txt").write_text("".join(old))
    patch = "".join(difflib.unified_diff(old, new, "a/f.txt", "b/f.txt", n=context))
    if not patch:
        return
    RepoFiles(root).apply_patch(patch)
    assert (root / "f.txt").read_text() == "".join(new)


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
    )  # bytes: keep \r
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode()


def test_real_git_diff_applies_like_git_apply(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "src").mkdir(parents=True)
    (base / "src" / "calc.py").write_text("".join(f"x{i} = {i}\n" for i in range(40)))
    (base / "old.txt").write_text("to be deleted\nsecond\n")
    (base / "keep.txt").write_text("no newline at end")
    (base / "win.txt").write_bytes(b"one\r\ntwo\r\n")
    (base / "moved.py").write_text("".join(f"m{i}\n" for i in range(20)))
    (base / "tool.sh").write_text("echo hi\n")
    for name in ("work", "theirs", "ours"):
        shutil.copytree(base, tmp_path / name)
    work = tmp_path / "work"
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "base")
    calc = (work / "src" / "calc.py").read_text().replace("x3 = 3", "x3 = 33")
    (work / "src" / "calc.py").write_text(calc.replace("x30 = 30\n", "x30 = 30\nextra = 1\n"))
    (work / "old.txt").unlink()
    (work / "keep.txt").write_text("no newline at end, changed")
    (work / "win.txt").write_bytes(b"one\r\nTWO\r\n")
    (work / "moved.py").rename(work / "pkg_moved.py")
    (work / "pkg_moved.py").write_text((work / "pkg_moved.py").read_text().replace("m5", "M5"))
    (work / "tool.sh").chmod(0o755)
    (work / "brand" / "new").mkdir(parents=True)
    (work / "brand" / "new" / "f.py").write_text("NEW = True\n")
    _git(work, "add", "-A")
    patch = _git(work, "diff", "--cached", "-M")
    assert "rename from moved.py" in patch and "new mode 100755" in patch
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    (tmp_path / "p.diff").write_text(patch)
    _git(theirs, "init", "-q")
    _git(theirs, "apply", str(tmp_path / "p.diff"))
    files = RepoFiles(ours)
    out = files.apply_patch(patch)
    assert snapshot(ours) == snapshot(theirs)
    assert snapshot(ours) != snapshot(base)
    assert "R moved.py -> pkg_moved.py (+1 -1)" in out
    assert sorted(files.changed_files()) == sorted(
        [
            "src/calc.py",
            "old.txt",
            "keep.txt",
            "win.txt",
            "moved.py",
            "pkg_moved.py",
            "tool.sh",
            "brand/new/f.py",
        ]
    )


def test_plain_diff_u_output_applies(tmp_path: Path, repo: Path) -> None:
    old, new = tmp_path / "calc.py.orig", tmp_path / "calc.py"
    old.write_text(CALC)
    new.write_text(CALC.replace("return a - b", "return a + b"))
    proc = subprocess.run(
        ["diff", "-u", old.name, new.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "\t" in proc.stdout.splitlines()[0]  # timestamps
    RepoFiles(repo).apply_patch(proc.stdout)
    assert (repo / "calc.py").read_text() == new.read_text()
    shutil.copytree(repo, tmp_path / "a", ignore=shutil.ignore_patterns(".git", ".hg"))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "pkg" / "sub" / "deep.py").write_text("VALUE = 2\n")
    tree = subprocess.run(
        ["diff", "-ru", "a", "b"], cwd=tmp_path, capture_output=True, text=True
    ).stdout
    assert "--- a/pkg/sub/deep.py\t" in tree
    RepoFiles(repo).apply_patch(tree)
    assert (repo / "pkg" / "sub" / "deep.py").read_text() == "VALUE = 2\n"


# -- as model tools --------------------------------------------------------------------


def test_methods_become_tools_with_documented_parameters(repo: Path) -> None:
    files = RepoFiles(repo)
    for method in (
        files.list_files,
        files.read_file,
        files.search,
        files.write_file,
        files.apply_patch,
    ):
        made = tool(method)
        props = made.schema()["function"]["parameters"]["properties"]
        assert props and all(p.get("description") for p in props.values()), made.name
    assert tool(files.read_file).schema()["function"]["parameters"]["required"] == ["path"]


def test_the_verifier_allowlist_is_not_the_executors_to_edit(tmp_path: Path) -> None:
    from choir.agent.executor import PROTECTED
    from choir.agent.files import RepoFiles
    from choir.exceptions import ToolInputError

    (tmp_path / "choir.yaml").write_text("verifiers: {}\n")
    files = RepoFiles(tmp_path, protected=PROTECTED)  # as Choir's llm executor opens it
    for attempt in (lambda: files.write_file("choir.yaml", "verifiers: {}\n# gone\n"),
                    lambda: files.write_file("./choir.yaml", "x"),
                    lambda: files.apply_patch("--- a/choir.yaml\n+++ b/choir.yaml\n"
                                              "@@ -1 +1 @@\n-verifiers: {}\n+x: 1\n")):
        with pytest.raises(ToolInputError, match="verifier allowlist"):
            attempt()
    assert (tmp_path / "choir.yaml").read_text() == "verifiers: {}\n"
    assert files.write_file("sub/choir.yaml", "ok\n").startswith("created")  # root only


def test_a_star_in_a_path_pattern_does_not_cross_a_slash(tmp_path: Path) -> None:
    """``src/*/test_*.py`` is one folder deep, as in a shell; ``**`` is any depth."""
    for rel in ("src/a/test_x.py", "src/a/b/test_y.py", "src/test_z.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    files = RepoFiles(tmp_path)
    assert files.list_files(".", "src/*/test_*.py").splitlines() == ["src/a/test_x.py"]
    assert files.list_files(".", "src/?/test_*.py").splitlines() == ["src/a/test_x.py"]
    assert files.list_files(".", "src/**/test_*.py").splitlines() == [
        "src/a/b/test_y.py", "src/a/test_x.py", "src/test_z.py"]


def test_the_general_agent_protects_only_what_it_is_told(tmp_path: Path) -> None:
    """``choir.yaml`` is Choir's concern: the Agent package protects the files its caller
    names, and Choir's llm executor names ``choir.yaml``."""
    (tmp_path / "choir.yaml").write_text("verifiers: {}\n")
    (tmp_path / "deploy.cfg").write_text("prod\n")
    assert RepoFiles(tmp_path).write_file("choir.yaml", "mine: 1\n").startswith("wrote")
    guarded = RepoFiles(tmp_path, protected=("deploy.cfg",))
    with pytest.raises(ToolInputError, match="protected"):
        guarded.write_file("deploy.cfg", "x\n")
    assert (tmp_path / "deploy.cfg").read_text() == "prod\n"


def test_the_llm_executor_cannot_write_the_verifiers_interpreter(tmp_path: Path) -> None:
    """The repo's .venv is ignored (outside the tree hash) yet the verifiers run it: a .pth
    planted there by the model's tools would pass every step. A protected folder guards all
    it holds, through every writing tool."""
    from choir.agent.executor import PROTECTED

    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "ok.pth").write_text("\n")
    files = RepoFiles(tmp_path, protected=PROTECTED)
    for attempt in (lambda: files.write_file(".venv/lib/python3.11/site-packages/zz.pth",
                                             "import os; os._exit(0)\n"),
                    lambda: files.write_file("./.venv/pyvenv.cfg", "home = /tmp\n"),
                    lambda: files.apply_patch(
                        "--- a/.venv/lib/python3.11/site-packages/ok.pth\n"
                        "+++ b/.venv/lib/python3.11/site-packages/ok.pth\n"
                        "@@ -1 +1 @@\n-\n+import os; os._exit(0)\n")):
        with pytest.raises(ToolInputError, match="protected"):
            attempt()
    assert sorted(p.name for p in site.iterdir()) == ["ok.pth"]
    assert (site / "ok.pth").read_text() == "\n"
    assert files.write_file(".venvs-notes.txt", "fine\n").startswith("created")  # no prefix trap


def test_the_llm_executor_guards_a_pinned_interpreter_inside_the_repo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sandbox.python: env`` names a venv inside the repo: the run pins it, and the llm
    executor's tools may not write it, as the sandboxed executors may not."""
    import sys

    from choir.agent.executor import build_agent
    from choir.config import load_repo_config
    from choir.config.policy import load_policy
    from choir.executors.pinned import pinned_gate
    from choir.models import Mood, WorkItem

    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    base = os.path.realpath(sys.base_prefix) + "/bin/python3"
    subprocess.run([base, "-m", "venv", "--without-pip", str(repo / "env")], check=True)
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n      - name: t\n"
        "        command: python3 -c pass\nsandbox: {python: env}\n")
    config = load_repo_config(repo)
    item = WorkItem(id="w", goal="g", repo=str(repo),
                    executor={"kind": "llm", "model": "openai/gpt-4o-mini"})  # type: ignore[arg-type]
    with pinned_gate(config, load_policy(config), Mood.CALM):
        _, files = build_agent(item, "r", model="openai/gpt-4o-mini")
    with pytest.raises(ToolInputError, match="protected"):
        files.write_file("env/pyvenv.cfg", "home = /tmp\n")
    assert files.write_file("notes.txt", "fine\n").startswith("created")


def test_a_path_pattern_with_many_stars_answers_at_once(tmp_path: Path) -> None:
    """Review 20b, F1: ``*a*a*a*a*a/`` against a 200-character name backtracked in ``re``
    (4 stars 2.6 s, 5 stars 73 s) and hung ``choir run`` past its timeout; the path glob
    is now matched in time linear in the name."""
    files = RepoFiles(tmp_path)
    files.write_file("a" * 200, "x\n")
    start = time.monotonic()
    out = files.list_files(".", "*a" * 5 + "/")
    assert time.monotonic() - start < 0.5
    assert out.startswith("no files match")
    assert files.list_files(".", "**/" + "*a" * 5).splitlines() == ["a" * 200]


@pytest.mark.parametrize("last", ["-nomatch\n", " \n"])
def test_a_huge_hunk_over_identical_lines_is_searched_briefly(tmp_path: Path,
                                                            last: str) -> None:
    """Review 20b, F2: the offset search sliced len(old) lines at each of 20,001 offsets, so
    a 400,000-line hunk over a file of empty lines cost 36 s of CPU. A hunk whose last line
    is nowhere is now refused at a glance; one that differs only in the middle (a ``-x``
    line) stops once the search has spent its bound of line comparisons."""
    files = RepoFiles(tmp_path)
    files.write_file("big.txt", "\n" * 200_000)
    n_old = 100_000
    hunk = " \n" * (n_old // 2) + "-x\n" + " \n" * (n_old // 2 - 2) + last
    n_new = n_old - 1 - last.startswith("-")
    patch = f"--- a/big.txt\n+++ b/big.txt\n@@ -90000,{n_old} +90000,{n_new} @@\n" + hunk
    start = time.monotonic()
    with pytest.raises(ToolInputError, match="does not apply|too long"):
        files.apply_patch(patch)
    assert time.monotonic() - start < 1.0
    assert (tmp_path / "big.txt").read_text() == "\n" * 200_000
