"""The loop's answers to evidence that is not a plain PASS or FAIL, through the real CLI.

Flaky evidence gets nested rounds with other lenses and never promotes; a failure that keeps
repeating but divides is split into parts that each ASSERT before the whole is verified
again; BOLD broadens coverage once its core is green. Real sandboxes, SQLite and signatures.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.workitems import PY, PYTEST, isolating_pytest

# every mood and lens through the whole loop, minutes of real rounds:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow



def choir(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=600, env=env)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def work_item(tmp_path: Path, executor: str, *, mood: str = "CALM",
              max_attempts: int = 4) -> Path:
    return write(tmp_path / "item.yaml", f"""\
        id: calc
        goal: the calculator is right
        repo: ./repo
        mood: {mood}
        max_attempts: {max_attempts}
        executor:
          kind: command
          command: {json.dumps(executor)}
        """)


def atoms() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(choir("ahdb", "list", "--json").stdout)
    return out


def attestations(home: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((home / "attestations").glob("*.json"))]


def test_flaky_evidence_gets_other_lenses_never_promotes_and_goes_back_to_the_executor(
    tmp_path: Path, choir_home: Path
) -> None:
    counter = tmp_path / "counter"
    write(tmp_path / "repo/calc.py", "def add(a, b):\n    return a + b\n")
    # the nondeterminism is in the code under test (order.py), which the executor may fix;
    # the test itself is pinned spec, read-only to the executor
    write(tmp_path / "repo/order.py", f"""\
        import fcntl

        def ordered():
            # nondeterministic across runs: every other run fails
            with open({str(counter)!r}, "a+") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.write("x")
                fh.flush()
                fh.seek(0)
                return len(fh.read()) % 2 == 0
        """)
    write(tmp_path / "repo/test_calc.py", """\
        from calc import add
        from order import ordered

        def test_add():
            assert add(2, 3) == 5

        def test_order():
            assert ordered()
        """)
    # two replicas per round, so disagreement shows; the local sandbox lets the test keep
    # its counter outside the repo (isolation "none" is recorded in every attestation)
    isolating_pytest(tmp_path / "repo", """\
        moods:
          CALM: {verifiers: [unit], reruns: 2}
        sandbox: {backend: local}
        """)
    write(tmp_path / "fix.py", """\
        import os, pathlib
        if os.environ["CHOIR_ATTEMPT"] == "2":  # make the code deterministic
            code = pathlib.Path("order.py")
            code.write_text(code.read_text().replace("% 2 == 0", ">= 0"))
        """)
    item = work_item(tmp_path, f"{PY} {tmp_path / 'fix.py'}")
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2
    err = proc.stderr
    assert "flaky: unit; nested round 1 with other lenses" in err
    assert "nested round 2" in err and "flaky after 2 nested round(s): unit" in err
    for lens in ("(clean_rerun)", "(instrumented)", "(isolated_subset)"):
        assert lens in err
    found = atoms()
    hypotheses = [a for a in found if a["kind"] == "HYPOTHESIZE"]
    assert len(hypotheses) == 1
    assert "rerun unit in clean sandboxes: it must pass every time" in \
        hypotheses[0]["discriminating_test"]
    asserted = [a for a in found if a["kind"] == "ASSERT"]
    assert {a["tree_hash"] for a in asserted} == {asserted[0]["tree_hash"]}  # the fixed tree
    assert hypotheses[0]["tree_hash"] != asserted[0]["tree_hash"]  # flaky tree never promoted
    bodies = [a["body"] for a in attestations(choir_home)]
    isolated = [b for b in bodies if b["lens"] == "isolated_subset"]
    assert isolated and all("test_calc.py::test_order" in b["commands"][-1] for b in isolated)
    assert {b["environment"]["isolation"] for b in bodies} == {"none"}
    assert choir("audit").returncode == 0


def two_bugs(tmp_path: Path, *, knows: tuple[str, ...] = ("add", "mul")) -> Path:
    """add and mul both wrong, and an executor that is lost when told of two failures at
    once but fixes a single one it is shown (only those it ``knows``)."""
    write(tmp_path / "repo/calc.py", """\
        def add(a, b):
            return a - b

        def mul(a, b):
            return a // b
        """)
    write(tmp_path / "repo/test_calc.py", """\
        from calc import add, mul

        def test_add():
            assert add(2, 3) == 5

        def test_mul():
            assert mul(2, 3) == 6
        """)
    isolating_pytest(tmp_path / "repo")
    write(tmp_path / "fix.py", f"""\
        import json, os, pathlib
        log = pathlib.Path({str(tmp_path / 'repo' / '.executor.log')!r})  # sandboxed: repo only
        item = json.loads(pathlib.Path(os.environ["CHOIR_WORKITEM_FILE"]).read_text())
        fb = os.environ.get("CHOIR_FEEDBACK_FILE")
        failing = sorted({{s["test_id"] for r in json.loads(pathlib.Path(fb).read_text())
                           for s in r["failure_signatures"]}}) if fb else []
        with log.open("a") as out:
            out.write(f"{{item['id']}} {{os.environ['CHOIR_ATTEMPT']}} {{failing}}\\n")
        fixes = {{"test_calc.py::test_add": ("a - b", "a + b"),
                  "test_calc.py::test_mul": ("a // b", "a * b")}}
        known = {{f"test_calc.py::test_{{name}}" for name in {list(knows)!r}}}
        if len(failing) == 1 and failing[0] in known:
            calc = pathlib.Path("calc.py")
            fix = fixes[failing[0]]
            calc.write_text(calc.read_text().replace("return " + fix[0], "return " + fix[1]))
        """)
    return work_item(tmp_path, f"{PY} {tmp_path / 'fix.py'}", max_attempts=6)


def test_a_repeating_failure_that_divides_is_split_into_parts_then_verified_whole(
    tmp_path: Path, choir_home: Path
) -> None:
    item = two_bugs(tmp_path)
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["work_item"] == "calc"
    assert "split calc into calc~1, calc~2" in proc.stderr
    assert "every part done: verifying calc whole" in proc.stderr
    calls = (tmp_path / "repo" / ".executor.log").read_text().splitlines()
    # three blind rounds on the whole item, then each part sees only its own test
    assert calls[3] == "calc~1 1 ['test_calc.py::test_add']"
    assert calls[4] == "calc~2 1 ['test_calc.py::test_mul']"
    assert len(calls) == 5
    asserted = {a["work_item"]: a for a in atoms() if a["kind"] == "ASSERT" and a["references"]}
    assert set(asserted) == {"calc", "calc~1", "calc~2"}
    assert choir("gate", "calc", "--repo", str(tmp_path / "repo")).returncode == 0
    # the parts' evidence ran only their tests, isolated; the whole was verified in full
    bodies = {a["id"]: a["body"] for a in attestations(choir_home)}
    part1 = [bodies[i] for i in asserted["calc~1"]["attestations"]]
    assert all(b["lens"] == "isolated_subset" and b["commands"][-1].endswith("test_add")
               for b in part1)
    whole = [bodies[i] for i in asserted["calc"]["attestations"]]
    assert all(b["lens"] == "default" and b["commands"] == [PYTEST] for b in whole)
    assert choir("audit").returncode == 0


def test_bold_broadens_once_the_core_is_green_and_asserts_only_with_both(
    tmp_path: Path,
) -> None:
    write(tmp_path / "repo/calc.py", "def add(a, b):\n    return a + b\n")
    write(tmp_path / "repo/test_calc.py",
          "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    write(tmp_path / "repo/choir.yaml", f"""\
        verifiers:
          unit:
            kind: unit_tests
            steps: [{{name: pytest, command: {PYTEST}}}]
          style:
            kind: lint
            steps: [{{name: tabs, command: "! grep -rqP '\\\\t' calc.py"}}]
        """)
    (tmp_path / "repo/calc.py").write_text("def add(a, b):\n\treturn a + b\n")
    write(tmp_path / "fix.py", """\
        import pathlib
        calc = pathlib.Path("calc.py")
        calc.write_text(calc.read_text().replace("\\t", "    "))
        """)
    item = work_item(tmp_path, f"{PY} -c pass", mood="BOLD")
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 1, proc.stderr  # the broadened lint keeps failing: no fix
    assert "[plan] BOLD: unit#0\n" in proc.stderr
    assert "the core is green: broadening coverage with style" in proc.stderr
    assert "[plan] BOLD: style#0" in proc.stderr
    assert not [a for a in atoms() if a["kind"] == "ASSERT"]
    item = work_item(tmp_path, f"{PY} {tmp_path / 'fix.py'}", mood="BOLD")
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 0, proc.stderr
    claim = next(a for a in atoms() if a["kind"] == "ASSERT" and not a["references"])
    # BOLD broadens with the mutation check too (the core's tests on mutants of the change)
    assert claim["required_verifiers"] == ["style", "unit", "unit.mutants"]


def test_a_part_that_cannot_be_satisfied_halts_the_run_as_its_parent(tmp_path: Path) -> None:
    item = two_bugs(tmp_path, knows=("add",))
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "halted" and out["work_item"] == "calc" and out["attempt"] == 3
    # the parts draw on the 3 attempts the parent had left (one budget, not 2 per part):
    # part 1 takes one, part 2 the last two, and the run stops at max_attempts
    assert out["reason"] == ("part calc~2 could not be satisfied: verification failed; "
                             "attempt budget spent (6/6)")
    assert len((tmp_path / "repo" / ".executor.log").read_text().splitlines()) == 6
    asserted = {a["work_item"] for a in atoms() if a["kind"] == "ASSERT" and a["references"]}
    assert asserted == {"calc~1"}  # the part that was done stays done; the whole is not
    assert choir("gate", "calc").returncode == 1
