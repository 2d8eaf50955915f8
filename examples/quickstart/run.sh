#!/usr/bin/env bash
# The main job on the embedded default: no API key, no Docker engine needed (bubblewrap is
# used when installed, else the unsafe local sandbox, and every attestation says which).
#   choir run: FAIL -> HYPOTHESIZE -> the executor fixes from bounded feedback -> PASS ->
#   signed attestation -> ASSERT; then choir gate, choir ahdb list and a clean choir audit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
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
# The example's checks run pytest in the sandbox with the project's interpreter: the active
# venv, else the Python Choir's venv was made from (a step never sees Choir's own venv, whose
# pytest plugins would leak into the project's run). Where that Python has no pytest (a new
# user's system Python), the example's project gets a venv of its own with it, as a real
# project has, beside the working copy; the checks then run with it.
{ read -r base; read -r own; } < <(python3 -c 'import os, sys
print(os.path.realpath(sys._base_executable)); print(os.path.realpath(sys.prefix))')
checks="$base"  # the interpreter the checks will run: an active venv not Choir's own, else base
if [ -n "${VIRTUAL_ENV:-}" ] && [ "$(realpath "$VIRTUAL_ENV")" != "$own" ]; then
  checks="$VIRTUAL_ENV/bin/python"
fi
if ! "$checks" -c "import pytest" 2>/dev/null; then
  echo "== $checks has no pytest: the example's project gets a venv with it ($work/venv)"
  if ! { "$base" -m venv "$work/venv" && "$work/venv/bin/python" -m pip install -q \
           --disable-pip-version-check pytest; }; then
    echo "run.sh: could not make the example's venv with pytest ($work/venv) from $base" >&2
    echo "  fix: give that interpreter pytest ('sudo apt-get install python3-pytest' on" >&2
    echo "  Debian or Ubuntu), or activate a venv that has it; then run this again" >&2
    exit 2
  fi
  export VIRTUAL_ENV="$work/venv"
fi

echo "== choir run workitem.yaml"
choir run "$work/workitem.yaml"

echo "== choir gate fix-add --repo (exit 0 only for exactly this tree)"
choir gate fix-add --repo "$work/repo"

echo "== choir ahdb list"
choir ahdb list

echo "== choir audit"
choir audit
