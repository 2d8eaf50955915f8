"""litellm's import-time warnings never fail a later test: the project's warning filters cover them.

litellm hides a pydantic ``ReadOnly`` warning with a process-wide filter when it is imported.
pytest restores the filters after each test, so that filter vanished after the test that first
imported litellm, and a later test in the same worker that made litellm import its GitHub
Copilot module lazily failed with the reporter's deterministic fallback (seen in CI, order
dependent). Here the order is forced, in a pytest run of its own under the project's settings.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# a pytest run of its own that imports litellm:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]

TESTS = '''
def test_first_imports_litellm():
    from choir.llm import litellm_module
    litellm_module()

def test_then_litellm_imports_more():
    import litellm.llms.github_copilot.per_user_auth  # noqa: F401
'''


def test_a_lazy_litellm_import_after_the_first_test_does_not_fail(tmp_path: Path) -> None:
    (tmp_path / "test_order.py").write_text(TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout
