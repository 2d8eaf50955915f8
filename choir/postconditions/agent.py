"""Postconditions for ``choir.Agent`` tools: after a tool that mutates state, check it.

``Agent(postconditions={"set_flag": [Postcondition(...)]})``: after each successful call of
``set_flag`` the declared postconditions run, each in its own process (the same harness
and verdict rules as a ``choir.yaml`` postcondition: a raise, crash, hang or malformed
result is INCONCLUSIVE). Anything but PASS goes back to the model as the Agent's
``<verification_rejected>`` block and counts one verification attempt, exactly as a
rejected final output does. The context's ``action`` is the tool name and its arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from choir.postconditions.spec import DEFAULT_VERIFY_TIMEOUT_MS, GRACE_S, Resource, harness_source

Outcome = Literal["pass", "fail", "inconclusive"]
_OUTCOMES: dict[int, Outcome] = {0: "pass", 1: "fail", 3: "inconclusive"}


@dataclass(frozen=True)
class CheckResult:
    name: str
    outcome: Outcome
    detail: str

    @property
    def severity(self) -> str | None:
        return {"pass": None, "fail": "yellow", "inconclusive": "red"}[self.outcome]


@dataclass(frozen=True)
class Postcondition:
    """One check of a tool's effect.

    Exactly one of ``callable`` (``verifiers/x.py``, ``path.py:fn`` or ``module:function``,
    called with the context), ``read_after_write`` or ``invariant_check`` (the scaffolds'
    options, as in ``choir.yaml``, naming a resource of ``resources``). Named SQL parameters
    and ``expect_from`` read the tool's arguments.
    """

    name: str
    callable: str | None = None
    read_after_write: dict[str, Any] | None = None
    invariant_check: dict[str, Any] | None = None
    resources: dict[str, Resource] = field(default_factory=dict)
    timeout_s: float | None = None
    cwd: str = "."
    required_above_blast_radius: str = "none"

    def required(self, blast_radius: str | None) -> bool:
        """Whether this check runs for an action of ``blast_radius`` (the DTE's rule:
        above the threshold; no radius given means the largest)."""
        from choir.postconditions.decisions import _ORDER

        return _ORDER[blast_radius or "large"] > _ORDER[self.required_above_blast_radius]

    def __post_init__(self) -> None:
        given = [m for m in ("callable", "read_after_write", "invariant_check")
                 if getattr(self, m) is not None]
        if len(given) != 1:
            raise ValueError(f"postcondition {self.name!r}: give exactly one of callable, "
                             "read_after_write, invariant_check")
        if self.required_above_blast_radius not in ("none", "small", "medium", "large"):
            raise ValueError(f"postcondition {self.name!r}: required_above_blast_radius must "
                             "be none, small, medium or large")
        options = self.read_after_write or self.invariant_check or {}
        named = options.get("resource")
        needs = self.read_after_write is not None or \
            self.invariant_check is not None and not self.invariant_check.get("callable")
        if named is None and needs or named is not None and named not in self.resources:
            raise ValueError(f"postcondition {self.name!r}: resource {named!r} is not one of "
                             f"resources ({', '.join(sorted(self.resources)) or 'none given'})")

    def _payload(self) -> dict[str, Any]:
        repo = Path(self.cwd).resolve()
        method = "callable" if self.callable else \
            "read_after_write" if self.read_after_write is not None else "invariant_check"
        payload: dict[str, Any] = {"name": self.name, "method": method, "hosts": [],
                                   "resources": {n: r.for_harness(repo)
                                                 for n, r in self.resources.items()}}
        ms = DEFAULT_VERIFY_TIMEOUT_MS
        if self.callable:
            payload["callable"] = self.callable
        else:
            options = dict(self.read_after_write or self.invariant_check or {})
            ms = int(options.get("verify_timeout_ms", ms))
            options["verify_timeout_ms"] = ms
            named = options.pop("resource", None)  # an invariant's callable may read alone
            payload.update(options)
            if named is not None:
                payload["resource"] = self.resources[named].for_harness(repo)
        payload["timeout_s"] = self.timeout_s or (ms / 1000 + GRACE_S if not self.callable
                                                  else 30.0)
        return payload

    def check(self, context: dict[str, Any]) -> CheckResult:
        """Run the harness in a new process; the verdict is its exit code. Never raises."""
        from choir.postconditions._harness import ARGV, START_S

        payload = self._payload()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "CHOIR_PC_HARNESS": harness_source(),
               "CHOIR_PC_SPEC": json.dumps(payload, sort_keys=True),
               "CHOIR_PC_CONTEXT": json.dumps(context, sort_keys=True, default=str)}
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, *ARGV], cwd=self.cwd,
                                  env=env, capture_output=True, text=True,
                                  timeout=START_S + payload["timeout_s"] + GRACE_S,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            return CheckResult(self.name, "inconclusive",
                               f"did not finish within {time.monotonic() - started:.1f} s")
        except OSError as exc:  # E2BIG: a tool's arguments past the kernel's 128 KiB for one
            # variable (review 17d); the check could not start, so it says nothing
            return CheckResult(self.name, "inconclusive",
                               f"the check could not start: {exc.strerror or exc}")
        outcome = _OUTCOMES.get(proc.returncode, "inconclusive")
        marker = f"[choir] postcondition {self.name}: "
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)]
        detail = lines[-1].split(": ", 2)[-1] if lines else f"exit {proc.returncode}"
        return CheckResult(self.name, outcome, detail[:600])
