#!/usr/bin/env bash
# The main job on the embedded default: no API key, no Docker engine needed (bubblewrap is
# used when installed, else the unsafe local sandbox, and the attestations say which).
#   FAIL (with a cited failure signature) -> a fix -> PASS -> signed attestation -> clean audit
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
export CHOIR_HOME="${CHOIR_HOME:-$work/choir-home}"
cp -r "$here/repo" "$work/repo"
echo "== working copy: $work/repo   CHOIR_HOME: $CHOIR_HOME"

echo "== 1. verify the buggy tree (expect FAIL)"
if choir verify --repo "$work/repo" --json >"$work/round1.json"; then
  echo "unexpected PASS"; exit 1
fi
python3 - "$work/round1.json" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
for r in out["reports"]:
    print(f"   {r['verifier']}: {r['result']}  {r['summary']}")
    for s in r["failure_signatures"]:
        c = s["citation"]
        print(f"     signature {s['id'][:12]} {s['test_id']}: {s['excerpt']}")
        print(f"       cited: artifact {c['artifact'][:12]} lines {c['line_start']}-{c['line_end']}")
# the executor sees only the bounded reports, never the raw log
json.dump(out["reports"], open(sys.argv[1] + ".feedback", "w"))
PY

echo "== 2. the executor applies a fix from the bounded feedback"
CHOIR_FEEDBACK_FILE="$work/round1.json.feedback" python3 "$here/fix.py" "$work/repo"

echo "== 3. verify again (expect PASS, SKEPTICAL: every verifier)"
choir verify --repo "$work/repo" --mood SKEPTICAL

echo "== 4. audit every hash, signature and event"
choir audit
