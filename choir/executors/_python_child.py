"""The ``python`` executor's child: ``python -m choir.executors._python_child module:function``.

Runs inside the executor's sandbox so that user code is never imported into Choir's own
process (it could read the signing key there). The work item, attempt and feedback arrive
through the same files and variables the ``command`` executor gets; the function's return
value is printed, so it reaches the artifact store through the captured output; an
exception is a non-zero exit with its traceback in that output.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from choir.models import VerificationReport, WorkItem


def main(argv: list[str]) -> int:
    module, _, name = (argv[0] if argv else "").partition(":")
    if not module or not name:
        print(f"[choir] expected module:function, got {argv!r}", file=sys.stderr)
        return 2
    with open(os.environ["CHOIR_WORKITEM_FILE"]) as fh:
        item = WorkItem.model_validate_json(fh.read())
    feedback: list[VerificationReport] = []
    if os.environ.get("CHOIR_FEEDBACK_FILE"):
        with open(os.environ["CHOIR_FEEDBACK_FILE"]) as fh:
            feedback = [VerificationReport.model_validate(r) for r in json.load(fh)]
    try:
        fn = getattr(importlib.import_module(module), name)
        result = fn(item, int(os.environ["CHOIR_ATTEMPT"]), feedback)
    except Exception:  # noqa: BLE001 - the user's failure is the executor's exit code
        traceback.print_exc()
        return 1
    if result is not None:
        print(str(result)[:65536])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
