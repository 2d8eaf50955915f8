"""The CI run: ``choir verify``, the in-toto bundle, ``choir gate`` with its VSA, the key.

Each step is the ``choir`` command itself, in a process of its own, so each signs through its
own broker with the key folder hidden from it, exactly as on a terminal; this process never
loads the key. It reads only what those commands print (the verify contract as JSON, the
gate's lines) and passes it on to the summary and the log through ``choir.ci.github``.

What is written to the out folder, for the upload: ``choir.intoto.jsonl`` (the bundle:
Choir's statement and the test result per attestation, then the gate's VSA), ``vsa.json``
(the VSA alone), ``verify.json`` (the contract), ``choir-key.json`` (the public key, in
securesystemslib's form, that checks every signature), ``summary.md``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from choir._core.errors import UserError
from choir._core.terminal import one_line
from choir.ci.summary import Outcome

# -P: ``-m`` would put the working directory (the repo under verification, in CI) first on
# the import path, and a ``choir/`` planted there would run instead, with the key in reach
CHOIR = (sys.executable, "-P", "-m", "choir")
BUNDLE = "choir.intoto.jsonl"
VSA = "vsa.json"
KEY = "choir-key.json"
CONTRACT = "verify.json"
SUMMARY = "summary.md"

Relay = Callable[[list[str]], None]
"""Where the progress lines of ``choir verify`` go (hostile: verifier names, summaries)."""


@dataclass(frozen=True)
class Options:
    """What the action's inputs or the hook's arguments ask for."""

    repo: Path
    out: Path
    claim: str = "ci"
    mood: str | None = None
    sandbox: str | None = None
    resource_uri: str | None = None
    base: str | None = None
    """The commit whose choir.yaml and checks verify the tree (``choir verify --base``)."""
    approve_spec: bool = False
    """A person approved the tree's changes to the base's checks."""
    isolated: bool = False
    """Refuse a run whose verifiers had no isolation unless ``sandbox`` is ``local`` (the
    action's: the tree is a pull request's; the hook runs on the developer's own)."""


def _choir(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHOIR, *args], capture_output=True, text=True, cwd=cwd,
                          stdin=subprocess.DEVNULL, check=False)


def _verify(opts: Options, relay: Relay) -> tuple[int, dict[str, Any] | None, str]:
    """Run ``choir verify --json --claim``: (exit code, contract or None, stderr)."""
    args = ["verify", "--repo", str(opts.repo), "--json", "--claim", opts.claim]
    if opts.mood:
        args += ["--mood", opts.mood]
    if opts.sandbox:
        args += ["--sandbox", opts.sandbox]
    if opts.base:
        args += ["--base", opts.base] + (["--approve-spec-change"] if opts.approve_spec else [])
    contract_path = opts.out / CONTRACT
    with create_new(contract_path) as stdout:
        proc = subprocess.Popen([*CHOIR, *args], stdout=stdout, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True)
        assert proc.stderr is not None
        err_lines = []
        batch: list[str] = []
        for line in proc.stderr:
            err_lines.append(line)
            batch.append(line)
            if len(batch) >= 20:
                relay(batch)
                batch = []
        if batch:
            relay(batch)
        code = proc.wait()
    try:
        contract = json.loads(contract_path.read_bytes())
    except ValueError:
        contract = None
    if not isinstance(contract, dict) or "run_id" not in contract:
        contract_path.unlink(missing_ok=True)
        contract = None
    return code, contract, "".join(err_lines[-40:])


def create_new(path: Path) -> BinaryIO:
    """The new file ``path``, open for writing: one left there (a link a checkout planted,
    say) is removed first, and the file is created, never opened through a link."""
    path.unlink(missing_ok=True)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o644), "wb")


def write_new(path: Path, data: bytes) -> None:
    with create_new(path) as fh:
        fh.write(data)


def _key(shown_json: str, out: Path) -> str | None:
    """Write the public key ``choir keys show --json`` printed as securesystemslib reads it;
    its key id."""
    try:
        shown = json.loads(shown_json)
        raw = base64.b64decode(shown["public_key"], validate=True)
    except (ValueError, KeyError, TypeError):
        return None
    key = {"keyid": shown["key_id"], "keytype": "ed25519", "scheme": "ed25519",
           "keyval": {"public": raw.hex()}}
    write_new(out / KEY, (json.dumps(key, indent=2) + "\n").encode())
    return str(shown["key_id"])


def run(opts: Options, relay: Relay) -> Outcome:
    """Verify; then bundle, gate and show the key side by side; the outcome (see
    ``Outcome.status`` for what passes)."""
    try:
        if opts.out.is_symlink():  # ./choir-ci in a checkout is the pull request's to plant:
            opts.out.unlink()       # the step writes into a folder of its own, never through it
        opts.out.mkdir(parents=True, exist_ok=True)
        for stale in (BUNDLE, VSA, KEY, CONTRACT, SUMMARY):  # an earlier run's, or a planted
            (opts.out / stale).unlink(missing_ok=True)       # link: never current, followed
    except OSError as exc:
        raise UserError(f"the out folder {opts.out} cannot be made: {exc.strerror or exc}\n"
                        "  fix: set CHOIR_CI_OUT (--out) to a folder you can write") from None
    code, contract, err = _verify(opts, relay)
    outcome = Outcome(verify_code=code, contract=contract, error=err)
    if contract is None:
        return outcome
    platform = (contract.get("manifest") or {}).get("platform") or {}
    if opts.isolated and platform.get("isolation") == "none" and opts.sandbox != "local":
        # the tree's choir.yaml (the pull request's, in CI) may name `local`, and `auto` falls
        # back to it where nothing isolates: its steps ran as the job, beside the runner
        outcome.unisolated = True
        outcome.gate_lines.append(
            "refused: the verifiers ran with no isolation (sandbox "
            f"{one_line(platform.get('sandbox', '?'), 40)}), which the tree's choir.yaml or the "
            "lack of an isolating sandbox chose, not the workflow; fix: install bubblewrap or "
            "Docker on the runner, or set the action's sandbox input to local to allow it")
    bundle, vsa = opts.out / BUNDLE, opts.out / VSA
    gate_args = ["gate", opts.claim, "--repo", str(opts.repo), "--vsa", str(vsa)]
    if opts.resource_uri:
        gate_args += ["--resource-uri", opts.resource_uri]
    with ThreadPoolExecutor(max_workers=3) as pool:  # three processes, each mostly start-up
        making = pool.submit(_choir, "attest", "bundle", "--session", str(contract["run_id"]),
                             "--out", str(bundle))
        gating = pool.submit(_choir, *gate_args)
        showing = pool.submit(_choir, "keys", "show", "--json")
        made, gate, shown = making.result(), gating.result(), showing.result()
    if made.returncode != 0:
        outcome.gate_lines.append(f"no bundle: {made.stderr.strip()[-500:]}")
    outcome.gate_code = gate.returncode
    outcome.gate_lines += [line for line in (gate.stdout + gate.stderr).splitlines() if line]
    if vsa.is_file():
        with open(bundle, "a", encoding="utf-8") as fh:
            fh.write(vsa.read_text(encoding="utf-8"))
    if bundle.is_file():
        outcome.bundle = str(bundle)
        outcome.envelopes = sum(1 for line in bundle.read_text().splitlines() if line)
    outcome.key_id = _key(shown.stdout, opts.out)
    return outcome


def upload_paths(outcome: Outcome, out: Path) -> list[str]:
    """What the action uploads: the out folder, the session's run folder, each verifier's."""
    paths = [str(out)]
    contract = outcome.contract or {}
    run_id = contract.get("run_id")
    if isinstance(run_id, str):
        from choir._core.paths import artifact_dir

        session = artifact_dir() / "runs" / run_id
        if session.is_dir() and os.sep not in run_id and ".." not in run_id:
            paths.append(str(session))
    paths += [p for p in contract.get("artifact_paths") or []
              if isinstance(p, str) and Path(p).is_dir()]
    return paths
