"""A folder of mode 000 that cannot be opened, for root as for anyone: root opens such a
folder anyway, so the refusal a user without root meets is simulated (``os.open`` of a
folder whose mode is 000 fails with EACCES)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


def lock(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``folder`` mode 000 and refuse every ``os.open`` of a folder of that mode; the
    caller undoes the patch and gives the mode back."""
    folder.chmod(0)
    real = os.open

    def refusing(path: str, flags: int, *args: object, **kwargs: object) -> int:
        fd = real(path, flags, *args, **kwargs)  # type: ignore[arg-type]
        if flags & os.O_DIRECTORY and stat.S_IMODE(os.fstat(fd).st_mode) == 0:
            os.close(fd)
            raise PermissionError(13, "Permission denied", path)
        return fd

    monkeypatch.setattr(os, "open", refusing)
