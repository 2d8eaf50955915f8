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

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.workitems import PY

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


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                    *args], check=True, capture_output=True)


@pytest.mark.parametrize("disguise", list(DISGUISES))
def test_a_failing_run_dressed_as_a_crash_blocks_the_assert(tmp_path: Path,
                                                            disguise: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\n"
                                       "def test_add():\n    assert add(2, 3) == 5\n")
    step_python = os.path.realpath(PY)
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    parser: pytest\n    steps:\n"
        f"      - {{name: pytest, command: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {step_python} -m "
        "pytest -q -p no:cacheprovider}\nsandbox: {backend: bwrap}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    hidden = DISGUISES[disguise] or "pass"
    code = ("import os\n_WRONG = '-r0-unit-0' in os.environ.get('CHOIR_OUT', '')\n"
            f"def add(a, b):\n    if _WRONG:\n        {hidden}\n        return a - b\n"
            "    return a + b\n" + (PLUGIN if disguise == "plugin_exits_4" else ""))
    executor = tmp_path / "exec.py"
    executor.write_text(f"import pathlib\npathlib.Path('calc.py').write_text({code!r})\n")
    item = tmp_path / "item.yaml"
    item.write_text(f"id: calc\ngoal: add adds\nrepo: {repo}\nmood: CALM\nmax_attempts: 2\n"
                    f"executor:\n  kind: command\n  command: {PY} {executor}\n")
    env = {**os.environ, "CHOIR_HOME": str(tmp_path / "home"),
           "CHOIR_ARTIFACT_DIR": str(tmp_path / "home" / "artifacts")}
    proc = subprocess.run([PY, "-m", "choir", "run", str(item), "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["status"]) == (1, "halted"), (out["status"], out["events"])
    assert not out.get("asserted")
    gate = subprocess.run([PY, "-m", "choir", "gate", "calc", "--repo", str(repo)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert gate.returncode == 1, gate.stdout
