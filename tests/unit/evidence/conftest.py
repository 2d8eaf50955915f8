"""The repo the stat cache and store tests scan: a committed git tree with a subfolder two
levels deep, an executable, a symlink and the calc module whose bytes the attacks forge."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

BUGGY = b"def add(a, b):\n    return a - b\n"
FORGED = b"def add(a, b):\n    return a + b\n"  # the same size


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    (path / "pkg" / "deep").mkdir(parents=True)
    (path / "calc.py").write_bytes(BUGGY)
    for n in range(20):
        (path / "pkg" / f"m{n}.py").write_text(f"x = {n:04d}\n")
    (path / "pkg" / "deep" / "leaf.py").write_text("leaf = 1\n")
    (path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(path / "run.sh", 0o755)
    (path / "link.py").symlink_to("pkg/m1.py")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "one")):
        subprocess.run(["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t",
                        *args], check=True, capture_output=True)
    time.sleep(0.01)  # older than the scans that follow (the racy rule compares with them)
    return path
