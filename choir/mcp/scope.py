"""Which repos a server answers for, fixed when the person starts it.

A path an agent passes is only a way to name one of them: it is resolved (every link
followed, ``..`` applied) and must land on a served repo's root exactly; the repo handed on
is then the server's own resolved path, never the agent's string, so a link swapped after the
check changes nothing. Anything else (a folder outside, a ``..`` walk, a link planted in the
repo that leads out, a subfolder) is refused.

Each repo's ``choir.yaml`` is read when the server starts and its bytes pinned: the agent edits
the working tree, and the allowlist, the mood policy and the held-out checks are the person's
choice, not something a tool call (or an edit between two calls) widens. A verification is
refused when the file no longer matches: before it starts, when it parses the file (the
bytes it parses are the bytes it checks, ``averify_tree(pinned=...)``, so nothing runs and no
claim is recorded under an edited one) and again when it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from choir._core import fsopen
from choir._core.canonical import blake3_hex
from choir.config import CONFIG_NAME, load_repo_config
from choir.config._yaml import max_bytes
from choir.exceptions import UserError
from choir.models import VerifierSpec


@dataclass(frozen=True)
class Served:
    """One repo the server answers for, with its configuration as it was at the start."""

    root: Path
    config_hash: str
    specs: dict[str, VerifierSpec]
    # the commit checked out when the server started: a claim is verified with its checks
    # (``choir verify --base``), never the agent's edits of them (review 16f); None when the
    # repo has no commit, and then no claim is recorded
    head: str | None = None


def _config_hash(root: Path) -> str:
    try:
        return blake3_hex(fsopen.read_bytes(root, CONFIG_NAME, max_bytes() + 1))
    except OSError as exc:
        raise UserError(f"{root / CONFIG_NAME}: cannot be read ({exc.strerror or exc})\n"
                        "  fix: run `choir init` there, or serve another repo") from exc


def _head(root: Path) -> str | None:
    """The commit ``root``'s checkout is on, or None (no repository, no commit yet)."""
    from choir.evidence.git import locate

    try:
        git = locate(root)
    except Exception:  # noqa: BLE001 - a repository Choir refuses to read has no head here
        return None
    return git.rev("HEAD") if git is not None else None


@dataclass(frozen=True)
class Scope:
    """The served repos; the first is the default."""

    repos: tuple[Served, ...]

    @classmethod
    def open(cls, paths: list[Path]) -> Scope:
        """Resolve and pin ``paths`` (the current directory when empty).

        Raises:
            UserError: a path is not a folder, or its choir.yaml is missing or wrong.
        """
        served: list[Served] = []
        for path in paths or [Path(".")]:
            root = path.expanduser().resolve()
            if not root.is_dir():
                raise UserError(f"--repo {path}: not a directory\n  fix: pass the root of a "
                                "repo that holds choir.yaml")
            if any(s.root == root for s in served):
                continue
            config = load_repo_config(root)
            served.append(Served(root, _config_hash(root), dict(config.verifiers),
                                 _head(root)))
        return cls(tuple(served))

    def describe(self) -> str:
        return ", ".join(str(s.root) for s in self.repos)

    def pick(self, given: str | None) -> Served:
        """The served repo ``given`` names (the default one when None).

        Raises:
            UserError: ``given`` does not resolve to a served repo's root.
        """
        if given is None:
            return self.repos[0]
        if "\x00" in given:
            raise UserError("repo: a path holds no NUL byte")
        path = Path(given).expanduser()
        if not path.is_absolute():
            path = self.repos[0].root / path
        try:
            root = path.resolve(strict=True)
        except (OSError, RuntimeError):
            root = None
        for served in self.repos:
            if root == served.root:
                return served
        raise UserError(f"repo {given[:200]!r} is not a repo this server was started for "
                         f"(it may verify only: {self.describe()})")

    def check_pinned(self, served: Served) -> None:
        """Refuse when the repo's choir.yaml is not the one pinned at the start.

        Raises:
            UserError: it changed (or went away) since the server started.
        """
        try:
            now = _config_hash(served.root)
        except UserError:
            now = ""
        if now != served.config_hash:
            raise UserError(f"{served.root / CONFIG_NAME} changed since `choir mcp` started: "
                             "the allowlist and the mood policy are the person's, pinned at "
                             "the start; restart `choir mcp` to accept the new configuration")


__all__ = ["Scope", "Served"]
