"""A warm worker stands where the client's cold process would: its process standing
(capabilities, no_new_privs, seccomp, LSM label, groups), its resource limits, its
umask and its temporary folder; a service that cannot hide its key folder never starts.
Review 21a: a service started without ``CAP_SYS_ADMIN`` served a normal client, whose step
then ran unsandboxed with the signing key readable; a client's ``ulimit``, umask and
``TMPDIR`` did not reach its steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from choir.serve import stale
from choir.serve.wire import Context
from choir.serve.worker import Service, _stale

ROOT = Path("/sys/fs/cgroup")


def _service(standing: dict[str, str]) -> Service:
    return Service(home=Path("/h"), version="1.0", code="a" * 64, start_env={}, root=(0, 0),
                   commands={}, standing=standing)


def _context(**fields: Any) -> Context:
    base: dict[str, Any] = {"version": "1.0", "code": "a" * 64, "cwd": "/", "umask": 0o022,
                            "environ": {}, "standing": stale.standing(),
                            "rlimits": stale.rlimits()}
    return Context.model_validate_json(json.dumps({**base, **fields}))


def test_the_cli_refuses_to_serve_where_the_key_folder_stays_readable(
        monkeypatch: pytest.MonkeyPatch, choir_home: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Confinement ``process``: the key folder is readable in the service and its workers,
    so a step answered warm could read the signing key. Exit 2 before anything warms up."""
    from choir.cli import _group, serve
    from choir.cli._errors import exit_code
    from choir.serve import server

    started: list[bool] = []
    monkeypatch.setattr(serve, "_warm_up", lambda: started.append(True))
    monkeypatch.setattr(server, "start", lambda *a, **k: started.append(True))
    monkeypatch.setattr("choir.trusted.confine.confinement", lambda keys: "process")
    code = exit_code(lambda: _group.cli.main(args=["serve"], prog_name="choir",
                                             standalone_mode=False))
    err = capsys.readouterr().err
    assert (code, started) == (2, []), err
    assert "key folder" in err and "process" in err and "fix:" in err


def test_a_client_whose_process_standing_differs_is_told_the_service_is_stale() -> None:
    mine = stale.standing()
    assert set(stale.STATUS_FIELDS) <= set(mine) and mine["CapBnd"]
    assert _stale(_service(mine), _context()) == ""
    for part, value in (("CapBnd", "0000000000000000"), ("NoNewPrivs", "1"),
                        ("Seccomp", "2"), ("lsm", "confined-profile (enforce)"),
                        ("groups", "0 0 4 27 999")):
        why = _stale(_service(mine), _context(standing={**mine, part: value}))
        assert "standing" in why and part in why, (part, why)
        assert value.strip() not in why  # names the part, never echoes a value
    assert "standing" in _stale(_service(mine), _context(standing=None))


def test_a_context_from_an_older_client_is_stale_not_a_crash() -> None:
    old = _context()
    fields = old.model_dump()
    del fields["standing"], fields["rlimits"]
    older = Context.model_validate_json(json.dumps(fields))
    assert older.standing is None and older.rlimits is None
    assert _stale(_service(stale.standing()), older)


STAND = textwrap.dedent("""\
    import json, os, resource, sys, tempfile
    from choir.serve import stale
    from choir.serve.wire import Context
    from choir.serve.worker import _stand
    args = json.loads(sys.argv[1])
    tempfile.gettempdir()  # the service's, cached (the idle worker's probe did this)
    context = Context.model_validate_json(json.dumps({
        "version": "1.0", "code": "a" * 64, "cwd": os.getcwd(), "umask": 0o077,
        "environ": {"TMPDIR": args["tmp"]}, "standing": stale.standing(),
        "rlimits": {**stale.rlimits(), **args["rlimits"]}}))
    why = _stand(context, os.open(".", os.O_PATH))
    umask = os.umask(0)
    print(json.dumps({"why": why, "tmp": tempfile.gettempdir(), "umask": umask,
                      "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}))
""")


def _stand_in_child(tmp_path: Path, rlimits: dict[str, list[int]]) -> dict[str, Any]:
    service_tmp = tmp_path / "service-tmp"
    service_tmp.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", STAND, json.dumps({"tmp": str(tmp_path), "rlimits": rlimits})],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(service_tmp), "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return found


def test_the_worker_takes_the_clients_limits_umask_and_temporary_folder(
        tmp_path: Path) -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    found = _stand_in_child(tmp_path, {"RLIMIT_NOFILE": [300, hard]})
    assert found == {"why": "", "tmp": str(tmp_path), "umask": 0o077, "nofile": [300, hard]}


def test_a_limit_the_service_cannot_set_is_stale(tmp_path: Path) -> None:
    """A hard limit above what the service may raise (over ``fs.nr_open`` even root may
    not): the steps would run with a higher limit than the client's."""
    nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
    found = _stand_in_child(tmp_path, {"RLIMIT_NOFILE": [nr_open + 1, nr_open + 1]})
    assert "RLIMIT_NOFILE" in found["why"], found


@pytest.mark.skipif(not all(os.access(ROOT / c, os.W_OK) for c in ("pids", "memory")),
                    reason="cgroup v1 pids/memory controllers are not writable here")
def test_a_launcher_armed_with_the_services_umask_and_limits_is_armed_again() -> None:
    """An idle worker arms launchers before its request (``warm_idle``): they passed the
    service's umask and limits to every step, whatever the client's were."""
    code = textwrap.dedent("""
        import json, os, resource, subprocess
        from choir.models import Limits
        from choir.sandbox import _cgroups
        _cgroups._JOIN_TIMEOUT_S = 120
        assert _cgroups.prearm(1)
        os.umask(0o077)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        cg = _cgroups.CgroupLimits(Limits())
        proc = cg.spawn(["sh", "-c", "umask; ulimit -n"])
        out = proc.stdout.read().decode().split()
        proc.wait(timeout=20)
        cg.close()
        print(json.dumps(out))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert json.loads(out.stdout.splitlines()[-1]) == ["0077", "300"]
