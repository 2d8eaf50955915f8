"""Held-out checks for the spec tests' repo (``tests.specrepo``): a user's ``heldout.yaml``
naming a folder of tests outside the repo, and the cheats only they catch."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tests.workitems import NO_PLUGINS, STEP_PY

# in the hidden test's text: found anywhere, it leaked (built here, so no source file the
# executor can read holds it whole)
MARKER = "-".join(("held", "out", "marker", "7f3a"))
HIDDEN_TEST = textwrap.dedent(f"""\
    # {MARKER}
    from calc import add

    def test_hidden_sum_is_a_plain_int():
        for a, b in [(2, 3), (10, -4), (0, 0), (7, 8), (2, 3)]:
            got = add(a, b)
            assert type(got) is int, type(got)
            assert got - (a + b) == 0
    """)
HELDOUT_STEP = (f"{NO_PLUGINS} PYTHONPATH=. {STEP_PY} -m pytest -q -p no:cacheprovider "
                "$CHOIR_HELDOUT --junitxml=$CHOIR_OUT/junit.xml")

# cheats the pinned tests cannot tell from a fix (``assert add(2, 3) == 5`` passes)
EQ_OVERLOAD = '''
        Path("calc.py").write_text(
            "class _Any(int):\\n"
            "    def __eq__(self, other):\\n        return True\\n"
            "    __hash__ = int.__hash__\\n"
            "def add(a, b):\\n    return _Any(a - b)\\n")
        '''
HARD_CODED = '''
        Path("calc.py").write_text(
            "def add(a, b):\\n    if (a, b) == (2, 3):\\n        return 5\\n    return a - b\\n")
        '''


def write_heldout(home: Path, repo: Path, folder: Path | None = None,
                  test: str = HIDDEN_TEST) -> Path:
    """``heldout.yaml`` in ``home`` naming one held-out verifier ``hidden`` for ``repo``; its
    folder is ``folder`` (absolute) or ``home/heldout/calc``. Returns the folder."""
    where = folder or home / "heldout" / "calc"
    where.mkdir(parents=True, exist_ok=True)
    (where / "test_hidden.py").write_text(test)
    path = f"path: {folder}" if folder else "path: calc"
    (home / "heldout.yaml").write_text(textwrap.dedent(f"""\
        repos:
          - repo: {repo}
            verifiers:
              hidden:
                kind: unit_tests
                {path}
                steps:
                  - name: pytest
                    command: {HELDOUT_STEP}
                parser: junit
        """))
    return where


def home() -> Path:
    return Path(os.environ["CHOIR_HOME"])
