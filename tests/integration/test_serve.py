"""``choir serve`` end to end: a real service, real sandboxes, real repos; the warm answer is
the cold one, and what the service refuses (another user, a planted socket, a lying client, a
request that asks for more than the command line can) is refused."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.serving import (
    CHOIR,
    QUICK,
    SLEEPER,
    choir,
    command_item,
    make_repo,
    raw_request,
    sandbox_name,
    sleeper,
    start_service,
    stop_service,
    wait_gone,
)

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

CALC_BUG = "def add(a, b):\n    return a - b\n"
VOLATILE = {"run_id", "artifact_paths", "attestations", "tail_log", "threads", "manifest",
            "reports", "summary"}


def _stable(contract: dict[str, Any]) -> dict[str, Any]:
    """The contract without what differs between any two sessions (ids, times, hashes of
    logs that carry them)."""
    out = {k: v for k, v in contract.items() if k not in VOLATILE}
    manifest = contract["manifest"]
    out["manifest"] = {k: v for k, v in manifest.items() if k not in {
        "run_id", "timestamp_start", "timestamp_end", "duration_ms", "runs", "attestations",
        "commands_executed", "verification"}}
    out["commands"] = [{k: v for k, v in c.items() if k not in {"run_id", "duration_ms"}}
                       for c in manifest["commands_executed"]]
    out["reports"] = [{k: v for k, v in r.items() if k not in {"artifacts", "run_id",
                                                                "failure_signatures"}}
                      for r in contract["reports"]]
    out["signatures"] = [{k: v for k, v in sig.items() if k != "citation"}
                         for r in contract["reports"] for sig in r["failure_signatures"]]
    return out


def _masked(text: str, *homes: str) -> str:
    """``text`` without white space (rich wraps what differs at different places), homes,
    run ids, hashes and timings."""
    text = re.sub(r"\s+", "", text)
    for home in homes:
        text = text.replace(home, "HOME")
    text = re.sub(r"verify-\d{8}T\d{6}-[0-9a-f]{6}[\w.-]*", "RUN", text)
    text = re.sub(r"[0-9a-f]{16,}", "HASH", text)
    return re.sub(r"\d+\.\d+s", "Ts", text)


@pytest.fixture
def service(choir_home: Path) -> Any:
    pid = start_service()
    yield pid
    stop_service(pid)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One service for the tests that only speak to its socket: (home, pid). A request
    names its home in its environment, so ``raw_request`` is given it."""
    home = tmp_path_factory.mktemp("shared") / "home"
    env = {"CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "artifacts")}
    pid = start_service(extra_env=env)
    yield home, pid
    forked.run([*CHOIR, "serve", "--stop"], env={**os.environ, **env},
               capture_output=True, check=False)
    wait_gone(pid)


def ask(shared: tuple[Path, int], request: dict[str, Any], **kw: Any) -> dict[str, Any]:
    home = shared[0]
    env = {"CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "artifacts"),
           **kw.pop("env", {})}
    return raw_request(home / "serve" / "sock", request, env=env, **kw)


def test_warm_verify_answers_exactly_what_cold_verify_does(tmp_path: Path, service: int) -> None:
    good = make_repo(tmp_path / "good")
    bad = make_repo(tmp_path / "bad", calc=CALC_BUG)
    # cold in a home of its own with the same history (reports calibrate on the home's past)
    elsewhere = {"CHOIR_HOME": str(tmp_path / "cold-home"),
                 "CHOIR_ARTIFACT_DIR": str(tmp_path / "cold-home" / "artifacts")}
    for repo, code in ((good, 0), (bad, 1)):
        args = ("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name())
        warm = choir(*args, serve="require")
        cold = choir(*args, serve="off", extra_env=elsewhere)
        assert (warm.returncode, cold.returncode) == (code, code), warm.stderr + cold.stderr
        assert _stable(json.loads(warm.stdout)) == _stable(json.loads(cold.stdout))
        # the same text a person reads, too (ids, hashes and times aside): same code, same
        # descriptors
        text_args = ("verify", "--repo", str(repo), "--sandbox", sandbox_name())
        texts = [choir(*text_args, serve="require"),
                 choir(*text_args, serve="off", extra_env=elsewhere)]
        assert [t.returncode for t in texts] == [code, code]
        homes = (os.environ["CHOIR_HOME"], elsewhere["CHOIR_HOME"])
        assert _masked(texts[0].stdout, *homes) == _masked(texts[1].stdout, *homes)
        assert _masked(texts[0].stderr, *homes) == _masked(texts[1].stderr, *homes)
        assert ("PASS" if code == 0 else "FAIL") in texts[0].stdout
    # a configuration error: the same message and exit 2 either way
    (good / "choir.yaml").write_text("verifiers: [nope\n")
    warm = choir("verify", "--repo", str(good), serve="require")
    cold = choir("verify", "--repo", str(good), serve="off", extra_env=elsewhere)
    assert warm.returncode == cold.returncode == 2
    assert warm.stderr.splitlines()[-3:] == cold.stderr.splitlines()[-3:]
    for env in ({}, elsewhere):
        audit = choir("audit", extra_env=env)
        assert audit.returncode == 0, audit.stdout + audit.stderr


def test_relative_paths_resolve_from_the_clients_directory(tmp_path: Path,
                                                          service: int) -> None:
    repo = make_repo(tmp_path / "repo", config=QUICK)
    proc = choir("verify", "--repo", ".", "--json", "--sandbox", sandbox_name(), cwd=repo,
                 serve="require")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["manifest"]["repo"] == str(repo.resolve())


def test_a_home_named_through_a_link_is_the_same_home(tmp_path: Path,
                                                      choir_home: Path) -> None:
    """The service started through a link to the home, the client by its real path: the
    same home, so the worker signs through its broker (it looked for one under the client's
    name for the home, found none, and could not start one behind the mask)."""
    link = tmp_path / "home-link"
    link.symlink_to(choir_home)
    pid = start_service(extra_env={"CHOIR_HOME": str(link)})
    try:
        repo = make_repo(tmp_path / "repo", config=QUICK)
        proc = choir("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name(),
                     serve="require")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["attestations"]
    finally:
        forked.run([*CHOIR, "serve", "--stop"], env={**os.environ, "CHOIR_HOME": str(link)},
                   capture_output=True, check=False)
        wait_gone(pid)


def test_each_request_gets_a_fresh_worker_with_the_clients_environment(
        tmp_path: Path, choir_home: Path) -> None:
    """Nothing of the service's environment, nor of an earlier request, reaches a request:
    an executor (which sees the whole environment, as cold) prints what it finds."""
    pid = start_service(extra_env={"PROBE": "the-service"})
    try:
        repo = make_repo(tmp_path / "repo", config=QUICK)
        item = command_item(tmp_path, "probe", "import os\nopen('seen.txt', 'a').write("
                                               "os.environ.get('PROBE', '-') + '\\n')\n")
        first = choir("run", str(item), "--run-id", "probe-1", serve="require",
                      extra_env={"PROBE": "the-first-client"})
        env = {k: v for k, v in os.environ.items() if k != "PROBE"}
        second = forked.run([*CHOIR, "run", str(item), "--run-id", "probe-2"],
                            env={**env, "CHOIR_SERVE": "require"}, capture_output=True,
                            text=True, timeout=300, check=False)
        assert first.returncode == 0, first.stderr
        assert second.returncode == 0, second.stderr
        # the first client's value, then none: never the service's, never the last request's
        assert (repo / "seen.txt").read_text().split() == ["the-first-client", "-"]
    finally:
        stop_service(pid)


def test_a_configuration_edited_between_requests_is_read_as_edited(
        tmp_path: Path, choir_home: Path) -> None:
    """An idle worker parses the ``choir.yaml`` the last request read before its own request
    comes (``worker._parse_ahead``); the request reads the file again, and an edit made in
    between is what it runs, every time."""
    pid = start_service("--jobs", "1")  # every next worker is forked after the last request
    try:
        repo = make_repo(tmp_path / "repo", config=QUICK)
        assert choir("verify", "--mood", "CALM", cwd=repo, serve="require").returncode == 0
        note = choir_home / "serve" / "parsed"
        deadline = time.monotonic() + 30
        while not note.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str((repo / "choir.yaml").resolve()) in json.loads(note.read_text())
        time.sleep(1.0)  # the next idle worker, forked once the first exited, parses it
        failing = QUICK.replace("== 5", "== 6")
        for config, code in ((failing, 1), (QUICK, 0), (failing, 1)):
            (repo / "choir.yaml").write_text(config)  # the same size: the text decides
            proc = choir("verify", "--mood", "CALM", cwd=repo, serve="require")
            assert proc.returncode == code, proc.stdout + proc.stderr
    finally:
        stop_service(pid)


def test_run_through_the_service_asserts_and_the_gate_holds(tmp_path: Path,
                                                           service: int) -> None:
    make_repo(tmp_path / "repo", calc=CALC_BUG, config=QUICK)
    item = command_item(tmp_path, "fix-add", "open('calc.py', 'w').write("
                                             "'def add(a, b):\\n    return a + b\\n')\n")
    proc = choir("run", str(item), "--run-id", "warm-run", "--json", serve="require")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["run_id"] == "warm-run"
    gate = choir("gate", "fix-add", "--repo", str(tmp_path / "repo"), serve="off")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    # the same run id again: the same refusal as cold
    again = choir("run", str(item), "--run-id", "warm-run", serve="require")
    assert again.returncode == 2 and "is taken" in again.stderr


def test_no_service_stale_service_and_dead_service_fall_back_cold(tmp_path: Path,
                                                                 choir_home: Path) -> None:
    repo = make_repo(tmp_path / "repo", config=QUICK)
    args = ("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name())
    required = choir(*args, serve="require")
    assert required.returncode == 2 and "no service runs" in required.stderr
    assert choir(*args).returncode == 0  # auto: cold, silently
    pid = start_service()
    try:
        # the interpreter would start differently: the service is stale for this client
        stale = choir(*args, serve="require", extra_env={"PYTHONWARNINGS": "default"})
        assert stale.returncode == 2 and "PYTHONWARNINGS" in stale.stderr
        fallback = choir(*args, extra_env={"PYTHONWARNINGS": "default"})
        assert fallback.returncode == 0 and "running without `choir serve`" in fallback.stderr
    finally:
        os.kill(pid, signal.SIGKILL)  # dead, its socket file left behind
        wait_gone(pid)
    dead = choir(*args, serve="require")
    assert dead.returncode == 2 and "is gone" in dead.stderr
    assert choir(*args).returncode == 0
    # a new service replaces the dead one's socket
    stop_service(start_service())


def test_a_second_service_is_refused_and_stop_ends_the_first(service: int,
                                                             choir_home: Path) -> None:
    second = choir("serve", "--idle-timeout", "5")
    assert second.returncode == 2 and f"pid {service}" in second.stderr
    stopped = choir("serve", "--stop")
    assert stopped.returncode == 0 and str(service) in stopped.stdout
    wait_gone(service)
    assert not (choir_home / "serve" / "sock").exists()
    assert choir("serve", "--stop").returncode == 1  # none runs now


@pytest.mark.slow
def test_idle_timeout_ends_the_service(choir_home: Path) -> None:
    pid = start_service("--idle-timeout", "1")
    wait_gone(pid, timeout=30)
    assert not (choir_home / "serve" / "sock").exists()


def test_the_service_and_its_workers_never_see_the_key(shared: tuple[Path, int]) -> None:
    choir_home, service = shared
    key = choir_home / "keys" / "ed25519.key"
    assert key.exists()  # the broker made it
    masked = os.readlink(f"/proc/{service}/ns/mnt")
    assert masked != os.readlink("/proc/self/ns/mnt")  # the service confined itself
    children = Path(f"/proc/{service}/task/{service}/children").read_text().split()
    workers = [int(p) for p in children if os.readlink(f"/proc/{p}/ns/mnt") == masked]
    assert workers  # the other child is the broker, outside
    for pid in [service, *workers]:
        view = Path(f"/proc/{pid}/root") / str(key).lstrip("/")
        assert not view.exists(), f"pid {pid} sees the key"


# ---- attacks ----------------------------------------------------------------------------


def test_another_user_is_refused_even_when_the_socket_is_reachable(
        tmp_path: Path, service: int, choir_home: Path) -> None:
    """The folder is 0700 and the socket 0600; were they opened up (a mistake, or a copied
    home), the service still answers only its own uid (SO_PEERCRED): a request from nobody
    would otherwise run as this user, in this user's home."""
    folder = choir_home / "serve"
    opened = {p: os.stat(p).st_mode for p in (choir_home, folder, *choir_home.parents)}
    for path, mode in opened.items():
        os.chmod(path, mode | 0o005)
    os.chmod(folder / "sock", 0o666)
    repo = make_repo(tmp_path / "repo")
    os.chmod(repo, 0o755)
    try:
        answer = raw_request(folder / "sock", {"argv": ["verify", "--repo", str(repo)]},
                             cwd=repo, as_user=65534)
    finally:
        for path, mode in opened.items():
            os.chmod(path, mode)
        os.chmod(folder / "sock", 0o600)
    assert answer.get("refused") == "the service answers only its own user", answer


def test_a_fake_service_of_another_user_is_never_spoken_to(tmp_path: Path,
                                                          choir_home: Path) -> None:
    """A socket at the service's name, listened on by another uid, answers PASS for
    anything; the client checks who listens and runs cold instead (FAIL, exit 1)."""
    folder = choir_home / "serve"
    folder.mkdir(mode=0o700)
    fake = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import json, os, socket, struct
        s = socket.socket(socket.AF_UNIX)
        s.bind({str(folder / 'sock')!r})
        os.setuid(65534)
        s.listen(4)
        print("ready", flush=True)
        while True:
            c, _ = s.accept()
            try:
                c.recv(1 << 20)
            except OSError:
                pass
            for m in ({{"started": {{"pid": 1}}}}, {{"done": {{"status": "PASS",
                      "verdict": "PASS", "contract": {{}}}}}}):
                b = json.dumps(m).encode()
                try:
                    c.sendall(struct.pack(">I", len(b)) + b)
                except OSError:
                    pass
        """)], stdout=subprocess.PIPE, text=True)
    assert fake.stdout is not None
    try:
        assert fake.stdout.readline().strip() == "ready"
        repo = make_repo(tmp_path / "repo", calc=CALC_BUG, config=QUICK)
        proc = choir("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name())
        assert proc.returncode == 1, proc.stderr
        assert "served by uid 65534" in proc.stderr
        assert json.loads(proc.stdout)["status"] == "FAIL"
    finally:
        fake.kill()
        fake.wait()
        fake.stdout.close()


@pytest.mark.parametrize("plant", ["symlink", "other-owner", "open"])
def test_a_planted_folder_is_refused_by_service_and_client(tmp_path: Path, choir_home: Path,
                                                           plant: str) -> None:
    folder = choir_home / "serve"
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o777)
    if plant == "symlink":
        folder.symlink_to(elsewhere)
    elif plant == "other-owner":
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
    else:
        folder.mkdir()
        os.chmod(folder, 0o777)
    proc = choir("serve", "--idle-timeout", "5")
    assert proc.returncode == 2, proc.stderr
    assert "fix: remove it" in proc.stderr
    repo = make_repo(tmp_path / "repo", config=QUICK)
    verify = choir("verify", "--repo", str(repo), "--sandbox", sandbox_name())
    assert verify.returncode == 0 and "not using the service" in verify.stderr
    assert not list(elsewhere.iterdir())  # nothing was made through the link


def test_a_socket_file_left_in_place_of_the_socket_is_refused(choir_home: Path) -> None:
    folder = choir_home / "serve"
    folder.mkdir(mode=0o700)
    target = choir_home / "elsewhere.sock"
    (folder / "sock").symlink_to(target)
    proc = choir("serve", "--idle-timeout", "5")
    assert proc.returncode == 2 and "is not your socket" in proc.stderr


def test_a_request_asking_for_more_than_the_command_line_is_refused(
        tmp_path: Path, shared: tuple[Path, int]) -> None:
    """Each field a request might try beside its command line (network on, a wider
    allowlist, another policy or home) is refused by name, before anything runs."""
    repo = make_repo(tmp_path / "repo")
    line = {"argv": ["verify", "--repo", str(repo)]}
    extras: list[dict[str, Any]] = [{"network": True}, {"allowlist": ["anything"]},
                                     {"policy": {"CALM": []}}, {"home": "/tmp/other"}]
    for extra in extras:
        answer = ask(shared, {**line, **extra}, cwd=repo)
        name = next(iter(extra))
        assert f"request.{name}: Extra inputs are not permitted" in \
            answer.get("refused", ""), answer
    answer = ask(shared, line, cwd=repo, context={"network": True})
    assert "context.network: Extra inputs are not permitted" in answer.get("refused", "")


def test_an_option_the_command_has_not_is_the_cold_usage_error(
        tmp_path: Path, service: int, choir_home: Path) -> None:
    """The worker parses the line with the command's own click parser: an option ``choir
    verify`` does not take fails as it does cold (exit 2, click's message), nothing runs."""
    repo = make_repo(tmp_path / "repo")
    warm = choir("verify", "--network", "--repo", str(repo), cwd=repo, serve="require")
    cold = choir("verify", "--network", "--repo", str(repo), cwd=repo, serve="off")
    assert warm.returncode == cold.returncode == 2
    assert "No such option '--network'" in warm.stderr
    assert warm.stderr == cold.stderr and warm.stdout == cold.stdout == ""
    assert not list((choir_home / "artifacts").glob("runs/verify-*"))


def test_oversized_or_malformed_requests_are_refused_without_echo(
        tmp_path: Path, shared: tuple[Path, int]) -> None:
    long_repo = "A" * 200_000
    answer = ask(shared, {"argv": ["verify", "--repo", long_repo]}, cwd=tmp_path)
    assert "refused" in answer and long_repo[:100] not in answer["refused"]
    assert "refused" in ask(shared, {"argv": ["rm", "-rf", "/"]}, cwd=tmp_path)
    assert "refused" in ask(shared, {"command": "verify", "repo": "."}, cwd=tmp_path)
    assert "refused" in ask(shared, {"argv": ["verify", "--repo", "a\x00b"]}, cwd=tmp_path)
    answer = ask(shared, {"argv": ["verify"]}, cwd=tmp_path, fds=False)
    assert "three descriptors" in answer.get("refused", ""), answer


def test_a_client_that_lies_about_its_directory_is_refused(
        tmp_path: Path, shared: tuple[Path, int]) -> None:
    """The path says one folder, the descriptor (what the client really opened) another:
    the service would otherwise verify a repo the path names on the client's word."""
    repo = make_repo(tmp_path / "repo")
    other = tmp_path / "other"
    other.mkdir()
    answer = ask(shared, {"argv": ["verify"]}, cwd=other, claimed_cwd=str(repo))
    assert "disagree" in answer.get("refused", ""), answer
    answer = ask(shared, {"argv": ["verify"]}, cwd=repo, root=tmp_path)
    assert "root is not the service's" in answer.get("refused", ""), answer


def test_a_stale_context_is_told_so(tmp_path: Path, shared: tuple[Path, int]) -> None:
    answer = ask(shared, {"argv": ["verify"]}, cwd=tmp_path, context={"code": "0" * 64})
    assert "code differs" in answer.get("stale", ""), answer
    answer = ask(shared, {"argv": ["verify"]}, cwd=tmp_path, context={"version": "0.0.0"})
    assert "this client is 0.0.0" in answer.get("stale", ""), answer
    answer = ask(shared, {"argv": ["verify"]}, cwd=tmp_path,
                 env={"CHOIR_HOME": str(tmp_path / "another-home")})
    assert "CHOIR_HOME" in answer.get("stale", ""), answer


# ---- faults -----------------------------------------------------------------------------

def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def _steps(service: int) -> dict[int, int]:
    """Each ``sleep 97`` step (``SLEEPER``) under ``service``, with its worker."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() != b"sleep\x0097\x00":
                continue
        except OSError:
            continue
        pid = int(entry.name)
        while pid > 1:
            parent = _parent(pid)
            if parent == service:
                found[int(entry.name)] = pid
                break
            pid = parent
    return found


def _sleeping_client(tmp_path: Path, service: int, serve: str = "require",
                     *flags: str) -> tuple[subprocess.Popen[str], dict[int, int]]:
    """A ``choir verify`` of a repo whose one step sleeps (``SLEEPER``), answered by
    ``service``, once its step runs: the client, and the steps with their workers."""
    repo = make_repo(tmp_path / "repo", config=SLEEPER)
    client = subprocess.Popen([*CHOIR, "verify", "--repo", str(repo), *flags, "--sandbox",
                               sandbox_name()],
                              env={**os.environ, "CHOIR_SERVE": serve},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    steps: dict[int, int] = {}
    while not steps and time.monotonic() < deadline:
        steps = _steps(service)
        time.sleep(0.1)
    assert steps, "the step never started"
    return client, steps


def _assert_steps_stop(service: int) -> None:
    started = time.monotonic()
    while _steps(service) and time.monotonic() - started < 20:
        time.sleep(0.1)
    assert not _steps(service), "the sandbox outlived its client"


def test_a_client_that_disconnects_gets_its_sandboxes_stopped(tmp_path: Path, service: int,
                                                             choir_home: Path) -> None:
    client, _ = _sleeping_client(tmp_path, service, "require", "--json")
    client.kill()
    client.communicate()
    _assert_steps_stop(service)
    # the worker concluded on what it had: the session is recorded, attested, audit clean
    deadline = time.monotonic() + 30
    sessions: list[dict[str, Any]] = []
    while not sessions and time.monotonic() < deadline:
        time.sleep(0.2)
        sessions = [m for m in (json.loads(p.read_text()) for p in
                                (choir_home / "artifacts" / "runs").glob("*/manifest.json"))
                    if m.get("kind") == "verify_session"]
    assert len(sessions) == 1
    assert sessions[0]["status"] == "FAIL" and sessions[0]["attestations"]
    audit = choir("audit")
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_ctrl_c_on_a_warm_client_is_aborted_as_cold_and_stops_its_sandboxes(
        tmp_path: Path, service: int, choir_home: Path) -> None:
    """Ctrl-C while the service runs the command: the client says what click says cold
    ("choir: aborted", exit 1), never a traceback, and the worker stops the sandboxes and
    concludes (the client's end of the connection is gone)."""
    client, _ = _sleeping_client(tmp_path, service)
    client.send_signal(signal.SIGINT)
    _out, err = client.communicate(timeout=60)
    assert client.returncode == 1, err
    assert err.endswith("choir: aborted\n") and "Traceback" not in err, err
    _assert_steps_stop(service)


def test_clicks_own_exit_in_the_worker_is_its_exit_code_not_a_lost_worker(
        tmp_path: Path, service: int) -> None:
    """Shell completion (``_CHOIR_COMPLETE`` in the client's environment) makes click exit
    inside the worker's parse: the client gets that exit code and click's output, as cold,
    not "the worker ended without an answer"."""
    completion = {"_CHOIR_COMPLETE": "bash_complete", "COMP_WORDS": "choir verify --mo",
                  "COMP_CWORD": "2"}
    warm = choir("verify", cwd=tmp_path, serve="require", extra_env=completion)
    cold = choir("verify", cwd=tmp_path, serve="off", extra_env=completion)
    assert warm.returncode == cold.returncode == 0, warm.stderr
    assert "--mood" in warm.stdout and warm.stdout == cold.stdout, (warm, cold)


def test_kill_9_of_the_service_mid_request_still_answers_the_client(
        tmp_path: Path, service: int, choir_home: Path) -> None:
    """The worker owns its connection and its broker: the request finishes and answers,
    nothing is half-written, and a new service can start at once."""
    repo = make_repo(tmp_path / "repo", config=textwrap.dedent("""\
        verifiers:
          slow:
            kind: lint
            steps:
              - name: wait
                command: sleep 3
            timeout_s: 120
        """))
    client = subprocess.Popen([*CHOIR, "verify", "--repo", str(repo), "--json", "--sandbox",
                               sandbox_name()],
                              env={**os.environ, "CHOIR_SERVE": "require"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    os.kill(service, signal.SIGKILL)
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert json.loads(out)["status"] == "PASS"
    wait_gone(service)
    audit = choir("audit")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    stop_service(start_service())


@pytest.mark.slow
def test_a_worker_killed_mid_request_fails_the_client_clearly(tmp_path: Path, service: int,
                                                             choir_home: Path) -> None:
    client, steps = _sleeping_client(tmp_path, service, "auto")
    os.kill(next(iter(steps.values())), signal.SIGKILL)
    _, err = client.communicate(timeout=60)
    assert client.returncode == 2
    assert "ended without an answer" in err and "run again" in err


def _cmd(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_concurrency_is_bounded_by_jobs(tmp_path: Path, choir_home: Path) -> None:
    pid = start_service("--jobs", "1")
    try:
        repo = make_repo(tmp_path / "repo", config=textwrap.dedent("""\
            verifiers:
              nap:
                kind: lint
                steps:
                  - name: nap
                    command: sleep 2
                timeout_s: 60
            """))
        env = {**os.environ, "CHOIR_SERVE": "require"}
        clients = [subprocess.Popen([*CHOIR, "verify", "--repo", str(repo), "--json",
                                     "--sandbox", sandbox_name()], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]
        spans = []
        for client in clients:
            out, err = client.communicate(timeout=120)
            assert client.returncode == 0, err
            manifest = json.loads(out)["manifest"]
            spans.append((manifest["timestamp_start"], manifest["timestamp_end"]))
        first, second = sorted(spans)
        assert second[0] >= first[1], f"two requests ran side by side with --jobs 1: {spans}"
    finally:
        stop_service(pid)


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bwrap is not installed")
def test_the_warm_service_keeps_launchers_armed(shared: tuple[Path, int]) -> None:
    """Idle workers wait with launchers already in their cgroup pairs (as root)."""
    service = shared[1]
    if os.geteuid() != 0:
        pytest.skip("cgroup launchers need root")
    deadline = time.monotonic() + 30
    armed = 0
    while time.monotonic() < deadline and not armed:
        for pid in Path(f"/proc/{service}/task/{service}/children").read_text().split():
            # every thread's children: a launcher armed in the background (the one the bwrap
            # probe gave back, or a spare) is the child of the pool's thread, not the main one
            kids = []
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # the worker took a request and ended meanwhile
            for task in tasks:
                try:
                    kids += Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                except OSError:
                    continue
            armed += sum(1 for k in kids if b"/bin/sh" in _cmd(k) or b"unshare" in _cmd(k))
        time.sleep(0.2)
    assert armed


@pytest.mark.slow
def test_a_run_whose_client_goes_away_is_interrupted_and_resumes(tmp_path: Path,
                                                                 service: int) -> None:
    """A `choir run` client killed mid-round: the worker interrupts the run as Ctrl-C would
    (its sandboxes are not killed into an attested FAIL), and `--resume` finishes it in
    its first attempt."""
    make_repo(tmp_path / "repo", config=sleeper(6).replace("kind: lint", "kind: unit_tests"))
    item = command_item(tmp_path, "nap", "pass\n")
    client = subprocess.Popen([*CHOIR, "run", str(item), "--run-id", "napping"],
                              env={**os.environ, "CHOIR_SERVE": "require"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            _cmd(str(p)) == b"sleep\x006\x00" and service in _ancestry(p)
            for p in map(int, filter(str.isdigit, os.listdir("/proc")))):
        time.sleep(0.1)
    client.kill()
    client.communicate()
    resumed = None
    for _ in range(60):  # the interrupted worker lets go of the run's lease
        resumed = choir("run", "--resume", "napping", "--json", serve="off",
                        extra_env={"CHOIR_LEASE_WAIT_S": "30"})
        if "is being driven" not in resumed.stderr:
            break
        time.sleep(0.5)
    assert resumed is not None
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    out = json.loads(resumed.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 1, out


def _ancestry(pid: int) -> set[int]:
    found = set()
    while pid > 1:
        pid = _parent(pid)
        found.add(pid)
    return found


@pytest.mark.slow
def test_a_frozen_service_is_waited_for_a_bounded_time(tmp_path: Path, service: int) -> None:
    repo = make_repo(tmp_path / "repo", config=QUICK)
    os.kill(service, signal.SIGSTOP)
    try:
        started = time.monotonic()
        proc = choir("verify", "--repo", str(repo), "--sandbox", sandbox_name())
        assert proc.returncode == 0, proc.stderr
        assert "said nothing for 10 s" in proc.stderr
        assert time.monotonic() - started < 60
    finally:
        os.kill(service, signal.SIGCONT)


def test_the_warm_up_covers_what_a_verify_imports(tmp_path: Path) -> None:
    """A worker pays no import on a request's path: after the service's warm-up, a verify
    imports no module of Choir's (a new lazy import belongs in WARM_MODULES), and builds no
    model's validator (built at first use, ``defer_build``: the warm-up builds them all)."""
    repo = make_repo(tmp_path / "repo", config=QUICK)
    script = textwrap.dedent(f"""\
        import contextlib, io, sys
        from pathlib import Path
        from choir.trusted import separate
        separate()
        from choir.cli.serve import _commands, _warm_up
        from choir.serve.wire import Request
        from choir.serve.worker import warm_idle
        from tests.serving import idle_service
        _warm_up()
        commands = _commands()  # as the service has them before it forks a worker
        warm_idle(idle_service(Path({str(tmp_path / "home")!r})))
        line = Request(argv=("verify", "--repo", {str(repo)!r}, "--sandbox",
                             {sandbox_name()!r}, "--json"))
        from pydantic._internal import _model_construction as made
        built = []
        complete = made.complete_model_class
        def counted(cls, *args, **kwargs):
            built.append(cls.__name__)
            return complete(cls, *args, **kwargs)
        made.complete_model_class = counted
        before = set(sys.modules)
        with contextlib.redirect_stdout(io.StringIO()):
            code = commands["verify"].run(line)  # what a worker runs for the request
        assert code == 0, code
        assert not built, built
        print(" ".join(sorted(set(sys.modules) - before)))
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = proc.stdout.split()
    assert not [m for m in imported if m.startswith("choir")], imported


def test_a_service_started_in_a_repo_imports_nothing_planted_there(
        tmp_path: Path, choir_home: Path) -> None:
    """``choir serve --detach`` started its service with ``python -m choir``, which puts the
    working directory first on the import path: a ``choir/__main__.py`` or a standard module
    (``selectors.py``, git-ignored) an executor planted in the repo ran in the service,
    before it separated, with the key readable (a review found it). The service, and
    ``choir ci``'s own ``choir verify``, start with ``-P`` now."""
    repo = tmp_path / "repo"
    (repo / "choir").mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    plant = f"import pathlib; pathlib.Path({str(marker)!r}).write_text(__name__)\n"
    (repo / "choir" / "__main__.py").write_text(plant)
    (repo / "choir" / "__init__.py").write_text(plant)
    (repo / "selectors.py").write_text(plant)
    # the console script as installed (its own folder first on the path, not the repo)
    script = Path(sys.executable).parent / "choir"
    started = subprocess.run([str(script), "serve", "--detach"], cwd=repo,
                             capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stderr
        assert not marker.exists(), marker.read_text()
    finally:
        found = re.search(r"\(pid (\d+)\)", started.stdout)
        if found:
            stop_service(int(found.group(1)))
    from choir.ci.steps import CHOIR as CI_CHOIR

    ran = subprocess.run([*CI_CHOIR, "--version"], cwd=repo, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0 and not marker.exists(), ran.stderr


def test_a_service_that_would_answer_otherwise_than_cold_is_stale(
        tmp_path: Path, service: int, choir_home: Path) -> None:
    """Three standings a worker cannot serve as the cold command would (a review found each
    ending in a crash, or a traced run, where cold passed): another artifact folder (the
    worker's broker checks the service's store, and refused to sign), a signing key rotated
    since the service started (the verifiers ran, then signing failed: a run unattested),
    and LangSmith's tracing switched otherwise (its setting is read once, when the service
    warmed up). Each is stale now: the client runs cold, and the answer is cold's."""
    repo = make_repo(tmp_path / "repo", config=QUICK)
    args = ("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name())
    other = {"CHOIR_ARTIFACT_DIR": str(tmp_path / "other-artifacts")}
    required = choir(*args, serve="require", extra_env=other)
    assert required.returncode == 2 and "artifact folder" in required.stderr, required.stderr
    traced = {"LANGSMITH_TRACING": "false"}  # off either way: the value differs, not its effect
    required = choir(*args, serve="require", extra_env=traced)
    assert required.returncode == 2 and "LANGSMITH_TRACING" in required.stderr
    assert choir(*args, extra_env=traced).returncode == 0
    assert choir("keys", "rotate").returncode == 0
    required = choir(*args, serve="require")
    assert required.returncode == 2 and "key" in required.stderr, required.stderr
    assert choir(*args).returncode == 0
    audited = choir("audit")
    assert audited.returncode == 0, audited.stdout + audited.stderr


def test_a_client_that_trickles_its_request_frees_its_worker(
        tmp_path: Path, service: int, choir_home: Path) -> None:
    """``REQUEST_WAIT_S`` bounded each read, not the request: one byte every few seconds
    held a worker for as long as the client liked. The whole request has that long now."""
    import socket

    from choir.serve.worker import REQUEST_WAIT_S

    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(choir_home / "serve" / "sock"))
    began = time.monotonic()
    sock.sendall((100_000).to_bytes(4, "big"))  # a frame of 100 kB announced
    sock.settimeout(2.0)
    closed = False
    while time.monotonic() - began < REQUEST_WAIT_S + 15 and not closed:
        try:
            closed = sock.recv(1024) == b""
        except TimeoutError:
            try:
                sock.sendall(b"{")  # one more byte, never the whole frame
            except OSError:
                closed = True
        except OSError:
            closed = True
    sock.close()
    assert closed and time.monotonic() - began < REQUEST_WAIT_S + 10


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) to make a mount namespace")
def test_a_client_in_another_mount_namespace_is_not_answered_for_the_services_files(
        tmp_path: Path, service: int) -> None:
    """A client in a mount namespace of its own with the same root (``unshare -m``) saw a
    buggy tree bind-mounted over its repo, and the service verified the files it sees
    instead: PASS, exit 0, for a tree the client's checkout does not hold (a review found
    it). The client sends its mount namespace; another one is refused, and the client runs
    cold, on its own files."""
    good = make_repo(tmp_path / "repo", config=QUICK)
    bad = make_repo(tmp_path / "bad", calc=CALC_BUG, config=QUICK)
    inner = (f"mount --bind {bad} {good} && cd {tmp_path} && "
             f"{sys.executable} -m choir verify --repo {good} --json --sandbox "
             f"{sandbox_name()}")
    for serve, code in (("require", 2), ("auto", 1)):
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                              env={**os.environ, "CHOIR_SERVE": serve}, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == code, (serve, proc.stdout[-1500:], proc.stderr[-1500:])
        if serve == "require":
            assert "another mount namespace" in proc.stderr
        else:
            assert json.loads(proc.stdout)["status"] == "FAIL"  # cold, on the buggy files
    assert choir("verify", "--repo", str(good), "--sandbox", sandbox_name(),
                 serve="require").returncode == 0  # the service still answers at home


def test_auto_chooses_the_sandbox_by_the_clients_path_not_the_services(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 18d: a worker probed bwrap with the service's environment before its request
    and kept the answer: a service started where its ``PATH`` finds no bwrap (a unit file, an
    IDE) ran every warm request's steps unsandboxed under ``auto``, where the same command
    run cold chose bwrap."""
    if not shutil.which("bwrap"):
        pytest.skip("bwrap is not installed")
    no_engine = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    pid = start_service(extra_env={"PATH": "/nonexistent", **no_engine})
    try:
        repo = make_repo(tmp_path / "repo")
        warm = choir("verify", "--repo", str(repo), "--json", serve="require",
                     extra_env=no_engine)
        cold = choir("verify", "--repo", str(repo), "--json", serve="off", extra_env=no_engine)
        chosen = [json.loads(p.stdout)["manifest"]["platform"]["sandbox"] for p in (warm, cold)]
        assert chosen == ["bwrap", "bwrap"], warm.stderr[-2000:]
    finally:
        stop_service(pid)


def _model_run(tmp_path: Path, api_base: str, model: str, run_id: str) -> None:
    """One ``choir run`` through the service of a work item whose executor is an LLM (the
    fake server at ``api_base``: "nothing to change"); it must pass."""
    item = tmp_path / "item.yaml"
    item.write_text(f"id: keep-add\ngoal: keep add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: llm\n  model: {model}\n")
    proc = choir("run", str(item), "--run-id", run_id, "--json", serve="require",
                 extra_env={"OPENAI_API_BASE": api_base, "OPENAI_API_KEY": "sk-fake"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _note_since(note: Path, started: float) -> str:
    """The models note once a worker wrote it after ``started`` (after its answer), with
    nothing half-written beside it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not note.exists()
                                           or note.stat().st_mtime < started):
        time.sleep(0.05)
    # the worker's work after its answer ran to its end: a KeyboardInterrupt meant for a run
    # whose client is gone hit it once the client left with its exit code
    left = sorted(p.name for p in note.parent.iterdir())
    assert note.exists() and not [n for n in left if n.startswith(".")], left
    return note.read_text()


def test_a_request_that_used_a_model_leaves_the_service_importing_it_once(
        tmp_path: Path, choir_home: Path, service: int) -> None:
    """litellm takes seconds to import (4-5 s here), and a worker of ``choir serve`` imported
    it for every request with a model (an LLM executor, the Director's, a reporter's): the
    service kept every other import warm but not that one. Now the worker notes that it
    needed it, the service imports it once (in a thread, forking nothing meanwhile) and
    replaces its idle workers, and the next requests' workers have it from the service."""
    from choir.serve.worker import MODELS
    from choir.testing import FakeModelServer, final_output

    make_repo(tmp_path / "repo", config=QUICK)
    note = choir_home / "serve" / MODELS
    seen = []
    with FakeModelServer([final_output(summary="nothing to change")],
                         repeat_last=True) as server:
        for attempt in range(12):
            started = time.time() - 1  # the file system's clock may lag a little
            _model_run(tmp_path, server.api_base, server.model, f"model-{attempt}")
            seen.append(_note_since(note, started))
            if seen[-1] == "inherited":
                break
            time.sleep(2.0)  # the service imports it meanwhile, then forks new workers
    assert seen[0] == "imported", seen  # the first request's worker imported it
    assert seen[-1] == "inherited", seen  # a later one had it from the service


def test_a_service_started_where_requests_used_a_model_forks_its_workers_with_it(
        tmp_path: Path, choir_home: Path) -> None:
    """The note outlives the service: a service started in a home whose requests used a
    model imports litellm before it forks its first workers (a request that comes first
    waits, told ``queued``), so even the first request's worker has it."""
    from choir.serve.worker import MODELS
    from choir.testing import FakeModelServer, final_output

    make_repo(tmp_path / "repo", config=QUICK)
    note = choir_home / "serve" / MODELS
    note.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    note.write_text("imported")
    pid = start_service()
    try:
        with FakeModelServer([final_output(summary="nothing to change")],
                             repeat_last=True) as server:
            started = time.time() - 1
            _model_run(tmp_path, server.api_base, server.model, "first")
        assert _note_since(note, started) == "inherited"
    finally:
        stop_service(pid)
