"""Git for the plan driver: worktrees, branches, merges, with the same hardening as the
evidence code (no ``core.fsmonitor`` from a config an executor may have written), and the
error text kept, because a merge conflict's text is the feedback an item gets back."""

from __future__ import annotations

import subprocess
from pathlib import Path

from choir.exceptions import UserError

_ENV_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
             "-c", "commit.gpgsign=false")


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git in ``repo``.

    Raises:
        UserError: git failed and ``check`` (its stderr, bounded).
    """
    proc = subprocess.run(["git", *_ENV_SAFE, "-C", str(repo), *args], capture_output=True,
                          text=True, timeout=120,
                          env={"GIT_AUTHOR_NAME": "choir", "GIT_AUTHOR_EMAIL": "choir@localhost",
                               "GIT_COMMITTER_NAME": "choir",
                               "GIT_COMMITTER_EMAIL": "choir@localhost",
                               "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent",
                               "GIT_CONFIG_NOSYSTEM": "1"})
    if check and proc.returncode != 0:
        raise UserError(f"git {' '.join(args[:2])} failed in {repo}: "
                        f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc


def rev(repo: Path, ref: str) -> str | None:
    out = git(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False)
    return out.stdout.strip() or None if out.returncode == 0 else None


def worktree(repo: Path, path: Path, branch: str, start: str) -> None:
    """A fresh worktree at ``path`` on ``branch`` reset to ``start`` (an old one removed)."""
    if path.exists():  # a leftover of a killed driver: removed (and its record pruned)
        git(repo, "worktree", "remove", "--force", str(path), check=False)
        git(repo, "worktree", "prune")
    git(repo, "worktree", "add", "-f", "-B", branch, str(path), start)


def commit_all(tree: Path, message: str) -> str:
    """Commit everything in the worktree (an empty change still gets a commit)."""
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "--allow-empty", "--no-verify", "-m", message)
    return rev(tree, "HEAD") or ""
