"""A repository's config never makes Choir's git start a program (review 22c F1, critical).

An executor that can write ``.git`` declares a promisor remote (a "partial clone") whose URL
is a program (``ext::``) or whose ``uploadpack`` is one, and leaves a ref naming a commit
that does not exist. Git, asked about that ref by Choir after the round, "fetches" the
missing object from the promisor remote: the program ran outside the sandbox, as the user
running Choir, and read the signing key. Choir's git allows no transport at all
(``GIT_ALLOW_PROTOCOL``, which overrides every ``protocol.*.allow`` of the repo's config).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from choir.evidence.git import locate

MISSING = "1234567890123456789012345678901234567890"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


@pytest.fixture(params=["ext", "uploadpack"])
def planted(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """A repo whose config an executor wrote, and the file its program would create."""
    repo, mark = tmp_path / "repo", tmp_path / "PWNED"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "init")
    for key, value in (("core.repositoryformatversion", "1"),
                       ("extensions.partialClone", "origin"),
                       ("remote.origin.promisor", "true"), ("protocol.allow", "always"),
                       ("protocol.ext.allow", "always"), ("protocol.file.allow", "always")):
        _git(repo, "config", key, value)
    if request.param == "ext":
        _git(repo, "config", "remote.origin.url", f"ext::sh -c touch% {mark}% ;false")
    else:
        _git(repo, "config", "remote.origin.url", str(tmp_path))
        _git(repo, "config", "remote.origin.uploadpack", f"touch {mark}; false")
    (repo / ".git" / "refs" / "heads" / "zz").write_text(MISSING + "\n")
    return repo, mark


def test_no_read_of_a_missing_object_starts_the_repos_program(planted: tuple[Path, Path]
                                                               ) -> None:
    repo, mark = planted
    git = locate(repo)
    assert git is not None
    assert git.rev("zz") is None
    git.run("rev-list", "--all", "--reflog", "HEAD")
    with git.objects() as reader, pytest.raises(Exception, match="missing"):
        reader.read(MISSING, "commit")
    assert not mark.exists(), "Choir's git ran a program the repo's config named"
