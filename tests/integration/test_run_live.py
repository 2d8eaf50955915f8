"""`choir run` on a terminal: a live view of the step, each green thread's state and time,
results and the mood, redrawn in place (run under a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

from tests.workitems import PY, calc_repo, fixing_item

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_a_terminal(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env,
                            close_fds=True)
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=10)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


def test_choir_run_on_a_terminal_draws_green_threads_live(tmp_path: Path) -> None:
    calc_repo(tmp_path / "repo", canary="live-canary", sandbox="bwrap",
              verifiers="""\
                  slow:
                    kind: smoke
                    steps: [{name: wait, command: "sleep 1.5"}]
                  """,
              extra="moods: {CALM: {verifiers: [unit, slow]}}\n")
    item = fixing_item(tmp_path)
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="140", LINES="40")
    env.pop("CI", None)  # rich treats CI as "not a terminal"
    screen = run_on_a_terminal([PY, "-m", "choir", "run", str(item)], env)
    plain = ANSI.sub("", screen)
    assert "\x1b[2K" in screen or "\x1b[1A" in screen, "the view was not redrawn in place"
    for column in ("green thread", "state", "time", "result", "summary"):
        assert column in plain
    assert re.search(r"slow#0\s+│\s+running\s+│\s+\d+\.\ds", plain), "no live running row"
    assert re.search(r"slow#0\s+│\s+done\s+│\s+1\.\ds\s+│\s+PASS", plain)
    assert re.search(r"unit#0\s+│\s+done\s+│\s+\d+\.\ds\s+│\s+FAIL", plain)
    assert "execute fix-add attempt 2" in plain and "mood CALM" in plain
    assert "ASSERTED  run fix-add-" in plain
