"""Review 21d, doubt 3: the llm executor's ``search`` ran 92.5 s past a 40 s executor timeout.

Inside a file its deadline was checked only after the last line, each line had at least
1 ms of regex time, ``regex.compile`` unrolled counted repeats without bound, and
``asyncio.run`` waited for the tool's thread after ``wait_for`` gave up. Each test here
failed on that code (the figures are in its docstring).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import choir.agent.executor as executor_module
import choir.agent.files as files_module
from choir.agent.files import RepoFiles
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import ToolInputError
from choir.models import WorkItem
from choir.testing import FakeModel, reply, tool_call
from tests.workitems import calc_repo

# about 0.25 ms on each empty line, under the old 1 ms floor: 40,000 lines take seconds
SLOW = "(?:x?){3000}(?!)"
LINES = 40_000


def _notes(root: Path) -> RepoFiles:
    files = RepoFiles(root)
    files.write_file("notes.txt", "\n" * LINES)
    return files


def test_a_search_stops_at_its_own_bound_inside_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old code: 5.9 s for a 1 s bound (checked after the file's last line only)."""
    monkeypatch.setattr(files_module, "_SEARCH_SECONDS", 1.0)
    files = _notes(tmp_path)
    start = time.monotonic()
    out = files.search(SLOW, "notes.txt")
    assert time.monotonic() - start < 2.0
    assert "[search stopped after 1 s at notes.txt:" in out and "incomplete" in out


def test_a_search_stops_at_the_callers_deadline(tmp_path: Path) -> None:
    """Old code: 3.8 s for a deadline 1 s away (the executor's time was not the tool's)."""
    files = _notes(tmp_path)
    files.deadline = time.monotonic() + 1.0
    start = time.monotonic()
    out = files.search(SLOW, "notes.txt")
    assert time.monotonic() - start < 2.0
    assert "when the executor's time ran out" in out


def test_stop_ends_a_running_search_and_every_later_write(tmp_path: Path) -> None:
    """Old code: no way to stop a tool's thread (AttributeError)."""
    files = _notes(tmp_path)
    answers: list[str] = []
    worker = threading.Thread(target=lambda: answers.append(files.search(SLOW)))
    worker.start()
    time.sleep(0.3)
    start = time.monotonic()
    files.stop()
    worker.join(5)
    assert time.monotonic() - start < 0.5 and "stopped" in answers[0]
    with pytest.raises(ToolInputError, match="time ran out; nothing was written"):
        files.write_file("late.txt", "x\n")
    assert not (tmp_path / "late.txt").exists() and files.changed_files() == ["notes.txt"]


@pytest.mark.parametrize("pattern", [
    "(?:(?:(?:a{50}){50}){50})",  # 125,000 items: 0.12 s here; one more {50}: 12 s, 1.8 GB
    "(?:" + "[ab]" * 240 + "){9999}",  # 2.4 million: 2.9 s
    "(?:a{0,100000})",  # counted at its upper bound
])
def test_a_pattern_that_unrolls_past_the_bound_is_refused_before_it_compiles(
        tmp_path: Path, pattern: str) -> None:
    """Old code: compiled (seconds, gigabytes for the 29-character form) and searched."""
    files = RepoFiles(tmp_path)
    files.write_file("a.txt", "a\n")
    start = time.monotonic()
    with pytest.raises(ToolInputError, match="repeats too much.*the limit is 10000"):
        files.search(pattern)
    assert time.monotonic() - start < 0.1


def test_ordinary_counted_patterns_still_search(tmp_path: Path) -> None:
    files = RepoFiles(tmp_path)
    files.write_file("a.txt", "date 2026-11-28\n" + "ab" * 60 + "\n")
    assert files.search(r"\d{4}-\d{2}-\d{2}") == "a.txt:1: date 2026-11-28"
    assert files.search("(?:ab){60}").startswith("a.txt:2: abab")
    assert files.search("[[]x]|(?:a{99}){99}").startswith("no matches")


def test_the_llm_executor_returns_at_its_timeout_while_a_tool_runs(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewer's attack scaled down (review 21d: 92.5 s for timeout_s 40). Old code:
    run_llm returned after 15.5 s for timeout_s 1, when the tool's thread ended."""
    repo = calc_repo(tmp_path / "repo", canary="c")
    script = [reply(tool_call("write_file", {"path": "notes.txt", "content": "\n" * LINES})),
              reply(tool_call("search", {"pattern": SLOW, "path": "notes.txt"}))]
    real = executor_module.build_agent

    def scripted(item: WorkItem, run_id: str, **_: Any) -> Any:
        return real(item, run_id, model=FakeModel(script, repeat_last=True))  # searches on

    monkeypatch.setattr(executor_module, "build_agent", scripted)
    item = WorkItem(id="slow-tool", goal="g", repo=str(repo),
                    executor={"kind": "llm", "model": "x", "timeout_s": 1})  # type: ignore[arg-type]
    start = time.monotonic()
    out = executor_module.run_llm(item, 1, [])
    assert time.monotonic() - start < 2.0
    record = json.loads(ArtifactStore().path_of(out.artifact).read_bytes())
    assert record["error"] == "timeout" and record["changed_files"] == ["notes.txt"]


def test_a_timeout_during_verification_is_not_retried_as_a_system_error(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's retry loop took the executor's cancellation for a system error and ran the
    verifier again (tenacity retried any exception but a rejection): timeout_s 0.5 ran 4.4 s
    and ended ``verification_exhausted``. A cancellation is never retried."""
    from choir.testing import final_output

    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local")
    real = executor_module.build_agent

    def scripted(item: WorkItem, run_id: str, **_: Any) -> Any:
        return real(item, run_id, model=FakeModel([final_output(summary="done")],
                                                  repeat_last=True))

    monkeypatch.setattr(executor_module, "build_agent", scripted)
    item = WorkItem(id="late", goal="g", repo=str(repo),
                    executor={"kind": "llm", "model": "x", "timeout_s": 0.5})  # type: ignore[arg-type]
    start = time.monotonic()
    out = executor_module.run_llm(item, 1, [])
    elapsed = time.monotonic() - start
    record = json.loads(ArtifactStore().path_of(out.artifact).read_bytes())
    assert record["error"] == "timeout", record.get("error")
    assert elapsed < 2.5, elapsed


def test_a_cancellation_is_not_retryable() -> None:
    import asyncio

    from choir.agent.gate import retryable

    assert not retryable(asyncio.CancelledError())
    assert not retryable(KeyboardInterrupt())
    assert retryable(ConnectionError("reset"))


class _Clock:
    """A ``time`` whose clock moves 1 ms each time it is read: a walk's length in reads."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 0.001
        return self.now


def _tree(root: Path, folders: int, files: int) -> None:
    for i in range(folders):
        (root / f"d{i:03}").mkdir()
        for j in range(files):
            (root / f"d{i:03}" / f"f{j:03}.txt").touch()


def test_a_listing_of_many_files_stops_at_the_callers_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 21's doubt: ``list_files`` never read the executor's deadline, so a tree of
    very many files made one call overrun its timeout (200,000 files: 0.7 s a call here, a
    repo's size without bound). Old code: all 1,000 files listed, no note."""
    _tree(tmp_path, 10, 100)
    clock = _Clock()
    monkeypatch.setattr(files_module, "time", clock)
    files = RepoFiles(tmp_path)
    files.deadline = clock.now + 0.5
    out = files.list_files(".")
    assert "[listing stopped when the executor's time ran out" in out and "incomplete" in out
    assert clock.now < files.deadline + 0.05


def test_stop_ends_a_running_listing(tmp_path: Path) -> None:
    """Old code: a listing ran to its end after ``stop``."""
    _tree(tmp_path, 2, 10)
    files = RepoFiles(tmp_path)
    files.stop()
    assert "[listing stopped when the executor's time ran out" in files.list_files(".")


def test_read_file_counts_lines_only_until_the_deadline(tmp_path: Path) -> None:
    """Review 22's doubt: ``read_file`` counted a file's lines to its end whatever the time
    (a file of gigabytes in the repo held the executor past its timeout). Old code: "of
    3145728" with a deadline already gone."""
    (tmp_path / "big.txt").write_bytes(b"a\n" * (3 << 20))  # three 1 MiB reads to count
    files = RepoFiles(tmp_path)
    files.deadline = time.monotonic() - 1.0
    out = files.read_file("big.txt", max_lines=5)
    head = out.splitlines()[0]
    assert head.startswith("big.txt (lines 1-5 of at least ") and "3145728" not in head
    assert "when the executor's time ran out" in out
    assert out.splitlines()[1] == "     1\ta"
    stopped = r"lines were counted \(the count stopped when the executor's time ran out\)"
    with pytest.raises(ToolInputError, match=stopped):
        files.read_file("big.txt", start_line=3_000_000)


def test_read_file_counts_a_whole_file_in_time(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_bytes(b"a\n" * (3 << 20))
    out = RepoFiles(tmp_path).read_file("big.txt", max_lines=2)
    assert out.splitlines()[0] == "big.txt (lines 1-2 of 3145728)"
    assert out.splitlines()[-1].startswith("[truncated by max_lines=2: lines 3-3145728 not shown")
