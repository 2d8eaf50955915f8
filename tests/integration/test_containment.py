"""Containment, for every backend that claims isolation. Each case checks the host after."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import pytest

from choir.evidence.tree import tree_hash
from choir.models import Limits
from choir.sandbox import Sandbox
from choir.sandbox.base import ExecResult
from tests.memory import PEAK_RSS
from tests.sandboxes import ISOLATED, isolated_backend

PY = "python3"


@pytest.fixture(params=ISOLATED)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return isolated_backend(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    (path / "mod.py").write_text("x = 1\n")
    return path


def run(sandbox: Sandbox, repo: Path, out: Path, command: str, *, timeout_s: float = 20,
        limits: Limits | None = None) -> tuple[int, bytes, object]:
    chunks: list[bytes] = []
    result = sandbox.exec(command, repo=repo, out_dir=out, env={}, timeout_s=timeout_s,
                          limits=limits or Limits(), network=False, sink=chunks.append)
    return result.exit_code, b"".join(chunks), result


def test_write_to_repo_fails_and_repo_unchanged(sandbox: Sandbox, repo: Path,
                                                tmp_path: Path) -> None:
    before = tree_hash(repo)
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       "echo hacked > mod.py; echo new > planted.py; rm -f mod.py")
    assert code != 0
    assert tree_hash(repo) == before and not (repo / "planted.py").exists()


def test_only_the_output_folder_is_writable(sandbox: Sandbox, repo: Path,
                                            tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       f"touch {outside}/escape; touch /etc/choir-escape; "
                       f"touch /root/choir-escape; touch $CHOIR_OUT/ok && echo out-ok")
    assert b"out-ok" in out
    assert (tmp_path / "out" / "ok").exists()
    assert not (outside / "escape").exists()
    assert not Path("/etc/choir-escape").exists() and not Path("/root/choir-escape").exists()


def test_host_loopback_listener_is_unreachable(sandbox: Sandbox, repo: Path,
                                               tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       f"{PY} -c \"import socket; socket.create_connection(('127.0.0.1', {port}),"
                       f" timeout=3); print('CONNECTED')\"")
    thread.join()
    listener.close()
    assert b"CONNECTED" not in out and code != 0
    assert accepted == []


def test_docker_socket_is_unreachable(sandbox: Sandbox, repo: Path, tmp_path: Path) -> None:
    assert Path("/var/run/docker.sock").exists() or Path("/run/docker.sock").exists() or True
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       f"{PY} -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                       f"s.connect('/var/run/docker.sock'); print('DOCKER-REACHED')\"")
    assert b"DOCKER-REACHED" not in out and code != 0


def test_fork_bomb_is_bounded(sandbox: Sandbox, repo: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    # a name of its own: the other backend's bomb (another xdist worker) must not count here
    bomb = f"bomb{uuid.uuid4().hex[:12]}"
    code, out, result = run(sandbox, repo, tmp_path / "out",
                            f"{bomb}(){{ {bomb}|{bomb}& }}; {bomb}; sleep 2; echo survived",
                            timeout_s=15, limits=Limits(pids=64))
    assert time.monotonic() - start < 20
    # the host can still fork, and no bomb process outlived the sandbox
    assert subprocess.run(["true"]).returncode == 0
    time.sleep(0.5)
    leftovers = subprocess.run(["pgrep", "-f", bomb], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""


def test_memory_hog_is_killed_and_reported_oom(sandbox: Sandbox, repo: Path,
                                               tmp_path: Path) -> None:
    if sandbox.name == "bwrap" and not os.access("/sys/fs/cgroup/memory", os.W_OK):
        pytest.skip("cgroup v1 memory controller not writable: bwrap cannot bound memory here")
    code, out, result = run(sandbox, repo, tmp_path / "out",
                            f"{PY} -c \"x = bytearray(900 * 1024 * 1024); print('ALLOCATED')\"",
                            limits=Limits(memory_mb=200))
    assert code != 0 and b"ALLOCATED" not in out
    assert result.oom_killed  # type: ignore[attr-defined]


def test_the_private_tmp_is_bounded_whatever_the_memory_limit(sandbox: Sandbox, repo: Path,
                                                              tmp_path: Path) -> None:
    """/tmp is the one writable place outside $CHOIR_OUT, which the out cap watches: a step
    filling it (many files, each under the per-file cap) must hit a size, not the host's
    memory. The attack wrote 300 MiB there under the default 2 GiB memory limit (and
    without cgroups, as a user without root runs bwrap, nothing at all bounded it). Review
    21b: bwrap's / and /dev/shm were tmpfs mounts with no size (half the host's memory
    each): / is read-only now, /dev/shm as bounded as /tmp."""
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       "for d in /tmp /dev/shm ''; do for i in 1 2 3; do "
                       "dd if=/dev/zero of=$d/fill$i bs=1M count=100 2>/dev/null || "
                       "{ echo \"BOUNDED $d/\"; break; }; done; rm -f $d/fill*; done; "
                       "echo DONE", timeout_s=60)
    assert b"DONE" in out and code == 0, out
    bounded = {line for line in out.splitlines() if line.startswith(b"BOUNDED")}
    assert bounded == {b"BOUNDED /tmp/", b"BOUNDED /dev/shm/", b"BOUNDED /"}, out


@pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")
def test_a_masked_folder_takes_no_write(repo: Path, tmp_path: Path) -> None:
    """An executor's masks (Choir's home beside its repo) are empty tmpfs mounts: writable,
    they were a second unbounded /tmp. Now they are read-only."""
    from choir.sandbox.bwrap import BwrapSandbox

    masked = tmp_path / "home"
    masked.mkdir()
    chunks: list[bytes] = []
    result = BwrapSandbox().exec(
        f"dd if=/dev/zero of={masked}/fill bs=1M count=8 2>&1; test -e {masked}/fill && "
        "echo PRESENT; echo DONE",
        repo=repo, out_dir=tmp_path / "out", env={}, timeout_s=20, limits=Limits(),
        network=False, sink=chunks.append, repo_writable=True, readable=[tmp_path],
        hidden=[masked])
    out = b"".join(chunks)
    assert b"DONE" in out and b"Read-only file system" in out and b"PRESENT" not in out, out
    assert result.exit_code == 0 and list(masked.iterdir()) == []


def test_sleep_forever_times_out_and_leaves_nothing(sandbox: Sandbox, repo: Path,
                                                    tmp_path: Path) -> None:
    marker = f"choir-sleep-marker-{os.getpid()}"
    start = time.monotonic()
    code, out, result = run(sandbox, repo, tmp_path / "out",
                            f"sh -c 'exec -a {marker} sleep 1000' & sleep 1000", timeout_s=2)
    assert result.timed_out  # type: ignore[attr-defined]
    assert time.monotonic() - start < 2 + 5
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""
    assert subprocess.run(["pgrep", "-f", "sleep 1000"], capture_output=True).stdout == b""


@pytest.mark.slow
def test_one_gigabyte_of_output_is_stored_whole_in_flat_memory(
    sandbox: Sandbox, repo: Path, tmp_path: Path
) -> None:
    """Run the pipeline in a child process and read its peak RSS: it must stay flat."""
    size = int(os.environ.get("CHOIR_BIG_OUTPUT_BYTES", str(1 << 30)))
    script = PEAK_RSS + f"""
import sys, json
from pathlib import Path
from choir.evidence.artifacts import ArtifactStore
from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
from choir.verification.pipeline import run_verifier
from choir.sandbox import get_sandbox
spec = VerifierSpec(name="big", kind=VerifierKind.SMOKE, timeout_s=300,
                    steps=(StepSpec(name="spew", command="head -c {size} /dev/zero"),))
store = ArtifactStore()
res = run_verifier(spec, repo=Path({str(repo)!r}), sandbox=get_sandbox({sandbox.name!r}),
                   store=store, run_id="big-run", target=Target(tree_hash="0" * 64))
digest = res.artifacts["logs/step-01-spew.log"]
print(json.dumps({{"status": res.status, "size": store.path_of(digest).stat().st_size,
                  "digest": digest,
                  "rss_kb": peak_rss_kib()}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    import blake3

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["status"] == "PASS" and got["size"] == size
    expected = blake3.blake3()
    chunk = bytes(1 << 20)
    for _ in range(size // len(chunk)):
        expected.update(chunk)
    expected.update(bytes(size % len(chunk)))
    assert got["digest"] == expected.hexdigest()
    assert got["rss_kb"] < 150 * 1024, f"peak RSS {got['rss_kb'] / 1024:.0f} MiB"


# --- issue #10: each attack below was reproduced on the code before its fix ---------------

SECRET = "PRIVATE-KEY-MATERIAL-do-not-leak"


def _plant_key(home: Path) -> Path:
    key = home / ".choir" / "keys" / "ed25519.key"
    key.parent.mkdir(parents=True)
    key.write_text(SECRET)
    key.chmod(0o600)
    return key


def test_home_bin_on_path_does_not_expose_the_signing_key(
    sandbox: Sandbox, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#10.1: ``$HOME/bin`` (and a relative entry) on PATH must not bind $HOME."""
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    home.chmod(0o755)
    key = _plant_key(home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CHOIR_HOME", str(home / ".choir"))
    monkeypatch.chdir(home)
    monkeypatch.setenv("PATH", f"{home}/bin:bin:.:{os.environ['PATH']}")
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       f"cat {key}; cat ~/.choir/keys/ed25519.key; ls {home}; echo done")
    assert b"done" in out
    assert SECRET.encode() not in out
    assert key.read_text() == SECRET and key.stat().st_uid == 0  # host: key untouched


def test_step_has_no_host_privilege(sandbox: Sandbox, repo: Path, tmp_path: Path) -> None:
    """#10.2: the step's uid maps to an unprivileged host uid: root-only files stay closed."""
    secret = repo / "root-only.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    group = repo / "root-group.txt"
    group.write_text(SECRET)
    group.chmod(0o640)
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       "cat root-only.txt; cat root-group.txt; head -c 40 /etc/shadow; "
                       "touch $CHOIR_OUT/made-by-step && echo made")
    assert SECRET.encode() not in out
    assert b"root:" not in out  # /etc/shadow
    assert b"made" in out
    # the host's view of the step's uid and gid: what it creates is not root's
    made = (tmp_path / "out" / "made-by-step").stat()
    assert made.st_uid != 0 and made.st_gid != 0, (made.st_uid, made.st_gid)
    assert secret.stat().st_uid == 0 and secret.stat().st_mode & 0o777 == 0o600


def test_planted_symlink_in_the_output_folder_is_never_followed(
    sandbox: Sandbox, repo: Path, tmp_path: Path
) -> None:
    """#10.5: a link a step leaves in $CHOIR_OUT must not make the next step own its target."""
    home = tmp_path / "home"
    home.mkdir()
    key = _plant_key(home)
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    run(sandbox, repo, out, f"ln -s {key} $CHOIR_OUT/link; ln -s {victim} $CHOIR_OUT/dirlink;"
                            f" rm -rf $CHOIR_OUT/tmp && ln -s {victim} $CHOIR_OUT/tmp; true")
    run(sandbox, repo, out, "true")  # the next step of the same run prepares the folder again
    for path in (key, key.parent, victim):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (0, 0), path
    assert key.stat().st_mode & 0o777 == 0o600


def test_step_runs_the_projects_interpreter_not_choirs(
    sandbox: Sandbox, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#16.7: with Choir's venv active, a step still gets the repo's plain venv."""
    venv = repo / ".venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)  # Choir's own venv, activated
    monkeypatch.setenv("PATH", f"{sys.prefix}/bin:{os.environ['PATH']}")
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       f"{PY} -c 'import sys; print(\"PREFIX\", sys.prefix)'; "
                       f"{PY} -c 'import langgraph' && echo LEAKED; echo end")
    assert f"PREFIX {venv}".encode() in out, out
    assert b"LEAKED" not in out and b"end" in out


def _usage(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*"))


@pytest.mark.parametrize("writer", [
    "head -c 300M /dev/zero > $CHOIR_OUT/big; echo wrote",
    "for i in $(seq 300); do head -c 1M /dev/zero > $CHOIR_OUT/f$i || exit 3; done; echo wrote",
])
def test_output_folder_is_capped_and_the_step_stopped(
    sandbox: Sandbox, repo: Path, tmp_path: Path, writer: str
) -> None:
    """#10.4: $CHOIR_OUT has a cap from policy; a step over it is stopped, host disk bounded."""
    out = tmp_path / "out"
    code, text, result = run(sandbox, repo, out, writer, limits=Limits(out_mb=8))
    assert code != 0
    assert result.limit_exceeded and "8 MiB" in result.limit_exceeded  # type: ignore[attr-defined]
    assert b"exceeded its cap of 8 MiB" in text
    assert _usage(out) < 8 * 1024 * 1024 + 96 * 1024 * 1024, _usage(out)  # cap + one interval
    code, text, result = run(sandbox, repo, tmp_path / "out2",
                             "head -c 1M /dev/zero > $CHOIR_OUT/small && echo ok",
                             limits=Limits(out_mb=8))
    assert code == 0 and result.limit_exceeded is None  # type: ignore[attr-defined]


def test_output_cap_fails_the_verifier_with_the_cap_as_reason(
    sandbox: Sandbox, repo: Path, tmp_path: Path
) -> None:
    import asyncio

    from choir.evidence.artifacts import ArtifactStore
    from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
    from choir.verification import run_verifier_thread

    spec = VerifierSpec(name="spill", kind=VerifierKind.SMOKE, timeout_s=60,
                        limits=Limits(out_mb=4),
                        steps=(StepSpec(name="fill", command="head -c 64M /dev/zero > "
                                        "$CHOIR_OUT/fill; true"),))
    run_, _ = asyncio.run(run_verifier_thread(
        spec, repo=repo, target=Target(tree_hash=tree_hash(repo)), sandbox=sandbox,
        store=ArtifactStore(), run_id=f"spill-{sandbox.name}"))
    assert run_.report.result.value == "FAIL"
    assert "exceeded its cap of 4 MiB" in run_.report.summary


def test_pytest_runs_unchanged_in_a_read_only_repo_with_warnings_as_errors(
    sandbox: Sandbox, repo: Path, tmp_path: Path
) -> None:
    """#16.4: tool caches go to $CHOIR_OUT, so a cache write cannot fail a strict test run."""
    (repo / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    (repo / "test_mod.py").write_text("import mod\n\n\ndef test_x():\n    assert mod.x == 1\n")
    before = tree_hash(repo)
    code, out, _ = run(sandbox, repo, tmp_path / "out", f"{PY} -m pytest -q -p no:randomly",
                       timeout_s=60)
    assert code == 0, out.decode(errors="replace")[-2000:]
    assert b"1 passed" in out
    assert tree_hash(repo) == before and not (repo / ".pytest_cache").exists()


def test_the_pytest_preset_runs_a_strict_config_project_unchanged(
    sandbox: Sandbox, repo: Path, tmp_path: Path
) -> None:
    """The `uses: pytest` command (``-p no:cacheprovider``) on a project with --strict-config:
    an environment that moved the cache with ``-o cache_dir=`` made pytest refuse it
    ("Unknown config option: cache_dir", seen on toolz)."""
    (repo / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["--strict-config", "--strict-markers"]\n'
        'filterwarnings = ["error"]\n')
    (repo / "test_mod.py").write_text("import mod\n\n\ndef test_x():\n    assert mod.x == 1\n")
    code, out, _ = run(sandbox, repo, tmp_path / "out",
                       f"{PY} -m pytest -q -p no:cacheprovider --junitxml=$CHOIR_OUT/junit.xml",
                       timeout_s=60)
    assert code == 0, out.decode(errors="replace")[-2000:]
    assert b"1 passed" in out
    # and the preset's own step: pytest with Choir's JUnit writer, its source in the
    # environment every sandbox gives a step (a container's interpreter included)
    code, out, _ = run(sandbox, repo, tmp_path / "out2",
                       f'{PY} -c "$CHOIR_PYTEST" -q -p no:cacheprovider', timeout_s=60)
    assert code == 0, out.decode(errors="replace")[-2000:]
    assert b"1 passed" in out
    junit = (tmp_path / "out2" / "junit.xml").read_text()
    assert 'tests="1"' in junit and 'name="test_x"' in junit


@pytest.mark.parametrize("how", ["stop_runs", "stop_steps"])
def test_a_stopped_round_ends_its_running_step_whatever_runs_it(
        sandbox: Sandbox, repo: Path, tmp_path: Path, how: str) -> None:
    """A verification cancelled or past its bound (an ``llm`` executor's gate, an MCP call, a
    warm client gone) stops its steps at once. A container is no child of this process: it
    ran on to its own timeout, holding its CPU and memory for nothing; now its kill is
    registered while it runs, and both stops use it. Another round's step runs on."""
    from choir.sandbox import stop

    results: dict[str, ExecResult] = {}

    def go(run_id: str, out: str) -> None:
        with stop.running(run_id):
            results[run_id] = cast(ExecResult, run(sandbox, repo, tmp_path / out, "sleep 60",
                                                   timeout_s=90)[2])

    doomed = threading.Thread(target=go, args=("round1-v-0", "out1"))
    other = threading.Thread(target=go, args=("round2-v-0", "out2"))
    doomed.start()
    if how == "stop_runs":
        other.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # both steps started
        runs = {run for run, _ in stop._LIVE.values()}
        if "round1-v-0" in runs and (how == "stop_steps" or "round2-v-0" in runs):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the steps never started")
    time.sleep(0.5)
    clock = time.monotonic()
    try:
        stopped = stop.stop_runs("round1") if how == "stop_runs" else stop.stop_steps()
        doomed.join(timeout=30)
        assert not doomed.is_alive(), "the stopped step ran on"
        assert time.monotonic() - clock < 20
        assert stopped >= 1
        ended = results["round1-v-0"]
        assert ended.exit_code != 0 and not ended.timed_out
        if how == "stop_runs":
            assert other.is_alive(), "a step of another round was stopped too"
    finally:
        stop.forget("round1")
        stop.stop_runs("round2")
        stop.forget("round2")
        if other.ident is not None:
            other.join(timeout=30)
