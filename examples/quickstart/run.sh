#!/usr/bin/env bash
# The main job on the embedded default: no API key, no Docker engine needed (bubblewrap is
# used when installed, else the unsafe local sandbox, and every attestation says which).
#   choir run: FAIL -> HYPOTHESIZE -> the executor fixes from bounded feedback -> PASS ->
#   signed attestation -> ASSERT; then choir gate, choir ahdb list and a clean choir audit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
export CHOIR_HOME="${CHOIR_HOME:-$work/choir-home}"
cp -r "$here/repo" "$here/fix.py" "$here/workitem.yaml" "$work/"
echo "== working copy: $work   CHOIR_HOME: $CHOIR_HOME"

echo "== choir run workitem.yaml"
choir run "$work/workitem.yaml"

echo "== choir gate fix-add --repo (exit 0 only for exactly this tree)"
choir gate fix-add --repo "$work/repo"

echo "== choir ahdb list"
choir ahdb list

echo "== choir audit"
choir audit
