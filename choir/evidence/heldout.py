"""What a held-out verifier reads, and what the executor may learn of it.

A held-out check (``choir.config.heldout``) is worth something only while the executor has
not seen it. So its files never enter the executor's tree or sandbox: its green thread reads
a private, read-only copy of the verified tree with the files added at ``.choir-heldout/``
(``heldout_tree``), one mechanism for every sandbox (bwrap, Docker, a remote worker that
receives the tree). The files are checked against the hash pinned with the run's
configuration first: a folder edited mid-run verifies nothing.

Its report keeps everything for the person (the attestation, the artifacts, ``choir run``'s
output), but what reaches the executor's feedback or a Director prompt is the result alone
(``redact``): no test names, failure signatures, excerpts, citations, log lines, counts, or a
model's confidence or token usage to fit the code to.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from choir.config.heldout import HELDOUT_DIR, files_hash, files_of
from choir.evidence.tree import remove_snapshot
from choir.exceptions import ConfigError, IntegrityError
from choir.models import HeldOut, VerificationReport, VerifierSpec
from choir.models.report import CONFIDENCE

# the one confidence a result may carry to the executor, whatever the report said
HELDOUT_CONFIDENCE = CONFIDENCE
NEXT = ("A held-out check the executor cannot read failed: make the code meet the goal for "
        "every input, not just the visible tests.",)


def heldout_tree(tree: Path, heldout: HeldOut, root: Path) -> Path:
    """A sealed copy of ``tree`` with the held-out files at ``HELDOUT_DIR`` (any folder of
    that name the executor left is dropped first); the caller removes it (``remove_snapshot``).

    Raises:
        IntegrityError: the held-out files no longer hash to what was pinned.
    """
    folder = Path(heldout.path)
    try:
        files = files_of(folder)
    except (ConfigError, OSError) as exc:
        raise IntegrityError(f"held-out folder {folder} cannot be read: {exc}") from None
    if files_hash(files) != heldout.files_hash:
        raise IntegrityError("the held-out files changed since the run pinned them; "
                             "nothing verified")
    copy = root / f".heldout-{os.getpid()}-{secrets.token_hex(6)}"
    try:
        shutil.copytree(tree, copy, symlinks=True)
        os.chmod(copy, 0o755)
        planted = copy / HELDOUT_DIR
        if os.path.lexists(planted):
            if planted.is_dir() and not planted.is_symlink():
                remove_snapshot(planted)
            else:
                planted.unlink()
        for rel in files:
            src, dst = folder / rel, planted / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
            dst.write_bytes(data)
            os.chmod(dst, 0o444)
        check = files_of(planted) if planted.exists() else {}
        if files_hash(check) != heldout.files_hash:
            raise IntegrityError("the held-out files changed while they were copied")
        for dirpath, _dirs, _names in os.walk(copy, topdown=False):
            os.chmod(dirpath, 0o555)
    except BaseException:
        remove_snapshot(copy)
        raise
    return copy


def is_heldout(report: VerificationReport, specs: Mapping[str, VerifierSpec]) -> bool:
    spec = specs.get(report.verifier)
    return spec is not None and spec.heldout is not None


def counts_only(report: VerificationReport) -> VerificationReport:
    """The report as the executor may see it: its result, nothing to fit.

    Built anew from an allowlist (who verified what, with which parser, and the result), not
    copied with a denylist blanked: the code under test runs in the held-out step and may read
    the held-out files, so every other field is a channel it can steer. The counts are what
    the step's JUnit XML declares (an agent read a hidden test back a dozen bytes a round
    through them, review 18c); a reporter model's confidence is any float, its digits chosen
    by text the step prints, and its usage grows with that text (review 20). So the confidence
    is the fixed table value for the result, the usage empty, the wording deterministic, and
    a field added to the model later stays at its default here. The person's report keeps
    everything."""
    return VerificationReport(
        verifier=report.verifier, verifier_type=report.verifier_type, target=report.target,
        result=report.result, parser=report.parser,
        summary=f"held-out check {report.result.value}", next_actions=NEXT,
        confidence=HELDOUT_CONFIDENCE[report.result])


def redact(reports: Sequence[VerificationReport],
           specs: Mapping[str, VerifierSpec]) -> list[VerificationReport]:
    """``reports`` for the executor's feedback or a Director prompt: held-out ones as their
    result alone (``counts_only``)."""
    return [counts_only(r) if is_heldout(r, specs) else r for r in reports]
