"""A failing run dressed as a tool's crash never lets a passing one decide (review 17b, F1).

The code under test chooses how its pytest process ends: an ``atexit`` that leaves with
exit 4 (pytest's "usage error"), "No module named pytest" printed before a failure, or a
plugin registered at import that exits 4 on the first failing test report (no need to know
which test failed). Each made the failing run INCONCLUSIVE, which was ignored once the clean
rerun passed: intermittently wrong code was ASSERTed and ``choir gate`` opened. Here the
code is wrong in the first run only, as a real intermittent bug (or a guess at a held-out
check) would be, and the run must end as it does when the failure is plain: no ASSERT.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forked
from tests.workitems import scripted_item

pytestmark = pytest.mark.bwrap

DISGUISES = {
    "plain": "",
    "atexit_exit_4": "import atexit; atexit.register(lambda: os._exit(4))",
    "no_module_named": "print('No module named pytest')",
    "plugin_exits_4": "",
}
PLUGIN = '''
import gc as _gc
def _disguise():
    try:
        from _pytest.config import Config
    except ImportError:
        return
    for o in _gc.get_objects():
        if isinstance(o, Config):
            class _P:
                def pytest_runtest_logreport(self, report):
                    if report.failed:
                        os._exit(4)
            o.pluginmanager.register(_P())
            return
_disguise()
'''


@pytest.mark.parametrize("disguise", list(DISGUISES))
def test_a_failing_run_dressed_as_a_crash_blocks_the_assert(tmp_path: Path,
                                                            disguise: str) -> None:
    hidden = DISGUISES[disguise] or "pass"
    code = ("import os\n_WRONG = '-r0-unit-0' in os.environ.get('CHOIR_OUT', '')\n"
            f"def add(a, b):\n    if _WRONG:\n        {hidden}\n        return a - b\n"
            "    return a + b\n" + (PLUGIN if disguise == "plugin_exits_4" else ""))
    code_, out, gate = scripted_item(
        tmp_path, f"import pathlib\npathlib.Path('calc.py').write_text({code!r})\n",
        mood="CALM", max_attempts=2)
    assert (code_, out["status"]) == (1, "halted"), (out["status"], out["events"])
    assert not out.get("asserted")
    assert gate == 1


def test_choir_verify_calls_a_pass_beside_a_step_made_inconclusive_a_failure(
        tmp_path: Path) -> None:
    """Review 17h: ``choir run`` judged a PASS beside an INCONCLUSIVE the step made (its
    second replica collected nothing) FLAKY, while ``choir verify`` on the same tree said
    INCONCLUSIVE, exit 4, "nothing failed": a CI script retrying exit 4 as infrastructure
    retried the disguise too. Both judge it per verifier: FAIL, exit 1."""
    import json
    import os

    from tests.workitems import PY

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "conftest.py").write_text(
        "import os\n"
        "def pytest_ignore_collect(collection_path, config):\n"
        "    return collection_path.name.startswith('test_') and \\\n"
        "        os.environ.get('CHOIR_OUT', '').endswith('-1/out')\n")
    (repo / "test_a.py").write_text("def test_a(): assert True\n")
    (repo / "choir.yaml").write_text("sandbox: {backend: bwrap}\nverifiers:\n"
                                     "  unit: {uses: pytest}\n")
    env = {**os.environ, "CHOIR_HOME": str(tmp_path / "home"),
           "CHOIR_ARTIFACT_DIR": str(tmp_path / "home" / "artifacts")}
    proc = forked.run([PY, "-m", "choir", "verify", "--repo", str(repo), "--mood",
                       "PARANOID", "--json"], capture_output=True, text=True, timeout=300,
                      env=env)
    out = json.loads(proc.stdout)
    assert sorted(r["result"] for r in out["reports"]) == ["INCONCLUSIVE", "PASS"], out["reports"]
    assert (proc.returncode, out["verdict"]) == (1, "FAIL")
