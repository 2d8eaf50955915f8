"""One conformance suite that every backend passes (after inspect_ai's self_check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.exceptions import UnknownNameError
from choir.models import Limits
from choir.sandbox import Sandbox, get_sandbox, sandbox_names
from tests.sandboxes import ISOLATED, isolated_backend

BACKENDS = [pytest.param("local"), *ISOLATED]


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "local":
        return get_sandbox("local")
    return isolated_backend(request.param)  # type: ignore[no-any-return]


def run(sb: Sandbox, tmp_path: Path, command: str, timeout_s: float = 20):  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "hello.txt").write_text("hello\n")
    chunks: list[bytes] = []
    result = sb.exec(command, repo=repo, out_dir=tmp_path / "out", env={"EXTRA": "yes"},
                     timeout_s=timeout_s, limits=Limits(), network=False, sink=chunks.append)
    return result, b"".join(chunks).decode()


def test_exit_codes_pass_through(sandbox: Sandbox, tmp_path: Path) -> None:
    assert run(sandbox, tmp_path, "exit 0")[0].exit_code == 0
    assert run(sandbox, tmp_path, "exit 7")[0].exit_code == 7


def test_cwd_is_the_repo_and_output_streams(sandbox: Sandbox, tmp_path: Path) -> None:
    result, out = run(sandbox, tmp_path, "cat hello.txt; echo err >&2")
    assert "hello" in out and "err" in out and result.output_bytes == len(out.encode())


def test_environment_is_redirected_under_choir_out(sandbox: Sandbox, tmp_path: Path) -> None:
    _, out = run(sandbox, tmp_path, 'echo "$EXTRA|$TMPDIR|$HOME"; touch "$TMPDIR/t" && echo ok')
    extra, tmpdir, home = out.splitlines()[0].split("|")
    assert extra == "yes" and tmpdir.endswith("/tmp") and "ok" in out
    assert tmpdir.startswith(home.rsplit("/", 1)[0])


def test_timeout_reports_timed_out(sandbox: Sandbox, tmp_path: Path) -> None:
    result, _ = run(sandbox, tmp_path, "sleep 60", timeout_s=1)
    assert result.timed_out and result.exit_code != 0


def test_registry_knows_the_backends_and_refuses_unknown_names() -> None:
    assert {"bwrap", "docker", "local"} <= set(sandbox_names())
    with pytest.raises(UnknownNameError, match="known: auto"):
        get_sandbox("podman")


def test_isolation_levels_are_declared() -> None:
    from choir.sandbox.bwrap import BwrapSandbox
    from choir.sandbox.docker import DockerSandbox
    from choir.sandbox.local import LocalSandbox

    assert (LocalSandbox.isolation, BwrapSandbox.isolation, DockerSandbox.isolation) == (
        "none", "namespace", "container")


def test_auto_skips_docker_when_its_image_is_missing() -> None:
    from tests.sandboxes import docker_or_skip

    docker_or_skip()
    chosen = get_sandbox("auto", image="choir-no-such-image:404")
    assert chosen.name != "docker"
    assert get_sandbox("auto").name == "docker"  # the locally built test image is present


def test_bwrap_probe_agrees_with_a_real_run(tmp_path: Path) -> None:
    """auto relies on available(): it must be true exactly when a real run works."""
    import shutil

    from choir.sandbox.bwrap import BwrapSandbox

    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    result, out = run(get_sandbox("bwrap"), tmp_path, "echo works")
    assert BwrapSandbox.available() is (result.exit_code == 0 and "works" in out)


# the variables' values, printed by a command that names them (the preset's is told by
# ``CHOIR_PYTEST`` in its command) and by one that does not
SHOW = ("python3 -c \"import os; n = 'CHOIR_' + 'PYTEST_'; "
        "print('[%s|%s]' % (os.environ.get(n + 'PYC', ''), os.environ.get(n + 'ROOT', '')))\"")


@pytest.mark.parametrize("command", [SHOW, SHOW + ' # "$CHOIR_PYTEST"'])
def test_a_configurations_variables_never_name_choirs_bytecode_folder(
        sandbox: Sandbox, tmp_path: Path, command: str) -> None:
    """The pytest preset's wrapper loads code from ``$CHOIR_PYTEST_PYC`` (a folder Choir
    made for the step, bubblewrap's alone): a verifier's ``env:`` naming one (a folder of
    the tree, with code planted in it) is never what a step sees, in any backend."""
    repo = tmp_path / "repo"
    (repo / ".choir").mkdir(parents=True)
    chunks: list[bytes] = []
    sandbox.exec(command, repo=repo, out_dir=tmp_path / "out",
                 env={"CHOIR_PYTEST_PYC": str(repo), "CHOIR_PYTEST_ROOT": str(repo)},
                 timeout_s=20, limits=Limits(), network=False, sink=chunks.append)
    assert b"".join(chunks).decode().strip() == "[|]"
