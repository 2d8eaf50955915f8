"""The scripted long run shown in docs/concepts.md ("The governance loop, from a real run"):
``python -m tests.integration.governance_longrun`` runs, through the real CLI, real sandboxes
and a real AHDB, (1) a flaky verifier, (2) a failure that divides, whose second part does
not divide further, and prints each run's sequence of decisions with their reasons."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from tests.integration import test_loop_lenses as loop

_runs: list[subprocess.CompletedProcess[str]] = []
_choir = loop.choir


def _recording(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[
        str]:
    proc = _choir(*args, env=env)
    if args[:1] == ("run",):
        _runs.append(proc)
    return proc


def main() -> None:
    loop.choir = _recording  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        for name, scenario in (
                ("a flaky verifier", lambda t, h: loop.
                 test_flaky_evidence_gets_other_lenses_never_promotes_and_goes_back_to_the_executor(
                     t, h)),
                ("a failure that divides, and a part that does not",
                 lambda t, h: loop.test_a_part_that_cannot_be_satisfied_halts_the_run_as_its_parent(
                     t))):
            base = Path(tmp) / name.replace(" ", "-").replace(",", "")
            home = base / "choir-home"
            home.mkdir(parents=True)
            os.environ.update(CHOIR_HOME=str(home), CHOIR_ARTIFACT_DIR=str(home / "artifacts"),
                              CHOIR_SEEN_HEADS=str(base / "seen-heads"))
            scenario(base, home)
            out = json.loads(_runs[-1].stdout)
            print(f"### {name}: {out['status']} after {out['attempt']} attempt(s)")
            for event in out["events"]:
                if event.startswith(("attested", "episode sealed")):
                    continue
                print(f"- {event}")
            print()
            for atom in loop.atoms():
                if atom["kind"] == "HYPOTHESIZE":
                    print(f"HYPOTHESIZE ({atom['work_item']}, {atom['status']}): "
                          f"{atom['claim']}\n  experiment: {atom['discriminating_test']}")
            print()


if __name__ == "__main__":
    main()
