"""Postcondition verifiers (docs/postconditions.md): success means verified after an action.

A postcondition is a verifier that checks an action's effect on a system, not a working
tree: a callable ``verify(context) -> VerificationResult`` from the repo's ``verifiers/``
folder or an installed ``module:function``, or one of the shipped scaffolds
``read_after_write`` and ``invariant_check`` against a resource declared in ``choir.yaml``.
Each runs in its own process inside the sandbox (``_harness.py``), and its result becomes a
report and an attestation through the same path as a command verifier. See
docs/postconditions.md.
"""

from __future__ import annotations

from choir.postconditions.result import Outcome, VerificationResult

__all__ = ["Outcome", "VerificationResult"]
