"""The service's folder is trusted only when it is a real folder of this user's, closed to
everyone else; the socket in it only when it is this user's socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from choir.exceptions import UserError
from choir.serve import place


def test_the_folder_is_made_owner_only(tmp_path: Path) -> None:
    fd = place.open_folder(tmp_path / "home", create=True)
    assert fd is not None
    try:
        info = os.fstat(fd)
        assert info.st_mode & 0o777 == 0o700 and info.st_uid == os.geteuid()
    finally:
        os.close(fd)
    assert place.open_folder(tmp_path / "elsewhere", create=False) is None


def test_a_link_another_owner_or_an_open_folder_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (home / place.FOLDER).symlink_to(target)
    with pytest.raises(UserError, match="a link or not a folder"):
        place.open_folder(home, create=True)
    (home / place.FOLDER).unlink()
    (home / place.FOLDER).mkdir(mode=0o700)
    os.chmod(home / place.FOLDER, 0o755)
    with pytest.raises(UserError, match="open to others"):
        place.open_folder(home, create=False)
    if os.geteuid() == 0:
        os.chmod(home / place.FOLDER, 0o700)
        os.chown(home / place.FOLDER, 65534, 65534)
        with pytest.raises(UserError, match="owned by uid 65534"):
            place.open_folder(home, create=False)


def test_only_a_socket_of_this_users_passes(tmp_path: Path) -> None:
    fd = place.open_folder(tmp_path, create=True)
    assert fd is not None
    folder = place.folder(tmp_path)
    try:
        assert not place.check_socket(fd)
        (folder / place.SOCKET).symlink_to(tmp_path / "elsewhere")
        with pytest.raises(UserError, match="not your socket"):
            place.check_socket(fd)
        (folder / place.SOCKET).unlink()
        (folder / place.SOCKET).write_text("")
        with pytest.raises(UserError, match="not your socket"):
            place.check_socket(fd)
        (folder / place.SOCKET).unlink()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(place.socket_address(fd))  # a long home stays under 108 bytes
            assert place.check_socket(fd)
    finally:
        os.close(fd)


def test_a_home_longer_than_a_socket_address_works(tmp_path: Path) -> None:
    home = tmp_path / ("x" * 120)
    fd = place.open_folder(home, create=True)
    assert fd is not None
    try:
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(place.socket_address(fd))
            server.listen(1)
            client.connect(place.socket_address(fd))
    finally:
        os.close(fd)
    assert (place.folder(home) / place.SOCKET).exists()
