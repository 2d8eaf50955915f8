#!/usr/bin/env bash
# The main job on the embedded default: no API key, no Docker engine needed (bubblewrap is
# used when installed, else the unsafe local sandbox, and every attestation says which).
#   choir run: FAIL -> HYPOTHESIZE -> the executor fixes from bounded feedback -> PASS ->
#   signed attestation -> ASSERT; then choir gate, choir ahdb list and a clean choir audit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# The example's checks run pytest with the Python Choir's venv was made from, in the
# sandbox: a step never sees Choir's own venv. Without pytest there, every round would be
# INCONCLUSIVE and the run would halt after its nested rounds: say so now, with the fix.
base="$(python3 -c 'import os, sys; print(os.path.realpath(sys._base_executable))')"
if ! "$base" -c "import pytest" 2>/dev/null; then
  echo "run.sh: the example's checks run pytest with the Python Choir's venv was made from" >&2
  echo "  ($base), which has no pytest (Choir's own venv is never visible to a check)." >&2
  echo "  fix: give that interpreter pytest ('sudo apt-get install python3-pytest' on Debian" >&2
  echo "  or Ubuntu), or make Choir's venv from a Python that has it; then run this again" >&2
  exit 2
fi
work="$(mktemp -d)"
# The working copy (and CHOIR_HOME, unless you set one) is removed on exit; KEEP=1 keeps it,
# e.g. to look at the run afterwards with `choir runs list` / `choir runs show RUN_ID`.
if [ "${KEEP:-0}" = 1 ]; then
  trap 'echo "== kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
export CHOIR_HOME="${CHOIR_HOME:-$work/choir-home}"
cp -r "$here/repo" "$here/fix.py" "$here/workitem.yaml" "$work/"
echo "== working copy: $work   CHOIR_HOME: $CHOIR_HOME   (KEEP=1 keeps them)"

echo "== choir run workitem.yaml"
choir run "$work/workitem.yaml"

echo "== choir gate fix-add --repo (exit 0 only for exactly this tree)"
choir gate fix-add --repo "$work/repo"

echo "== choir ahdb list"
choir ahdb list

echo "== choir audit"
choir audit
