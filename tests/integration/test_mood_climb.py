"""A mood switch never lowers what is verified (review 17b, F5).

BOLD verifies the core, then broadens (security scans, mutants) once the core is green. A
BOLD item that fails the same way twice climbs to CURIOUS, which never broadens: an executor
that repeated a failure on purpose, then wrote code the scan forbids, was ASSERTed without
the scan ever running. What BOLD owed stays owed after a climb.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workitems import scripted_item

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]  # CI's slow stage: two 4-attempt runs


@pytest.mark.parametrize("fixed_at", [2, 3])  # 2: no climb (the control); 3: BOLD -> CURIOUS
def test_a_bold_item_that_climbs_still_runs_bolds_broadening(tmp_path: Path,
                                                             fixed_at: int) -> None:
    script = ("import os, pathlib\n"
              f"if int(os.environ['CHOIR_ATTEMPT']) < {fixed_at}:\n"  # the same failure
              "    code = 'def add(a, b):\\n    return a - b\\n'\n"
              "else:\n"  # right, through what the scan forbids
              "    code = \"def add(a, b):\\n    return eval(f'{a} + {b}')\\n\"\n"
              "pathlib.Path('calc.py').write_text(code)\n")
    _, out, gate = scripted_item(
        tmp_path, script, mood="BOLD", max_attempts=4,
        verifiers="  scan:\n    kind: security_scan\n    steps:\n"
                  "      - {name: no-eval, command: \"! grep -n 'eval(' calc.py\"}\n")
    assert out["status"] == "halted" and not out.get("asserted"), out["events"]
    assert any(str(e).startswith("plan") and "scan" in str(e) for e in out["events"])
    assert gate == 1
