"""The base a change is verified against: its choir.yaml and its checks, read from a commit.

A tree's own ``choir.yaml`` and tests are the author's to edit: a pull request that turns
``unit``'s step into a ``printf`` of a passing JUnit file, skips the failing test or adds a
``conftest.py`` hook passes any check that reads them from the tree. ``choir verify --base
REF`` (the GitHub Action's ``base-ref``) reads them from the base commit instead, as ``choir
run`` pins them from the tree it starts on: the allowlist and the mood overrides are the
base's ``choir.yaml`` (the tree's is never parsed), and the spec files (``spec:`` globs, as the
base's ``choir.yaml`` declares them) are pinned from the base commit's tree. The tree is then
judged against that pin exactly as an executor's round is (``choir.evidence.spec.compare``):
the verifiers read a view holding the base's checks, new checks run only beside them as extra
evidence, and a changed or deleted check, or a new test configuration or hook (a
``conftest.py``, a ``pytest.ini``), is held for a person (``approve``: the workflow says one
approved it). A new file that changes how the interpreter starts or where it looks, or that
shadows a module the checks import, is refused.

Everything is read from git's objects, each re-hashed against its id (``ObjectReader``),
never from the tree's files, and no git program runs that the tree could configure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from choir._core.canonical import blake3_hex
from choir.config import CONFIG_NAME
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.git import GitRepo, is_oid, locate
from choir.evidence.spec import (
    Manifest,
    approve_change,
    compiled_file,
    is_source,
    judge_round,
    pinned_paths,
    suppressions,
    view_key,
)
from choir.exceptions import ConfigError, UserError
from choir.models import SpecChange

EVERYTHING = ("**",)
"""What a change against a base may touch: any check (held for a person when it changes
or deletes one; a new one is admitted as extra evidence unless it changes how every check
runs, ``choir.evidence.spec.INFLUENCE``: held when it is test configuration, refused
otherwise)."""
_FETCH_HINT = ("fetch the base into the checkout first: actions/checkout with 'fetch-depth: 0' "
               "(or 'git fetch origin BASE'), or leave --base out to verify with the tree's "
               "own checks")


@dataclass(frozen=True)
class Base:
    """A base commit as read from git: every file's ``(path, kind, blob id)`` and
    choir.yaml's bytes."""

    ref: str
    commit: str
    git: GitRepo
    files: tuple[tuple[str, str, str], ...]
    config: bytes

    def pin(self, globs: Sequence[str], store: ArtifactStore) -> str:
        """Store every base file ``globs`` match, and what their links lead to
        (``pinned_paths``), and their manifest (as ``pin_spec`` would from a checkout of the
        base); returns the manifest's hash."""
        files: dict[str, tuple[str, str]] = {}
        blobs = {path: oid for path, _kind, oid in self.files}
        kinds = {path: kind for path, kind, _oid in self.files}
        with self.git.objects() as objects:
            chosen = pinned_paths(kinds, globs, lambda path: objects.read(blobs[path], "blob")
                                  .decode("utf-8", "surrogateescape"))
            for path in chosen:
                data = objects.read(blobs[path], "blob")
                digest = blake3_hex(data)  # most are stored already: no write, no fsync
                files[path] = (kinds[path], digest if store.exists(digest)
                               else store.ingest_bytes(data))
            compiled = {path: (kinds[path], blake3_hex(objects.read(blobs[path], "blob")))
                        for path in blobs if compiled_file(path)}
            suppressed = {path: suppressions(objects.read(blobs[path], "blob"))
                          for path in blobs if is_source(path) and path not in files and
                          kinds[path] in ("f", "x")}
        return store.ingest_bytes(Manifest.of(
            globs, files, (path for path, _kind, _oid in self.files), compiled,
            suppressed).encode())


# the names git tries for a short ref, in its order (``git help revisions``): the first that
# exists wins, whatever the others are
_DWIM = ("{}", "refs/{}", "refs/tags/{}", "refs/heads/{}", "refs/remotes/{}",
         "refs/remotes/{}/HEAD")


def ambiguous(git: GitRepo, ref: str) -> list[str]:
    """The refs ``ref``'s name could mean, when more than one exists (else ``[]``): a tag
    ``main`` beside the branch, a file ``.git/main``, or a branch named like an abbreviated
    commit id. git takes the first and at most warns: a review's tag ``main`` on the pull
    request's own commit made ``--base main`` pin the pull request's checks. A full commit
    id is never ambiguous (git takes it as the object)."""
    if is_oid(ref):
        return []
    name = re.split(r"[~^:]|@\{", ref, maxsplit=1)[0]
    if not name or name == "@":
        return []
    listed = git.run("for-each-ref", "--format=%(refname)")
    if listed is None:
        raise UserError(f"--base {ref}: git could not list the refs of {git.root}, so which "
                        "commit the name means cannot be told; give the commit's full id")
    refs = set(listed.decode("utf-8", "surrogateescape").split("\n"))
    found = [form.format(name) for form in _DWIM if form.format(name) in refs]
    if not name.startswith("refs/") and any(
            os.path.isfile(folder / name) for folder in {git.git_dir, git.common_dir}):
        found.insert(0, name)  # a file in the git folder itself (HEAD, or a planted one)
    if found and re.fullmatch(r"[0-9a-fA-F]{4,63}", name) and \
            git.run("rev-parse", f"--disambiguate={name.lower()}"):
        found.append(f"the commit {name}...")  # an abbreviated id that a ref is named like
    return list(dict.fromkeys(found)) if len(found) > 1 else []


def read_base(repo: Path, ref: str) -> Base:
    """Base commit ``ref`` of ``repo``: its files and its choir.yaml.

    Raises:
        UserError: ``repo`` is not a git work tree, or ``ref`` names no commit of it.
        ConfigError: the commit holds no choir.yaml as a regular file.
    """
    git = locate(repo)
    if git is None:
        raise UserError(f"--base {ref}: {repo} is not a git work tree; a base is a commit of "
                        "the repo")
    clash = ambiguous(git, ref)
    if clash:
        raise UserError(f"--base {ref}: the name is ambiguous in {repo} ({', '.join(clash)} "
                        "all answer to it, and git would pick one without a word): give the "
                        "base commit's full id, or a full ref such as refs/heads/main")
    commit = git.rev(ref)
    if commit is None:
        raise UserError(f"--base {ref}: no such commit in {repo}; {_FETCH_HINT}")
    with git.objects() as objects:
        files = tuple(objects.files(objects.commit_tree(commit)))
        found = [(kind, oid) for path, kind, oid in files if path == CONFIG_NAME]
        if not found or found[0][0] == "l":
            raise ConfigError(f"the base commit {commit[:12]} ({ref}) holds no {CONFIG_NAME} "
                              "as a regular file, so nothing pins the checks",
                              path=str(repo / CONFIG_NAME),
                              hint="commit choir.yaml on the base branch first (its first "
                                   "pull request is verified without --base)")
        config = objects.read(found[0][1], "blob")
    return Base(ref=ref, commit=commit, git=git, files=files, config=config)


@dataclass(frozen=True)
class Judged:
    """A tree judged against a base: the pin, the change, and the views the verifiers read
    (the base's checks alone; with the admitted new checks beside them, when there are any).
    """

    base: Base
    pin: str
    change: SpecChange
    alone: Path
    beside: Path | None

    @property
    def blocked(self) -> str | None:
        """Why the tree cannot be ASSERTed whatever the verifiers say, or None: what to do
        first, the paths last (a reader that cuts the line keeps the instruction)."""
        change = self.change
        if not change.blocks:
            return None
        if change.refused:
            return ("refused, approved or not: a new file that changes how the interpreter "
                    "starts or where it looks, or shadows a module the checks import (or has no "
                    "plain name), and a compiled file (.pyc, __pycache__/) new or changed, "
                    "which the checks never see, are never admitted; a person merges such a "
                    "change by hand. "
                    + _listed(change.refused))
        config = ("; choir.yaml's changes take effect once merged (the base's allowlist ran)"
                  if CONFIG_NAME in change.held else "")
        return ("held for a person: the change edits or deletes the base's checks, or adds "
                "a file that changes how every check runs, and the base's versions ran alone. "
                "To verify with the tree's, a person approves: "
                "--approve-spec-change (the action's approve-spec-change input, from "
                f"something only maintainers control, such as a label){config}. "
                + _listed(change.held))


def _listed(paths: Sequence[str], shown: int = 8) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return f"{len(paths)} path(s): " + ", ".join(paths[:shown]) + more


def judge_against(base: Base, globs: Sequence[str], tree: Path, tree_hash: str, root: Path,
                  *, approve: bool = False, store: ArtifactStore | None = None) -> Judged:
    """Pin ``base``'s checks, judge the sealed snapshot ``tree`` against them and build the
    views under ``root``. ``approve``: a person approved the held changes, so the tree's
    versions of those checks are what run (recorded as approved)."""
    store = store or ArtifactStore()
    pin = base.pin(globs, store)
    change = judge_round(tree, tree_hash, pin, EVERYTHING, "approve", root, store)
    if approve and change.held:
        pin, change = approve_change(tree, pin, change, root, store)
    # built just now under ``root``, this session's own folder, and hashed as they were built
    alone = root / view_key(tree_hash, pin)
    beside = root / view_key(tree_hash, pin, change.added) if change.added else None
    return Judged(base=base, pin=pin, change=change, alone=alone, beside=beside)
