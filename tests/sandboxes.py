"""Which sandboxes a test may use. Docker skips only when no engine answers and CI is unset;
in CI an engine that does not answer fails the run, except in the stage that runs the suite
as on a new user's machine (``CHOIR_TESTS_DOCKER=absent``: no engine, on purpose)."""

from __future__ import annotations

import os
import shutil

import pytest

from choir.sandbox import get_sandbox


def docker_or_skip() -> None:
    from choir.sandbox.docker import DockerSandbox

    if DockerSandbox.available():
        box = DockerSandbox()
        box.has_image()  # builds the default image on a new engine, as a first run would
        box.close()
        return
    if os.environ.get("CI") and os.environ.get("CHOIR_TESTS_DOCKER") != "absent":
        pytest.fail("CI is set but no Docker engine answers: .ci/run must start dockerd")
    pytest.skip("no Docker engine answers (set CI=1 to make this a failure)")


def isolated_backend(name: str):  # type: ignore[no-untyped-def]
    if name == "docker":
        docker_or_skip()
    elif not shutil.which("bwrap"):
        if os.environ.get("CI"):
            pytest.fail("CI is set but bubblewrap is not installed")
        pytest.skip("bubblewrap is not installed")
    return get_sandbox(name)


ISOLATED = [pytest.param("bwrap", marks=pytest.mark.bwrap),
            pytest.param("docker", marks=pytest.mark.docker)]
