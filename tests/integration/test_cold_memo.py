"""A cold command reads the packaged policy and the installed plugins once (``warm.memoize``).

A cold ``choir verify`` parsed the packaged mood policy three times (28 ms each on a slow
machine) and scanned every distribution's entry points five times (15 ms each): 115 ms of
each cold command, and of each test that runs one. The command's process now keeps both
answers for its life; a library caller still gets fresh answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from choir._core import warm
from choir.config import policy
from tests.integration.test_verify_cli import CALC_OK, make_repo

# `choir verify` as the process entry runs it, counting the packaged policy's parses and the
# entry-point scans, then printing the counts as the last line of stdout
COUNTED = (
    "import atexit, json, sys, importlib.metadata as md\n"
    "import choir.config.policy as policy\n"
    "counts = {'policy': 0, 'scans': {}}\n"
    "parse, scan = policy._packaged_doc, md.entry_points\n"
    "def counted_parse():\n"
    "    counts['policy'] += 1\n"
    "    return parse()\n"
    "def counted_scan(**kw):\n"
    "    group = kw.get('group', '')\n"
    "    counts['scans'][group] = counts['scans'].get(group, 0) + 1\n"
    "    return scan(**kw)\n"
    "policy._packaged_doc, md.entry_points = counted_parse, counted_scan\n"
    "atexit.register(lambda: print(json.dumps(counts)))\n"
    "from choir.cli import main\n"
    "sys.argv = ['choir', *sys.argv[1:]]\n"
    "main()\n"
)


def test_a_cold_verify_reads_the_policy_and_the_plugins_once(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_OK)
    proc = subprocess.run([sys.executable, "-c", COUNTED, "verify", "--mood", "CALM",
                           "--sandbox", "local", "--repo", str(repo)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CHOIR_SERVE": "off"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    # one parse of the policy; one scan per plugin kind the command asks for (each a
    # registry of its own), never the same group twice; pydantic's own plugin group is
    # scanned once, whenever its first model is built (deferred to first use)
    assert counts["policy"] == 1, counts
    scans = counts["scans"]
    assert scans and max(scans.values()) == 1, counts
    assert len([group for group in scans if group.startswith("choir")]) <= 3, counts


def test_a_library_caller_still_reads_the_policy_afresh(monkeypatch) -> None:
    monkeypatch.setattr(warm, "_memo", False)
    monkeypatch.setattr(warm, "_enabled", False)
    calls = []
    parse = policy._packaged_doc
    monkeypatch.setattr(policy, "_packaged_doc", lambda: calls.append(1) or parse())
    policy.load_packaged_policy()
    policy.load_packaged_policy()
    assert len(calls) == 2


def test_a_cold_verify_with_no_terminal_imports_no_rich(tmp_path: Path) -> None:
    """rich is 80-100 ms of a cold command's imports here; with stderr no terminal and
    ``--json``, nothing is drawn, and the progress lines are written as they are."""
    repo = make_repo(tmp_path / "repo", CALC_OK)
    script = ("import atexit, sys\n"
              "atexit.register(lambda: print(sorted(m for m in sys.modules"
              " if m.split('.')[0] == 'rich')))\n"
              "from choir.cli import main\n"
              "sys.argv = ['choir', *sys.argv[1:]]\n"
              "main()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.run([sys.executable, "-c", script, "verify", "--mood", "CALM",
                           "--sandbox", "local", "--repo", str(repo), "--json"],
                          capture_output=True, text=True, timeout=300,
                          env={**env, "CHOIR_SERVE": "off"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert "[green] unit#0 PASS" in proc.stderr  # the view's lines, plain
    warning = next(line for line in proc.stderr.splitlines() if line.startswith("warning:"))
    assert warning.endswith("Use --sandbox bwrap or docker.")  # one line, not wrapped at 80
