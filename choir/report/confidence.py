"""A report's CONFIDENCE, calibrated from what is known about the verifier and the run.

The deterministic table (PASS 0.9, FAIL 0.95, INCONCLUSIVE 0.2, FLAKY 0.4) is the ceiling;
calibration only lowers it, never raises it:

- isolation ``none``: at most 0.7 (the environment may be adversarial);
- the lens: a run over a subset of the tests (``isolated_subset``) says nothing of the rest,
  so its PASS is worth at most 0.8;
- history: the verifier's reversal rate in the AHDB (on how many of the trees it judged its
  evidence disagreed with itself). A verifier that reversed on one tree in five is trusted
  a fifth less. With fewer than ``MIN_TREES`` trees there is too little history to say.

The basis is one short line, shown in the report (a HYPERTHESIS line).
"""

from __future__ import annotations

from choir.models import Result, VerifierHistory
from choir.models.report import CONFIDENCE

TABLE = CONFIDENCE  # the ceiling, by result
UNSANDBOXED = 0.7
SUBSET_PASS = 0.8
MIN_TREES = 3


def calibrate(verdict: Result, *, isolation: str, lens: str = "default",
              history: VerifierHistory | None = None) -> tuple[float, str]:
    """The confidence of ``verdict`` and the basis, in one line."""
    value = TABLE[verdict]
    basis = [f"table {value:.2f}"]
    if isolation == "none":
        value = min(value, UNSANDBOXED)
        basis.append(f"isolation none: at most {UNSANDBOXED:.2f}")
    if lens == "isolated_subset" and verdict is Result.PASS:
        value = min(value, SUBSET_PASS)
        basis.append(f"lens isolated_subset: at most {SUBSET_PASS:.2f}")
    if history is not None:
        if history.trees >= MIN_TREES:
            rate = min(1.0, history.reversals / history.trees)
            value *= 1.0 - rate
            basis.append(f"reversed on {history.reversals} of {history.trees} trees")
        else:
            basis.append(f"history of {history.trees} tree(s): too little to calibrate")
    value = round(max(0.0, min(value, TABLE[verdict])), 2)
    return value, f"Confidence {value:.2f}: " + "; ".join(basis) + "."
