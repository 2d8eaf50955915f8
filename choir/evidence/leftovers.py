"""Checks an executor left in a working tree: never a later run's pinned spec.

A run pins its checks from the working tree it starts on (``choir.evidence.spec.pin_spec``),
and what an executor wrote there stays when its run ends (a halted run leaves its tree for a
person to read). A check it planted and its run refused (a root ``conftest.py`` that marks
every test passed) was pinned as the repo's own by the next run of the item, and that run
was ASSERTed (review 20c). So each round records, in ``CHOIR_HOME/leftovers/`` (the
executor's sandbox masks the home), the spec files its executor added or changed (path and
blake3) and every commit the round created; a run marks the repo pending before its executor
starts, with the HEAD and refs it starts from, so a run stopped before its round was
recorded is not forgotten.

A run starting on the repo refuses (exit 2) to pin a file an executor wrote (the same bytes
at the same path) unless a person vouched for it: HEAD holds exactly those bytes, and the
newest commit in HEAD's history that changed the file is no executor's (an executor that
writes ``.git`` commits its own plant, and a person's unrelated commit on top made HEAD
no executor's: review 21d). Editing or removing the file works too. While a run is pending,
every spec file that differs from HEAD is refused alike, and so is one whose newest change
is a commit made since that run began. Deleting the record is the way out for a tree that
is not a git repository.

A work item file kept inside its repo is held to the same rule before it is read
(``check_item``): an executor that rewrote its own item (``mood``, ``sandbox``) would run the
next run of it on its own terms.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from choir._core.canonical import blake3_hex
from choir._core.errors import UserError
from choir._core.paths import choir_home
from choir.evidence.scan import blob_hasher

_SHOWN = 20
# past this many commits (a pending run's with no refs kept: the whole history) the paths
# they changed are not worked out; every pinned file's history is walked instead
_TOUCHED_MAX = 2_000


def _record_path(repo: Path) -> Path:
    key = blake3_hex(str(repo.resolve()).encode("utf-8", "surrogateescape"))[:32]
    return choir_home() / "leftovers" / f"{key}.json"


@contextlib.contextmanager
def _locked(repo: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The repo's record, read under an exclusive lock (written back by ``_save``)."""
    path = _record_path(repo)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data.setdefault("repo", str(repo.resolve()))
        data.setdefault("pending", [])
        data.setdefault("files", {})
        data.setdefault("begun", {})
        data.setdefault("commits", [])
        yield path, data
    finally:
        os.close(fd)


def _save(path: Path, data: dict[str, Any]) -> None:
    from choir._core.fsopen import write_whole

    write_whole(path, json.dumps(data, sort_keys=True, indent=1).encode())


def begin(repo: Path, run_id: str) -> None:
    """Before ``run_id``'s executor starts on ``repo``: the repo is pending until ``record``,
    and the HEAD and refs it starts from tell the commits its executor makes."""
    before = _refs(repo)
    with _locked(repo) as (path, data):
        if run_id not in data["pending"]:
            data["pending"].append(run_id)
            data["begun"][run_id] = before
        _save(path, data)


def record(repo: Path, run_id: str, written: Mapping[str, str]) -> None:
    """After a round: the spec files ``run_id``'s executor added or changed (``{path:
    blake3}``), and every commit the round created (reachable now from a ref, HEAD or a
    reflog, not from where the round began). When git cannot tell them, the run stays
    pending (every change from HEAD refused)."""
    with _locked(repo) as (path, data):
        data["files"].update(written)
        made = _new_commits(repo, data["begun"].get(run_id))
        if made is not None:
            data["commits"] = sorted({*data["commits"], *made})
            data["pending"] = [r for r in data["pending"] if r != run_id]
            data["begun"].pop(run_id, None)
        _save(path, data)


def check(repo: Path, pinned: Mapping[str, tuple[str, str]],
          read: Callable[[str], bytes]) -> None:
    """Refuse to pin a file of ``pinned`` (``{path: (kind, blake3)}``, a spec manifest's
    files; ``read`` gives a digest's bytes) that an executor wrote.

    Raises:
        UserError: such files, named, with the commit that brought them, and what to do
            (exit 2).
    """
    path = _record_path(repo)
    if not path.exists():
        return
    with _locked(repo) as (path, data):
        pending, written = list(data["pending"]), dict(data["files"])
        suspects = sorted(rel for rel, (_kind, digest) in pinned.items()
                          if pending or written.get(rel) == digest)
        made = _executor_commits(repo, data)
        # a file an executor committed is its own wherever a later record lost it (a
        # pending run cleared once its spec files were vouched for): each pinned file one
        # of its commits changed is walked to its newest change (every pinned file when
        # what they changed cannot be read)
        touched = _touched(repo, made) if made else set()
        committed = sorted(pinned) if made and touched is None else \
            sorted(set(pinned) & (touched or set()))
        head, at_head = _head_files(repo) if suspects or written or committed else (None, {})
        refused: list[str] = []
        vouched: set[str] = set()
        for rel in sorted({*suspects, *committed}):
            kind, digest = pinned[rel]
            entry = at_head.get(rel)
            if not _held(entry, kind, read, digest):
                if rel in suspects:
                    refused.append(rel)
            elif entry is not None and (by := _made_by_executor(repo, rel, entry, made)):
                refused.append(f"{rel} ({by})")
            else:
                vouched.add(rel)
        if refused:
            shown = ", ".join(refused[:_SHOWN]) + (" ..." if len(refused) > _SHOWN else "")
            why = (f"run {pending[0]} stopped before Choir recorded what its executor did, "
                   "and these differ from HEAD or were changed by a commit made since it "
                   "began" if pending else
                   "an executor wrote these (a run's round recorded them, or committed them)")
            raise UserError(
                f"{repo}: {why}: {shown}. They would be pinned as the repo's own checks.\n"
                "  fix: review them; commit the ones you vouch for (git add, git commit; a "
                "file an executor committed counts as yours once a commit of yours changes "
                "it), remove or restore the others (git checkout -- PATH), and run again; or, "
                f"once you reviewed the tree (git log, git status), delete {path}")
        # vouched (held by a commit a person made): forgotten; pending runs whose files a
        # person has since committed or removed are over, and what they committed stays an
        # executor's
        data["files"] = {rel: digest for rel, digest in written.items() if rel not in vouched}
        if made is not None:
            data["commits"] = sorted(made)
            data["pending"] = []
            data["begun"] = {}
        _save(path, data)


def check_item(repo: Path, item: Path) -> None:
    """Refuse a work item file kept inside ``repo`` that an executor may have written,
    before anything of it is used: in a git repo it must be the bytes HEAD holds, brought by
    a commit no executor made (an uncommitted item cannot be told from an executor's edit);
    in any repo, not one a round recorded, nor changed while a run is pending.

    Raises:
        UserError: the file, and what to do (exit 2).
    """
    rel = item.resolve().relative_to(repo.resolve()).as_posix()
    body = item.read_bytes()
    digest = blake3_hex(body)
    record = _record_path(repo)
    data: dict[str, Any] = {}
    if record.exists():
        with _locked(repo) as (_path, data):
            pass
    from choir.evidence.git import locate

    head, at_head = _head_files(repo)
    why = None
    if head is None and locate(repo) is not None:
        why = "the repo has no commit that holds it"
    elif head is not None:
        entry = at_head.get(rel)
        kind = entry[0] if entry is not None and entry[0] in ("f", "x") else "f"
        if not _held(entry, kind, lambda _d: body, digest):
            why = "it differs from HEAD's (uncommitted, or changed since)"
        elif entry is not None and data and \
                (by := _made_by_executor(repo, rel, entry, _executor_commits(repo, data))):
            why = f"an executor committed it ({by})"
    elif data.get("pending") or data.get("files", {}).get(rel) == digest:
        why = "an executor's round wrote it, or a run stopped while its executor ran"
    if why is not None:
        raise UserError(
            f"work item {item}: it lies inside its repo {repo}, and {why}: an executor "
            "that rewrites the item it runs under (its mood, sandbox or required verifiers) "
            "would decide the next run\n"
            "  fix: review it and commit it (git add, git commit), or keep the work item "
            "outside the repo")


def _head_files(repo: Path) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """HEAD's sha and ``{path: (kind, blob id)}`` of its tree, from checked objects;
    ``(None, {})`` outside git, before a first commit, or when git cannot answer."""
    from choir.evidence.git import locate

    git = locate(repo)
    if git is None:
        return None, {}
    try:
        with git.objects() as reader:
            found = reader.head()
            if found is None:
                return None, {}
            return found[0], {p: (kind, oid) for p, kind, oid in reader.files(found[1])}
    except Exception:  # noqa: BLE001 - an unreadable HEAD vouches for nothing
        return None, {}


def _held(entry: tuple[str, str] | None, kind: str, read: Callable[[str], bytes],
          digest: str) -> bool:
    """Whether HEAD's ``entry`` (kind, blob id) is the pinned file of ``kind`` and
    ``digest``: the same kind, and git's id of its bytes."""
    if entry is None or entry[0] != kind:
        return False
    body = read(digest)
    hasher = blob_hasher(len(entry[1]), len(body))
    hasher.update(body)
    return hasher.hexdigest() == entry[1]


def _refs(repo: Path) -> dict[str, Any] | None:
    """The HEAD and the commits every ref names, as a round begins; None outside git."""
    from choir.evidence.git import is_oid, locate

    git = locate(repo)
    if git is None:
        return None
    out = git.run("for-each-ref", "--format=%(objectname)")
    refs = sorted({r for r in (out or b"").decode("ascii", "replace").split() if is_oid(r)})
    return {"head": git.rev("HEAD"), "refs": refs}


def _new_commits(repo: Path, before: dict[str, Any] | None) -> set[str] | None:
    """The commits reachable now (refs, HEAD, reflogs) and not from ``before``: those an
    executor may have made since. Empty outside git; None when git cannot say."""
    from choir.evidence.git import is_oid, locate

    git = locate(repo)
    if git is None:
        return set()
    since = [] if before is None else \
        [r for r in (before.get("head"), *before.get("refs", ())) if isinstance(r, str)
         and is_oid(r)]
    now = ["--all", "--reflog", *(["HEAD"] if git.rev("HEAD") else [])]
    out = git.run("-c", "core.commitGraph=false", "rev-list", *now, "--not", *since)
    if out is None:
        return None if git.rev("HEAD") or since else set()  # no commit at all: none new
    return {c for c in out.decode("ascii", "replace").split() if is_oid(c)}


def _executor_commits(repo: Path, data: dict[str, Any]) -> set[str] | None:
    """Every commit an executor may have made: those the rounds recorded, and those made
    since each pending run began; None when git cannot say."""
    made = set(data.get("commits", ()))
    for run_id in data.get("pending", ()):
        since = _new_commits(repo, data.get("begun", {}).get(run_id))
        if since is None:
            return None
        made |= since
    return made


def _made_by_executor(repo: Path, rel: str, entry: tuple[str, str],
                      made: set[str] | None) -> str | None:
    """``"<short id> by <author>"`` when the newest commit in HEAD's history that changed
    ``rel`` may be an executor's (one of ``made``, or one whose checked bytes do not hold
    HEAD's ``entry``: git's walk trusts files an executor could have written); None when
    a person's commit brought it."""
    from choir.evidence.git import is_oid, locate

    git = locate(repo)
    if git is None:
        return None
    out = git.run("-c", "core.commitGraph=false", "--literal-pathspecs", "rev-list", "-1",
                  "HEAD", "--", rel)
    sha = (out or b"").decode("ascii", "replace").strip()
    if not is_oid(sha):
        return "a history git cannot walk"
    try:
        with git.objects() as reader:
            body = reader.read(sha, "commit")
            author = next((line[7:] for line in body.decode("utf-8", "replace").split("\n")
                           if line.startswith("author ")), "?").rsplit(" ", 2)[0]
            shown = f"commit {sha[:12]} by {author}"
            if made is None or sha in made:
                return shown
            held = reader.entry(reader.commit(sha)[0], rel)
    except Exception:  # noqa: BLE001 - an unreadable commit vouches for nothing
        return f"commit {sha[:12]}, unreadable"
    return None if held == entry else f"{shown}, not as git said"


def _touched(repo: Path, made: set[str]) -> set[str] | None:
    """The paths a commit of ``made`` changed against one of its parents (all the files of
    a commit with none), from checked objects, walking only the folders that differ; None
    when one of them cannot be read (its files are then not told from the others)."""
    from choir.evidence.git import locate

    git = locate(repo)
    if git is None:
        return set()
    if len(made) > _TOUCHED_MAX:  # a record from before the refs were kept: all since root
        return None
    paths: set[str] = set()
    try:
        with git.objects() as reader:
            for sha in sorted(made):
                tree, parents = reader.commit(sha)
                bases: list[str | None] = [reader.commit(p)[0] for p in parents]
                for base in bases or [None]:
                    paths.update(reader.changed(base, tree))
    except Exception:  # noqa: BLE001 - unreadable: every pinned file is walked
        return None
    return paths


def repos_above(item: Path) -> list[Path]:
    """The folders above ``item`` an executor has run in (a record names them): checked
    before the item is read, whatever its ``repo:`` now says (an executor could have
    pointed it elsewhere)."""
    here = item.resolve().parent
    return [p for p in (here, *here.parents) if _record_path(p).exists()]
