"""The scaffolds and the harness, in process and as the real two-process harness (no
sandbox): polling with backoff, what counts as a result, and the verdict's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from choir.postconditions import VerificationResult
from choir.postconditions._harness import (
    BOOTSTRAP,
    _normalise,
    invariant_check,
    read_after_write,
)
from choir.postconditions.spec import harness_source
from tests.postcondition_systems import flag_db, http_service, write_later


def _raw(db: Path, name: str, ms: int = 2000) -> dict[str, Any]:
    return {"resource": {"kind": "sqlite", "path": str(db)}, "verify_timeout_ms": ms,
            "sql": "SELECT value FROM flags WHERE name = :name", "expect_from": "value"}


def test_a_write_visible_within_the_window_passes_after_polling(tmp_path: Path) -> None:
    db = flag_db(tmp_path, {})
    released = threading.Event()
    writer = write_later(db, "INSERT INTO flags VALUES (?, ?)", ("beta", "on"), released)
    threading.Timer(0.3, released.set).start()
    started = time.monotonic()
    outcome, detail = read_after_write(_raw(db, "beta"), {"action": {"name": "beta",
                                                                     "value": "on"}})
    writer.join(5)
    assert (outcome, detail) == ("pass", "read back 'on' as expected")
    assert 0.25 < time.monotonic() - started < 2.0


def test_http_read_after_write_polls_until_the_value_changes() -> None:
    with http_service() as (base, service):
        service.flags["beta"] = "off"
        threading.Timer(0.3, lambda: service.flags.update(beta="on")).start()
        spec = {"resource": {"kind": "http", "base_url": base}, "path": "/flags/{name}",
                "field": "value", "expect": "on", "verify_timeout_ms": 3000}
        outcome, _ = read_after_write(spec, {"action": {"name": "beta"}})
    assert outcome == "pass"
    assert service.requests.count("/flags/beta") >= 2  # read again, with backoff


def test_http_paths_stay_under_the_base_url() -> None:
    with http_service() as (base, service):
        spec = {"resource": {"kind": "http", "base_url": base}, "path": "/flags/{name}",
                "field": "value", "expect": "on", "verify_timeout_ms": 300}
        outcome, _ = read_after_write(spec, {"action": {"name": "../health?x=1"}})
    assert outcome == "inconclusive"
    assert service.requests and all(r.startswith("/flags/..%2Fhealth") for r in
                                    service.requests)


def test_invariant_over_sqlite_true_false_and_missing(tmp_path: Path) -> None:
    db = flag_db(tmp_path, {})
    base = {"resource": {"kind": "sqlite", "path": str(db)}, "verify_timeout_ms": 300}
    ok = invariant_check({**base, "sql": "SELECT COUNT(*) = 0 FROM accounts WHERE balance<0"},
                         {})
    broken = invariant_check({**base, "sql": "SELECT SUM(balance) > 1000 FROM accounts"}, {})
    missing = invariant_check({**base, "sql": "SELECT x FROM nowhere"}, {})
    assert (ok[0], broken[0], missing[0]) == ("pass", "fail", "inconclusive")


@pytest.mark.parametrize(("value", "outcome"), [
    (True, "pass"), (False, "fail"), ({"outcome": "fail", "detail": "x"}, "fail"),
    (VerificationResult(outcome="inconclusive", detail="no data"), "inconclusive"),
    ("PASS", "inconclusive"), (None, "inconclusive"), ({"outcome": "PASS"}, "inconclusive"),
    (1, "inconclusive")])
def test_what_counts_as_a_result(value: Any, outcome: str) -> None:
    assert _normalise(value)["outcome"] == outcome


def _harness(tmp_path: Path, body: str, timeout_s: float = 5,
             method: str = "callable") -> tuple[int, dict[str, Any]]:
    (tmp_path / "v.py").write_text(body)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "CHOIR_OUT": str(out),
           "CHOIR_PC_HARNESS": harness_source(),
           "CHOIR_PC_SPEC": json.dumps({"name": "v", "method": method, "callable": "v.py",
                                        "timeout_s": timeout_s, "verify_timeout_ms": 1000})}
    proc = subprocess.run([sys.executable, "-B", "-c", BOOTSTRAP], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    return proc.returncode, json.loads((out / "postcondition.json").read_text())


def test_exit_codes_are_the_verdict(tmp_path: Path) -> None:
    assert _harness(tmp_path, "def verify(c):\n    return True\n")[0] == 0
    assert _harness(tmp_path, "def verify(c):\n    return False\n")[0] == 1
    code, record = _harness(tmp_path, "def verify(c):\n    raise KeyError('gone')\n")
    assert code == 3 and record["severity"] == "red" and "KeyError" in record["detail"]


def test_a_grandchild_left_behind_is_killed_with_the_group(tmp_path: Path) -> None:
    marker = tmp_path / "late"
    late = f"import time, pathlib; time.sleep(1); pathlib.Path({str(marker)!r}).write_text('x')"
    code, _ = _harness(tmp_path, (
        "import subprocess, sys\n"
        "def verify(c):\n"
        f"    subprocess.Popen([sys.executable, '-c', {late!r}])\n"
        "    return True\n"))
    time.sleep(1.5)
    assert code == 0 and not marker.exists()


def test_invariant_check_with_a_callable(tmp_path: Path) -> None:
    holds = _harness(tmp_path, "def verify(c):\n    return 1 + 1 == 2\n",
                     method="invariant_check")
    broken = _harness(tmp_path, "async def verify():\n    return False\n",
                      method="invariant_check")
    assert (holds[0], broken[0]) == (0, 1)
    assert broken[1]["severity"] == "yellow" and "returned False" in broken[1]["detail"]


@pytest.mark.parametrize(("returned", "code"), [
    ("{'outcome': 'fail', 'detail': 'account 7 is overdrawn'}", 1),  # a verdict, as documented
    ("type('R', (), {'outcome': 'inconclusive', 'detail': ''})()", 3),
    ("'fail'", 3), ("'PASS'", 3), ("[0]", 3), ("[]", 3), ("None", 3), ("1", 3),
])
def test_an_invariant_callable_passes_only_on_true(tmp_path: Path, returned: str,
                                                   code: int) -> None:
    """Review 17a (critical): an invariant's callable was judged by truthiness, so a
    returned failing verdict (``{'outcome': 'fail'}``, the shape custom verifiers return)
    or the string ``'fail'`` was a PASS, and the work item ASSERTed. True passes, False
    fails, a verdict is read as one, anything else is no evidence."""
    assert _harness(tmp_path, f"def verify(c):\n    return {returned}\n",
                    method="invariant_check")[0] == code


def test_a_child_slow_to_start_still_gets_its_whole_window(tmp_path: Path) -> None:
    """CI on a loaded machine: the child's interpreter took seconds to start (a container
    among four, on two cores), the parent's clock ran from the fork, and a lost write read
    back at its deadline came out INCONCLUSIVE ("did not finish"). The window is the
    check's: the child's start has an allowance of its own, and the verdict stands."""
    db = flag_db(tmp_path / "system", {"gamma": "off"})
    slow = tmp_path / "slow-python"  # an interpreter that takes 3 s to start
    slow.write_text(f"#!/bin/sh\nsleep 3\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    spec = {"name": "lost", "method": "read_after_write", "timeout_s": 1.5,
            "verify_timeout_ms": 500, "resource": {"kind": "sqlite", "path": str(db)},
            "sql": "SELECT value FROM flags WHERE name = :name",
            "params": {"name": "gamma"}, "expect": "on"}
    env = {"PATH": os.environ["PATH"], "CHOIR_OUT": str(out),
           "CHOIR_PC_HARNESS": harness_source(), "CHOIR_PC_SPEC": json.dumps(spec)}
    started = time.monotonic()
    proc = subprocess.run(  # the parent as it runs, but for the interpreter it forks
        [sys.executable, "-B", "-c", f"import sys; sys.executable = {str(slow)!r}\n"
         + BOOTSTRAP], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    record = json.loads((out / "postcondition.json").read_text())
    assert (proc.returncode, record["outcome"]) == (1, "fail"), record
    assert "read back 'off'" in record["detail"]
    assert time.monotonic() - started < 10
