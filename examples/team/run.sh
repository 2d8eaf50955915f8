#!/usr/bin/env bash
# A plan of three items: run side by side in worktrees, merged through the gate, the
# integration tree verified after each merge; then choir gate and choir promote.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
if [ "${KEEP:-0}" = 1 ]; then trap 'echo "== kept $work"' EXIT; else trap 'rm -rf "$work"' EXIT; fi
export CHOIR_HOME="${CHOIR_HOME:-$work/choir-home}"
cp -r "$here/repo" "$here/plan.yaml" "$work/"
git -C "$work/repo" init -q -b main
git -C "$work/repo" add -A
git -C "$work/repo" -c user.name=demo -c user.email=demo@localhost commit -qm base
git -C "$work/repo" switch -q -c work  # promotion never moves a checked-out branch

echo "== choir plan run plan.yaml"
choir plan run "$work/plan.yaml"
echo "== choir gate demo"
choir gate demo
echo "== choir promote demo --to main"
choir promote demo --to main
git -C "$work/repo" log --oneline main
