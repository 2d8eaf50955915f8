"""Executors run sandboxed: the attacks of issue #10 item 6, #11 item 2 and #16 item 10.

A hostile executor is the user's own command or function, but it runs with whatever the
work item says, so it must not reach the signing key, Choir's stores, or the tree after its
step ended. Every test here runs the real ``choir`` CLI in a subprocess with a real bwrap
sandbox and asserts the host afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from choir.models import WorkItem
from tests import forked
from tests.workitems import PY, calc_repo

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

CANARY = "CANARY-executor-sandbox"


def choir(*args: str, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=timeout, env=env)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: to prove nothing was written."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            st = path.stat()
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return found


def forge_script(tmp_path: Path, home: Path, item_id: str, repo: Path) -> Path:
    """The attack: steal the key, then use Choir's own API to mint PASS and ASSERT."""
    script = tmp_path / "hostile.py"
    script.write_text(textwrap.dedent(f"""\
        import os, pathlib, sys
        home = pathlib.Path({str(home)!r})
        repo = pathlib.Path({str(repo)!r})
        try:
            key = (home / "keys" / "ed25519.key").read_bytes()
            (repo / "loot.txt").write_bytes(key)
            print("STOLE-KEY", len(key))
        except OSError as exc:
            (repo / "loot.txt").write_text("unreadable")
            print("KEY-UNREADABLE", exc)
        os.environ["CHOIR_HOME"] = str(home)
        os.environ["CHOIR_ARTIFACT_DIR"] = str(home / "artifacts")
        try:
            import choir.app.verify as verify
            from choir.ahdb import open_ahdb
            from choir.evidence.tree import tree_hash
            real = verify.load_repo_config

            def rigged(path):
                config = real(path)
                unit = config.verifiers["unit"]
                step = unit.steps[0].model_copy(update={{"command": "true"}})
                fake = unit.model_copy(update={{"steps": (step,), "parser": "generic"}})
                return config.model_copy(update={{"verifiers": {{"unit": fake}}}})

            verify.load_repo_config = rigged
            out = verify.verify_tree(repo, sandbox_name="local")
            tree = tree_hash(repo)
            ahdb = open_ahdb()
            atom = ahdb.propose(claim="forged", work_item={item_id!r}, tree_hash=tree,
                                required_verifiers=["unit"])
            ahdb.promote(atom.id, list(out.contract["attestations"]))
            ahdb.assert_work_item({item_id!r}, tree, references=[atom.id], claim="forged")
            print("FORGED-ASSERT", out.passed)
        except Exception as exc:
            import traceback
            print("FORGE-FAILED", type(exc).__name__, exc)
            traceback.print_exc()
        """))
    return script


def _item(tmp_path: Path, item_id: str, executor: str) -> Path:
    item = tmp_path / "item.yaml"
    item.write_text(f"id: {item_id}\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n{textwrap.indent(executor, '  ')}")
    return item


def _assert_attack_failed(tmp_path: Path, home: Path, item_id: str,
                          before: dict[str, tuple[int, int]],
                          proc: subprocess.CompletedProcess[str]) -> None:
    key = (home / "keys" / "ed25519.key").read_bytes()
    loot = (tmp_path / "repo" / "loot.txt")
    assert loot.exists(), "the executor did not run at all"
    assert loot.read_bytes() == b"unreadable", "the executor read the signing key"
    assert key not in loot.read_bytes()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] != "asserted"
    gate = choir("gate", item_id)
    assert gate.returncode == 1, gate.stdout
    listed = json.loads(choir("ahdb", "list", "--json").stdout)
    assert not [a for a in listed if a.get("claim") == "forged"], "a forged atom got in"
    assert choir("audit").returncode == 0
    passes = [p.name for p in (home / "attestations").rglob("*") if p.is_file()
              and '"PASS"' in p.read_text(errors="replace")]
    assert not passes, f"PASS attestations for a failing tree: {passes}"
    # the host: the key is unchanged, and of Choir's stores nothing the executor wrote
    assert (home / "keys" / "ed25519.key").read_bytes() == key
    after = snapshot(home)
    changed = [p for p, v in before.items() if after.get(p) != v]
    assert not changed, f"files under CHOIR_HOME changed: {changed}"
    assert (loot.stat().st_uid, loot.stat().st_gid) == (os.getuid(), os.getgid())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["command", "python"])
def test_hostile_executor_cannot_read_the_key_or_forge_an_assert(
        tmp_path: Path, choir_home: Path, kind: str) -> None:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    item_id = f"forge-{kind}"
    script = forge_script(tmp_path, choir_home, item_id, tmp_path / "repo")
    if kind == "command":
        executor = f"kind: command\ncommand: {PY} {script}\n"
    else:
        (tmp_path / "hostile_fn.py").write_text(
            "import runpy\n"
            "def run(item, attempt, feedback):\n"
            f"    runpy.run_path({str(script)!r})\n"
            "    return 'done'\n")
        executor = "kind: python\nfunction: hostile_fn:run\n"
    item = _item(tmp_path, item_id, executor)
    # the key exists before the executor runs: a run that makes it on first use is no test
    from choir.attest import load_signer

    load_signer()
    before = snapshot(choir_home)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    proc = choir("run", str(item), "--json", env=env)
    _assert_attack_failed(tmp_path, choir_home, item_id, before, proc)


def test_a_background_process_left_by_the_executor_is_gone_when_it_returns(
        tmp_path: Path) -> None:
    """Issue #11: setsid, nohup and a double fork all die with the executor's sandbox."""
    from choir.executors import run_command
    from choir.models import WorkItem

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("good\n")
    swapper = ("while :; do echo bad > calc.py; echo $$ >> pids; sleep 0.05; "
               "echo good > calc.py; done")
    command = (f"setsid sh -c '{swapper}' >/dev/null 2>&1 & "
               f"nohup sh -c '{swapper}' >/dev/null 2>&1 & "
               f"( ( sh -c '{swapper}' >/dev/null 2>&1 & ) & ) ; sleep 0.3; echo started")
    item = WorkItem(id="leftover", goal="g", repo=str(repo),
                    executor={"kind": "command", "command": command})  # type: ignore[arg-type]
    output = run_command(item, 1, [])
    assert output.exit_code == 0 and output.isolation == "namespace"
    pids = {int(p) for p in (repo / "pids").read_text().split()}
    assert pids, "the swappers never ran"
    settled = (repo / "calc.py").read_text(), (repo / "pids").stat().st_size
    time.sleep(0.5)
    assert ((repo / "calc.py").read_text(), (repo / "pids").stat().st_size) == settled, \
        "something the executor left behind still writes the repo"
    # the pids are the sandbox's own; no host process runs the swapper's loop either
    alive = subprocess.run(["pgrep", "-f", "echo bad > calc.py"], capture_output=True,
                           text=True).stdout.split()
    assert not alive, f"leftover processes on the host: {alive}"


def test_a_failing_executor_is_recorded_and_its_output_kept_as_an_artifact(
        tmp_path: Path, choir_home: Path) -> None:
    """Issue #16: exit code in the run's events and stream; raw output only as an artifact."""
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    item = _item(tmp_path, "fails", "kind: command\n"
                 "command: echo EXECUTOR-SECRET-OUTPUT; exit 3\n")
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert any("executor exited 3" in e for e in out["events"]), out["events"]
    assert "exited 3" in proc.stderr  # the live view shows it
    assert "EXECUTOR-SECRET-OUTPUT" not in proc.stdout + proc.stderr
    kept = [p for p in (choir_home / "artifacts").rglob("*") if p.is_file()
            and b"EXECUTOR-SECRET-OUTPUT" in p.read_bytes()]
    assert kept, "the executor's output was not kept as an artifact"
    atts = [json.loads(p.read_text()) for p in (choir_home / "attestations").rglob("*.json")]
    assert atts and {a["body"]["executor_isolation"] for a in atts} == {"namespace"}


def test_paranoid_refuses_an_unsandboxed_executor_before_it_runs(tmp_path: Path) -> None:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    marker = tmp_path / "repo" / "ran"
    item = _item(tmp_path, "trust", f"kind: command\ncommand: touch {marker}\nsandbox: none\n")
    proc = choir("run", str(item), "--mood", "PARANOID")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "refuses an unsandboxed executor" in proc.stderr
    assert not marker.exists()


def test_trust_mode_is_recorded_in_every_attestation(tmp_path: Path, choir_home: Path) -> None:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    item = _item(tmp_path, "trusted", "kind: command\ncommand: 'true'\nsandbox: none\n")
    assert choir("run", str(item)).returncode == 1
    atts = [json.loads(p.read_text()) for p in (choir_home / "attestations").rglob("*.json")]
    assert atts and {a["body"]["executor_isolation"] for a in atts} == {"none"}


def _direct_item(tmp_path: Path, **executor: object) -> WorkItem:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    return WorkItem(id="direct", goal="g", repo=str(repo),
                    executor=executor)  # type: ignore[arg-type]


def _log(artifact: str) -> bytes:
    from choir.evidence.artifacts import ArtifactStore

    return ArtifactStore().read_bytes(artifact)


def test_network_is_off_unless_the_work_item_turns_it_on(tmp_path: Path) -> None:
    import socket

    from choir.executors import run_command

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        probe = f"{PY} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\""
        off = run_command(_direct_item(tmp_path, kind="command", command=probe), 1, [])
        on = run_command(_direct_item(tmp_path, kind="command", command=probe,
                                      network=True), 1, [])
    assert off.exit_code != 0, "the executor reached a host port with network off"
    assert on.exit_code == 0, _log(on.artifact)


def test_a_timed_out_executor_is_recorded_as_such(tmp_path: Path) -> None:
    from choir.executors import run_command

    started = time.monotonic()
    out = run_command(_direct_item(tmp_path, kind="command", command="sleep 30",
                                   timeout_s=0.5), 1, [])
    assert out.timed_out and out.exit_code == 124 and time.monotonic() - started < 10
    assert b"[choir] executor timed out" in _log(out.artifact)


def test_a_python_executor_runs_in_a_child_and_its_exception_is_its_exit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from choir.executors import run_python

    (tmp_path / "user_fn.py").write_text(
        "import os\n"
        "def ok(item, attempt, feedback):\n"
        "    open('calc.py', 'w').write(f'{item.id} {attempt} {os.getpid()}')\n"
        "    return 'returned-value'\n"
        "def boom(item, attempt, feedback):\n"
        "    raise RuntimeError('user code broke')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ok = run_python(_direct_item(tmp_path, kind="python", function="user_fn:ok"), 2, [])
    assert ok.exit_code == 0 and b"returned-value" in _log(ok.artifact)
    item_id, attempt, pid = (tmp_path / "repo" / "calc.py").read_text().split()
    assert (item_id, attempt) == ("direct", "2") and int(pid) != os.getpid()
    assert "user_fn" not in sys.modules, "user code was imported into Choir's process"
    bad = run_python(_direct_item(tmp_path, kind="python", function="user_fn:boom"), 1, [])
    assert bad.exit_code == 1 and b"user code broke" in _log(bad.artifact)


GIT_PLANTS = {
    "fsmonitor": "git config core.fsmonitor {payload}",
    # git runs a clean filter when it compares a changed file with the index, a textconv when
    # it diffs, hooks on commit and checkout, the pager on output: none may ever run
    "filter": ("git -c user.name=x -c user.email=x@x commit -qam base && "
               "printf '* filter=x diff=x\\n' > .gitattributes && "
               "git config filter.x.clean {payload} && git config filter.x.smudge {payload} && "
               "git config diff.x.textconv {payload} && echo changed >> calc.py"),
    "hooks": ("mkdir -p hk && for h in pre-commit post-checkout post-index-change "
              "reference-transaction; do cp {payload} hk/$h; done && "
              "git config core.hooksPath $PWD/hk"),
    "pager": "git config core.pager {payload} && git config pager.ls-files {payload}",
}


@pytest.mark.parametrize("plant", sorted(GIT_PLANTS))
def test_an_executor_cannot_plant_git_config_that_choir_then_runs(
        tmp_path: Path, choir_home: Path, plant: str) -> None:
    """The escape after the sandbox: Choir runs git on the repo (tree hash, commit check),
    unsandboxed, and git runs commands named in the repo's own config (``core.fsmonitor``,
    filters, hooks, a pager). A planted one must never run."""
    repo = calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    loot = tmp_path / "loot"
    payload = tmp_path / "repo" / "payload.sh"
    planted = (f"printf '#!/bin/sh\\ncat {choir_home}/keys/ed25519.key > {loot}; cat\\n' "
               f"> {payload} && chmod +x {payload} && "
               + GIT_PLANTS[plant].format(payload=payload))
    item = _item(tmp_path, "plant", f"kind: command\ncommand: \"{planted}\"\n")
    from choir.attest import load_signer

    load_signer()
    config = (repo / ".git" / "config").read_text()
    proc = choir("run", str(item), "--json")
    assert payload.exists(), proc.stderr  # the executor did plant it
    # review 25: the plant is undone once the executor's sandbox ends, so neither Choir's git
    # nor the user's next `git status` finds it; Choir's own git pins these programs too
    assert (repo / ".git" / "config").read_text() == config, proc.stdout
    assert "put back" in proc.stderr, proc.stderr
    control = {"fsmonitor": ["status"], "filter": ["diff"],
               "hooks": ["-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q",
                         "--allow-empty", "-m", "c"]}
    if plant in control:
        subprocess.run(["git", "-C", str(repo), *control[plant]], capture_output=True)
    assert not loot.exists(), "a planted git command ran (Choir's, or the user's next git)"
    assert proc.returncode == 1
    # the control: the same configuration written by hand is live, and the git command
    # that honours it does run it
    by_hand = {"fsmonitor": [("core.fsmonitor", str(payload))],
               "filter": [("filter.x.clean", str(payload)), ("diff.x.textconv", str(payload))],
               "hooks": [("core.hooksPath", str(repo / "hk"))]}
    if plant in control:
        for name, value in by_hand[plant]:
            subprocess.run(["git", "-C", str(repo), "config", name, value], check=True)
        subprocess.run(["git", "-C", str(repo), *control[plant]], capture_output=True)
        assert loot.exists(), f"the {plant} plant never runs: this test proves nothing"


@pytest.mark.parametrize("layout", ["folder", "symlink"])
def test_an_executor_cannot_rig_the_interpreter_the_verifiers_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """The repo's .venv is the verifiers' interpreter, but it is ignored, so the tree hash
    does not cover it. An executor that plants a ``.pth`` there (``os._exit(0)`` at start-up)
    would turn every verifier step into a PASS for the buggy tree, under a hash a clean
    checkout shares. The executor sees the interpreter read-only; its write fails. When
    .venv is a symlink, the executor replaces it with a rigged copy: the run pinned the
    folder it pointed to, so the verifiers never run the copy."""
    import sys as _sys

    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    base = os.path.realpath(_sys.base_prefix) + "/bin/python3"
    real = repo / ".venv" if layout == "folder" else tmp_path / "venvs" / "repo"
    subprocess.run([base, "-m", "venv", "--without-pip", str(real)], check=True)
    if layout == "symlink":
        (repo / ".venv").symlink_to(real)
    (repo / ".gitignore").write_text(".venv/\n")
    (repo / "choir.yaml").write_text(textwrap.dedent("""\
        verifiers:
          unit:
            kind: unit_tests
            steps:
              - name: check
                command: python3 -c "import calc; assert calc.add(2, 3) == 5, 'add is wrong'"
        sandbox: {backend: bwrap}
        """))
    rig = ("for d in .venv/lib/python3*/site-packages; do "
           "echo 'import os; os._exit(0)' > $d/zz_rig.pth && echo RIGGED; done; true")
    if layout == "symlink":
        rig = f"rm .venv && cp -r {real} .venv && {rig}"
    item = _item(tmp_path, "rig-venv", f"kind: command\ncommand: \"{rig}\"\n")
    proc = choir("run", str(item), "--json")
    out = json.loads(proc.stdout)
    assert not list(real.glob("lib/python3*/site-packages/zz_rig.pth")), \
        "the executor wrote the verifiers' interpreter"
    assert out["status"] != "asserted" and proc.returncode == 1, proc.stdout + proc.stderr
    assert choir("gate", "rig-venv", "--repo", str(repo)).returncode == 1


def test_an_executor_of_a_repo_in_home_does_not_see_the_rest_of_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder around the repo is readable to the executor (a script beside the repo),
    and with the common layout ``~/proj`` that folder was the whole home: a review's command
    executor read ``~/.ssh/id_ed25519`` and another repo's secrets. A folder around the repo
    that holds the home (or Choir's stores) is not bound; the repo itself still is."""
    from choir.executors import run_command

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("SSH-KEY-CANARY\n")
    monkeypatch.setenv("HOME", str(home))
    repo = home / "proj"
    repo.mkdir()
    item = WorkItem(id="home", goal="g", repo=str(repo), executor={  # type: ignore[arg-type]
        "kind": "command", "command": f"cat {home}/.ssh/id_ed25519; ls {repo} > seen.txt"})
    out = run_command(item, 1, [])
    assert b"SSH-KEY-CANARY" not in _log(out.artifact), _log(out.artifact)
    assert (repo / "seen.txt").exists()  # the repo is there, writable
    # a folder around the repo that holds nothing of the home stays readable
    beside = tmp_path / "work"
    (beside / "repo").mkdir(parents=True)
    (beside / "fix.sh").write_text("echo BESIDE-OK\n")
    item = WorkItem(id="beside", goal="g", repo=str(beside / "repo"),
                    executor={"kind": "command",  # type: ignore[arg-type]
                              "command": f"sh {beside}/fix.sh"})
    assert b"BESIDE-OK" in _log(run_command(item, 1, []).artifact)


def test_an_executor_of_a_repo_in_tmp_reaches_no_host_socket_there(tmp_path: Path) -> None:
    """A repo straight under /tmp (a clone for a quick try, a CI job's scratch) made /tmp the
    folder around it, bound for the executor: read-only, yet a Unix socket on a read-only
    bind still connects, and /tmp holds the host's sockets (tmux, X11, an agent's, another
    step's egress proxy). The attack: a no-network executor talked to a host service there.
    A shared temp root is never the folder around a repo, nor a bind (``check_bind``)."""
    import uuid

    from choir.exceptions import ConfigError
    from choir.executors import run_command
    from choir.sandbox._toolchain import check_bind
    from tests.hostsocket import Listener, connecting

    name = f"choir-test-{uuid.uuid4().hex[:12]}"
    repo, sock_path = Path("/tmp") / name, Path("/tmp") / f"{name}.sock"
    repo.mkdir()
    server = Listener(sock_path, timeout=15)
    try:
        item = WorkItem(id="tmp", goal="g", repo=str(repo), executor={  # type: ignore[arg-type]
            "kind": "command", "command": connecting(sock_path)})
        out = run_command(item, 1, [])
        heard = server.close()
        assert heard == [], f"the executor reached a host socket in /tmp: {heard}"
        assert (repo / "seen.txt").exists(), _log(out.artifact)
        for shared in ("/tmp", "/var/tmp"):
            with pytest.raises(ConfigError, match="shared"):
                check_bind(shared, origin="sandbox.binds")
    finally:
        server.close()
        sock_path.unlink(missing_ok=True)
        shutil.rmtree(repo, ignore_errors=True)
