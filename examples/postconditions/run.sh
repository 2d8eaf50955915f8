#!/usr/bin/env bash
# Postconditions, offline: the action sets a flag in a SQLite file; read_after_write,
# invariant_check and a custom verifier (verifiers/audit_logged.py) check the effect.
#   attempt 1: the audit row is missing -> audit_logged FAIL (drift yellow) -> feedback
#   attempt 2: the row is there -> every required postcondition PASSes -> ASSERT
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
if [ "${KEEP:-0}" = 1 ]; then
  trap 'echo "== kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
export CHOIR_HOME="${CHOIR_HOME:-$work/choir-home}"
cp -r "$here/repo" "$here/act.py" "$here/workitem.yaml" "$work/"
chmod 755 "$work"
echo "== working copy: $work   CHOIR_HOME: $CHOIR_HOME   (KEEP=1 keeps them)"

echo "== choir run workitem.yaml"
choir run "$work/workitem.yaml"

echo "== choir ahdb list"
choir ahdb list

echo "== choir audit"
choir audit
