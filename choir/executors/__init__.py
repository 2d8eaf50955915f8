"""Executors by name: what changes the working tree between verification rounds.

``command`` runs a shell command in the repo with ``CHOIR_WORKITEM_FILE``, ``CHOIR_ATTEMPT``
and ``CHOIR_FEEDBACK_FILE`` (the last round's reports as bounded JSON: never raw output).
``python`` calls ``module:function(work_item, attempt, feedback)`` in a child process
(``python -m choir.executors._python_child``): user code is never imported into Choir's process.

Both run the user's code, which may be hostile: it must not read the signing
key or write Choir's stores, or it could mint a PASS attestation for a failing tree. So both
run in bubblewrap with the repo writable, the work item's folder and the toolchain
read-only, ``CHOIR_HOME`` and the artifact store masked, network off unless the work item
turns it on, and a fresh PID namespace that dies with the step: nothing the executor
started outlives it. The parent streams the output into the artifact store;
the run keeps only its hash, exit code and timed-out flag.

Why the repo owner's uid: bwrap maps the sandbox user to the caller's uid, so a root
Choir writes a root-owned repo with its files' owner unchanged, with every capability
dropped. That makes masking, not permissions, what keeps the key out of reach: anything
of Choir's that lies under a bound folder is hidden (``masked_paths``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from choir._core.paths import artifact_dir, choir_home
from choir._core.registry import EXECUTORS
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import ConfigError, SandboxError, UserError
from choir.executors import gitguard
from choir.executors.pinned import current_gate
from choir.models import Limits, VerificationReport, WorkItem
from choir.models.run import ExecutorIsolation, ExecutorOutput
from choir.models.workitem import ExecutorSpec
from choir.sandbox._toolchain import check_bind, choose, holds_shared_root
from choir.sandbox.bwrap import BwrapSandbox
from choir.sandbox.local import LocalSandbox

_NEVER = ("/run", "/var/run", "/proc", "/sys", "/dev")  # the Docker socket lives there
_CHILD = "choir.executors._python_child"  # run with -m: the user's code stays out of Choir
LOG_LIMIT = 16 << 20  # executor output kept per attempt; the rest is counted, not stored


class Executor(Protocol):
    """``executor(item, attempt, feedback, run_id=...)``: one attempt at the work item."""

    def __call__(self, item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
                 run_id: str | None = None) -> ExecutorOutput: ...


def register_executor(name: str) -> Callable[[Executor], Executor]:
    """Decorator: register an executor in this process (a plugin uses an entry point)."""
    return EXECUTORS.register(name)


def get_executor(name: str) -> Executor:
    """The executor named by a work item's ``executor.kind``.

    Raises:
        UnknownNameError: no built-in, plugin or registered executor has that name.
    """
    executor: Executor = EXECUTORS.get(name)
    return executor


def executor_names() -> list[str]:
    return EXECUTORS.names()


def feedback_json(reports: Sequence[VerificationReport]) -> bytes:
    """The executor's view of the last round: bounded reports only."""
    return json.dumps([r.model_dump(mode="json") for r in reports], indent=1).encode()


def executor_isolation(spec: ExecutorSpec) -> ExecutorIsolation:
    """The isolation ``spec`` will run with here; the execute node checks it against the mood.

    ``auto`` falls back to ``none`` with a loud warning when bubblewrap cannot run, so the
    quickstart still works on a bare machine; PARANOID refuses that (``allow_unsafe``).

    Raises:
        UserError: ``sandbox: bwrap`` was asked for and bubblewrap cannot run here.
    """
    executor = get_executor(spec.kind)
    if not getattr(executor, "runs_in_bwrap", False):
        # not ours to sandbox: it declares its isolation (llm: "tools"), else it is "none"
        declared: ExecutorIsolation = getattr(executor, "isolation", "none")
        return declared
    if spec.sandbox == "none":
        return "none"

    if BwrapSandbox.available():
        return "namespace"
    if spec.sandbox == "bwrap":
        raise UserError("the executor asks for 'sandbox: bwrap' but bubblewrap cannot run "
                        "here; install it (apt-get install bubblewrap) or set 'sandbox: none' "
                        "under 'executor:' to trust the executor explicitly")
    warnings.warn("bubblewrap cannot run here: the executor runs UNSANDBOXED with your "
                  "privileges (executor isolation 'none' is recorded in every attestation)",
                  RuntimeWarning, stacklevel=2)
    return "none"


def _passed_env() -> dict[str, str]:
    """The user's environment minus Choir's own settings (the executor must not find them)
    and minus what the sandbox sets itself (home, temp and caches: private per step)."""
    own = {"AGENT_ARTIFACT_DIR", "HOME", "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME"}
    return {k: v for k, v in os.environ.items() if k not in own and not k.startswith("CHOIR_")}


def _around(repo: Path) -> list[Path]:
    """The folder around the repo, readable to the executor (a script beside the repo, as
    ``../fix.py``), unless it holds the user's home: with the common layout ``~/proj`` it
    was the home, and an executor read ``~/.ssh`` and other repos there (Choir's own stores
    in it are masked either way: ``masked_paths``), or is or holds a shared temp root: a
    repo in /var (``/var/www``) had /var bound, and the executor reached the host sockets
    under /var/tmp and read a root-only file under /var/lib (review 23b). The repo itself
    is bound either way, so such an executor still runs; it sees nothing beside the repo
    (a script it needs goes in the repo, or in ``executor.binds``).

    The host's roots only, not Choir's own temp folder (``TMPDIR``): a layout that keeps
    the repo, the script that changes it and a private ``TMPDIR`` side by side (every
    test's ``tmp_path``) would lose the script; a ``TMPDIR`` beside the repo then stays
    readable, other steps' egress sockets included."""
    parent = os.path.realpath(repo.parent)
    home = os.path.realpath(os.path.expanduser("~"))
    if home == parent or home.startswith(parent.rstrip("/") + "/") or \
            holds_shared_root(parent, own_temp=False) is not None:
        return []  # the home; or /tmp, /var: host sockets connect through a read-only bind
    return [repo.parent]


def masked_paths() -> list[Path]:
    """Choir's stores, every held-out folder and the host's password hashes: masked inside
    the sandbox.

    Bound folders (the work item's folder, the toolchain, the repo) may hold CHOIR_HOME,
    as in the quickstart where it sits beside the repo: masking them covers every case.
    """

    from choir.config.heldout import heldout_paths

    found = [p.resolve() for p in (choir_home(), artifact_dir(), Path("/etc/shadow"),
                                   Path("/etc/gshadow")) if p.exists()]
    return [*found, *(p for p in heldout_paths() if not any(p.is_relative_to(f) for f in found))]


def interpreter_in_repo(repo: Path) -> list[Path]:
    """The verifiers' interpreter, where it lies inside the repo: read-only here.

    The repo's ``.venv`` is ignored, so the tree hash does not cover it, yet verifiers run
    it. An executor that wrote it (a ``.pth`` that exits 0 at start-up) would make every
    step pass on the buggy tree under a hash a clean checkout shares. The run's pinned
    configuration names what the verifiers will use; without one, the repo's ``.venv``.
    """
    gate = current_gate()
    found = [repo / ".venv"]
    if gate is not None:
        try:
            # the interpreter only (its binds hold the venv): explicit binds may be state the
            # action is meant to change (a postcondition's SQLite folder), read back later
            found += [Path(p) for p in choose(repo, gate.config.sandbox.python).binds]
        except ConfigError:
            pass  # the verifiers will refuse it too; nothing of it to protect
    kept = {p.resolve() for p in found if p.exists()}
    return sorted(p for p in kept if p != repo and p.is_relative_to(repo))


def spec_in_repo(repo: Path) -> list[Path]:
    """The run's pinned spec paths inside ``repo``: read-only here, so the executor cannot
    weaken, delete or replace a check (nor add a file in a pinned test folder). Verifiers
    never read the executor's spec anyway (``choir.evidence.spec``); this stops the edit
    where it is made, so the executor learns at once that the checks are not its to change.
    """
    gate = current_gate()
    if gate is None:
        return []
    return [p for p in gate.read_only if p != repo and p.is_relative_to(repo)]


def _choir_root() -> Path:
    """Where the ``choir`` package is imported from: the python runner needs it in the box."""
    return Path(__file__).resolve().parents[2]  # choir/executors/__init__.py -> ./


def named_env(names: Sequence[str]) -> dict[str, str]:
    """Only what a program needs to start (PATH, locale, terminal, CA bundles) and the
    variables ``names`` lists, from Choir's environment: an agent gets its API key by name,
    never the user's other credentials."""
    wanted = (*_BASE_ENV, *names)
    return {name: os.environ[name] for name in wanted if name in os.environ}


_BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "SSL_CERT_FILE",
             "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


def _run_user_code(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
                   run_id: str | None, argv: Callable[[Path], str],
                   extra_env: dict[str, str] | None = None, *, clean_env: bool = False,
                   prompt: str | None = None) -> ExecutorOutput:
    """Run ``argv(inputs_dir)`` for one attempt in the executor's sandbox; keep its output.

    ``clean_env`` (or a ``pass_env`` list): only the named variables of Choir's environment;
    else all of it but Choir's own. ``prompt``: written beside the work item, its path in
    ``CHOIR_PROMPT_FILE``.
    """

    isolation = executor_isolation(item.executor)
    spec = item.executor
    repo = Path(item.repo).resolve()
    if any(repo == h or repo.is_relative_to(h) for h in masked_paths() if h.is_dir()):
        raise UserError(f"the repo {repo} lies inside Choir's home or artifact store; move it "
                        "out (an executor may not see Choir's keys or stores)")
    with tempfile.TemporaryDirectory(prefix="choir-exec-") as tmp:
        inputs, out = Path(tmp) / "in", Path(tmp) / "out"
        inputs.mkdir()
        base = named_env(spec.pass_env) if clean_env or spec.pass_env else _passed_env()
        env = {**base, **(extra_env or {}), **spec.env, "CHOIR_ATTEMPT": str(attempt)}
        if run_id:
            env["CHOIR_RUN_ID"] = run_id
        (inputs / "workitem.json").write_text(item.model_dump_json())
        env["CHOIR_WORKITEM_FILE"] = str(inputs / "workitem.json")
        if feedback:
            (inputs / "feedback.json").write_bytes(feedback_json(feedback))
            env["CHOIR_FEEDBACK_FILE"] = str(inputs / "feedback.json")
        if prompt is not None:
            (inputs / "prompt.md").write_text(prompt)
            env["CHOIR_PROMPT_FILE"] = str(inputs / "prompt.md")
        log = Path(tmp) / "executor.log"
        kept = 0

        with open(log, "wb") as sink_file:
            def sink(chunk: bytes) -> None:
                nonlocal kept
                if kept < LOG_LIMIT:
                    sink_file.write(chunk[:LOG_LIMIT - kept])
                kept += len(chunk)

            common = {"repo": repo, "out_dir": out, "env": env,
                      "timeout_s": spec.timeout_s, "limits": Limits(),
                      "network": spec.network, "sink": sink, "repo_writable": True,
                      "hosts": spec.hosts}
            if isolation == "namespace":
                binds = [Path(check_bind(b, origin="executor.binds")) for b in spec.binds]
                readable = sorted({p for p in (*_around(repo), inputs, _choir_root(), *binds)
                                   if p != Path("/") and not str(p).startswith(_NEVER)})
                read_only = [*interpreter_in_repo(repo), *spec_in_repo(repo)]
                # git's control files (config, hooks) as they are now, the repo's and every
                # repository's below it, put back after the sandbox ends; a .git it adds
                # below is removed: a plant there ran at the user's next `git status`
                # (review 25)
                before = gitguard.save(repo, skip=read_only)
                try:
                    result = BwrapSandbox().exec(argv(inputs), readable=readable,
                                                 read_only=read_only,
                                                 hidden=masked_paths(), **common)  # type: ignore[arg-type]
                finally:
                    undone = gitguard.restore(before)
                if undone:
                    sink_file.write(("\n[choir] the executor changed git's control files; put "
                                     f"back as they were: {', '.join(undone[:20])}"
                                     f"{' ...' if len(undone) > 20 else ''}\n").encode())
                    # said, not warned: a warnings filter of "error" would end the round
                    # after the files were put back, losing what the executor did
                    print(f"choir: executor of {item.id}: git's control files it changed were "
                          f"put back ({', '.join(undone[:5])})", file=sys.stderr)
            else:
                result = LocalSandbox().exec(argv(inputs), **common)  # type: ignore[arg-type]
            if result.infra_error:
                # the infrastructure failed, not the executor: no attempt of its budget is
                # spent on it (review 17, F2); the run stops before the attempt is recorded,
                # and `choir run --resume` tries the same attempt again
                raise SandboxError(f"the executor's sandbox failed ({result.infra_error}); "
                                   "no attempt was charged for it")
            if kept > LOG_LIMIT:
                sink_file.write(f"\n[choir] output cut at {LOG_LIMIT} of {kept} bytes\n".encode())
            if result.timed_out:
                sink_file.write(f"\n[choir] executor timed out after "
                                f"{item.executor.timeout_s:g}s\n".encode())
            else:
                sink_file.write(f"\n[choir] executor exited {result.exit_code}\n".encode())
        artifact = ArtifactStore().ingest_file(log, link=False)
    return ExecutorOutput(artifact=artifact, exit_code=result.exit_code,
                          timed_out=result.timed_out, isolation=isolation)


@register_executor("command")
def run_command(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
                run_id: str | None = None) -> ExecutorOutput:
    """Run the command in the repo, sandboxed; its output goes to the artifact store."""
    assert item.executor.command
    command = item.executor.command
    return _run_user_code(item, attempt, feedback, run_id, lambda _inputs: command)


@register_executor("python")
def run_python(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
               run_id: str | None = None) -> ExecutorOutput:
    """Call ``module:function`` in a child Python inside the sandbox (``_python_child``)."""
    import shlex

    function = item.executor.function or ""
    root = str(_choir_root())
    path = os.environ.get("PYTHONPATH", "")
    return _run_user_code(
        item, attempt, feedback, run_id,
        lambda _inputs: shlex.join([sys.executable, "-m", _CHILD, function]),
        extra_env={"PYTHONPATH": f"{path}{os.pathsep}{root}" if path else root})


# command and python run the user's code in bubblewrap (``executor_isolation`` decides how)
run_command.runs_in_bwrap = True  # type: ignore[attr-defined]
run_python.runs_in_bwrap = True  # type: ignore[attr-defined]


@register_executor("agent")
def run_agent(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
              run_id: str | None = None) -> ExecutorOutput:
    """Run an agent program (``uses: claude-code``, ...) as a command, sandboxed like one.

    It gets the work item and the last round's bounded reports as a prompt
    (``CHOIR_PROMPT_FILE``, ``choir.executors.prompt``), only the variables its
    ``pass_env`` names, a private ``HOME`` (its sessions and settings die with the attempt,
    the user's own ``~/.claude`` and friends are never seen), and the network only to its
    ``hosts`` (its model API), through Choir's egress proxy.
    """
    from choir.executors.prompt import agent_prompt

    assert item.executor.command
    command = item.executor.command
    return _run_user_code(item, attempt, feedback, run_id, lambda _inputs: command,
                          clean_env=True, prompt=agent_prompt(item, attempt, feedback))


run_agent.runs_in_bwrap = True  # type: ignore[attr-defined]
