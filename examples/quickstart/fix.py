"""A scripted executor: reads the last round's bounded feedback and applies the fix."""

import json
import os
import sys
from pathlib import Path

repo = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
feedback = os.environ.get("CHOIR_FEEDBACK_FILE")
if not feedback:
    print("fix.py: no feedback yet: nothing to fix")  # attempt 1: verify the tree as it is
    sys.exit(0)
reports = json.loads(Path(feedback).read_text())
failing = [s["test_id"] for r in reports for s in r.get("failure_signatures", [])]
print(f"fix.py: feedback names {failing}")
calc = repo / "calc.py"
calc.write_text(calc.read_text().replace("return a - b", "return a + b"))
print("fix.py: add() now adds")
