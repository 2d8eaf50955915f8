"""The ``llm`` executor's file tools, confined to one repository.

The model names paths; every one is checked twice: lexically (relative, no ``..``, no NUL)
and on disk (its real path must stay under the root). The file is then reached by walking
from the root one component at a time with ``O_NOFOLLOW``, so a symlink swapped in after the
check is refused rather than followed. Writes never enter ``.git`` (or another VCS folder),
never touch devices or fifos, and replace files atomically (temp file + ``os.replace``).
Every reply is bounded text and says what it left out.
"""

from __future__ import annotations

import codecs
import os
import re
import secrets
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, BinaryIO

from choir._core import fsopen
from choir._core.globs import glob_match
from choir.agent._patch import FileState, plan_patch
from choir.exceptions import ToolInputError

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", "CVS", ".jj", ".pijul"})
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SNIFF = 8192
_MAX_PATH = 4096
_MAX_PATTERN = 1000
_MAX_SHOWN = 300
_MAX_DEPTH = 64
_SEARCH_FILE_BYTES = 4_000_000
_SEARCH_SECONDS = 20.0
_MAX_UNROLLED = 10_000


class _Missing(ToolInputError):
    """A path that does not exist (yet): for a write, that is fine."""


def _clip(text: str, limit: int = _MAX_SHOWN) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more chars]"


def _lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _line_count(fd: int, deadline: float) -> tuple[int, bool]:
    """The file's lines, and whether all were counted: counting stops at ``deadline`` (a
    file of gigabytes would hold the executor past its time), after one read at least."""
    os.lseek(fd, 0, os.SEEK_SET)
    count, last = 0, b"\n"
    while chunk := os.read(fd, 1 << 20):
        count, last = count + chunk.count(b"\n"), chunk[-1:]
        if time.monotonic() > deadline and len(chunk) == 1 << 20:
            return count, False
    return count + (last != b"\n"), True


def _require_regular(st: os.stat_result, shown: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ToolInputError(f"{shown} is a directory; use list_files to see inside it")
    if stat.S_ISLNK(st.st_mode):
        raise ToolInputError(f"{shown} is a symlink that changed while it was opened; refused")
    if not stat.S_ISREG(st.st_mode):
        raise ToolInputError(f"{shown} is a device, fifo or socket; only regular files are allowed")


class RepoFiles:
    """Read, search and edit the files of one repository, and nothing outside it.

    Args:
        root: the repository; symlinks in it are resolved once, here.
        max_read_bytes: the most text one ``read_file`` reply holds.
        max_write_bytes: the largest file ``write_file``/``apply_patch`` may produce.
        max_results: the most paths or hits one ``list_files``/``search`` reply holds.
        protected: paths from the root (files, or folders with all they hold) that may be
            read but never written (Choir's llm executor protects ``choir.yaml`` and the
            repo's ``.venv``: what verifies its work is not its to edit).
        hidden: paths from the root (their real location) that are neither listed, read,
            searched nor written, through a link or otherwise: Choir's own stores when they
            lie in the repo (its home, the artifact store, held-out checks), which a
            sandboxed executor has masked.
        deadline: a ``time.monotonic()`` time past which no search or listing goes on (the
            caller's own timeout, e.g. the executor's); ``None`` leaves each its own bound.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_read_bytes: int = 64_000,
        max_write_bytes: int = 1_000_000,
        max_results: int = 200,
        protected: tuple[str, ...] = (),
        hidden: tuple[str, ...] = (),
        deadline: float | None = None,
    ) -> None:
        real = os.path.realpath(root)
        if not os.path.isdir(real):
            raise NotADirectoryError(f"repository root {root} is not a directory")
        self.root = Path(real)
        self.max_read_bytes = max_read_bytes
        self.max_write_bytes = max_write_bytes
        self.max_results = max_results
        self.protected = frozenset(protected)
        self.hidden = tuple(hidden)
        self.deadline = deadline
        self._stopped = threading.Event()
        self._writing = threading.Lock()
        self._prefix = real.rstrip(os.sep) + os.sep
        self._changed: dict[str, None] = {}

    # -- tools ---------------------------------------------------------------------------

    def list_files(self, path: str = ".", pattern: str = "*") -> str:
        """List the files under a directory of the repository, recursively and sorted.

        Version-control folders such as .git are skipped.

        Args:
            path: directory relative to the repository root; "." is the whole repository.
            pattern: shell-style glob on the file name, e.g. "*.py"; a pattern with "/" is
                matched against the path from the repository root, e.g. "src/*/test_*.py",
                where "*" and "?" stay within one folder and "**" spans any depth.
        """
        if len(pattern) > _MAX_PATTERN or "\x00" in pattern:
            raise ToolInputError(f"pattern is longer than {_MAX_PATTERN} characters or has NUL")
        glob = _path_glob(pattern) if "/" in pattern else None
        shown: list[str] = []
        notes: list[str] = []
        found = 0
        own, deadline = self._deadline()
        try:
            for rel, _, kind in self._walk(self._real(path), notes, deadline):
                if kind == "other" or not (glob(rel) if glob
                                           else fnmatchcase(rel.rsplit("/", 1)[-1], pattern)):
                    continue
                found += 1
                if len(shown) < self.max_results:
                    shown.append(rel + (" (symlink)" if kind == "link" else ""))
        except TimeoutError:
            # a tree of very many files ran one call past the executor's timeout (review 21)
            notes.append(f"\n[listing stopped {self._why(own, deadline)}: incomplete; "
                         "narrow path or pattern]")
        if not shown:
            return f"no files match {pattern!r} under {self._clean(path) or '.'}" + "".join(notes)
        if found > len(shown):
            shown.append(f"... {found - len(shown)} more files not shown; narrow path or pattern")
        return "\n".join(shown) + "".join(notes)

    def read_file(self, path: str, start_line: int = 1, max_lines: int = 400) -> str:
        """Read a UTF-8 text file of the repository, with line numbers.

        A long file comes in pieces: the reply then ends with the start_line that reads on.

        Args:
            path: file path relative to the repository root, e.g. "src/app.py".
            start_line: the first line to show, counting from 1.
            max_lines: the most lines to show; the reply is also capped in bytes.
        """
        if start_line < 1 or max_lines < 1:
            raise ToolInputError("start_line and max_lines must be 1 or more")
        shown = self._clean(path)
        own, deadline = self._deadline()
        with self._open_regular(self._real(path), shown) as (fd, st):
            with open(fd, "rb", closefd=False) as fh:
                out, number, cut = self._numbered(fh, shown, st.st_size, start_line, max_lines,
                                                  deadline)
            total, counted = _line_count(fd, deadline)
        total = max(total, number)
        if total == 0 and counted:
            return f"{shown} is empty (0 bytes)"
        stopped = f"the count stopped {self._why(own, deadline)}"
        if not out:
            if counted:
                raise ToolInputError(
                    f"{shown} has {total} lines; start_line {start_line} is past its end")
            raise ToolInputError(
                f"{shown}: only {total} lines were counted ({stopped}); start_line "
                f"{start_line} is past them: try a smaller start_line")
        header = f"{shown} (lines {start_line}-{number} of {total})" if counted else \
            f"{shown} (lines {start_line}-{number} of at least {total}; {stopped})"
        if number < total or not counted:
            why = cut or f"max_lines={max_lines}"
            rest = f"lines {number + 1}-{total}" if counted else f"lines from {number + 1}"
            out.append(
                f"[truncated by {why}: {rest} not shown; call "
                f"read_file(path={shown!r}, start_line={number + 1}) to read on]"
            )
        return header + "\n" + "\n".join(out)

    def _numbered(
        self, fh: BinaryIO, shown: str, size: int, start_line: int, max_lines: int,
        deadline: float,
    ) -> tuple[list[str], int, str]:
        """Numbered lines from ``start_line``, the last line number shown, and why it cut
        (lines before ``start_line`` are skipped only until ``deadline``)."""
        head = fh.read(_SNIFF)
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < _SNIFF)
            if b"\x00" in head:
                raise UnicodeError
        except UnicodeError:
            raise ToolInputError(
                f"{shown} is binary or not UTF-8 text ({size} bytes); it cannot be read as text"
            ) from None
        fh.seek(0)
        out: list[str] = []
        used, number = 0, 0
        while len(out) < max_lines:
            raw = fh.readline(self.max_read_bytes + 1)
            if not raw:
                break
            while len(raw) > self.max_read_bytes and not raw.endswith(b"\n"):
                more = fh.readline(1 << 20)  # the rest of a huge line: skipped, not kept
                if not more or more.endswith(b"\n"):
                    break
            number += 1
            if number < start_line:
                if not number % 65536 and time.monotonic() > deadline:
                    return out, number, ""
                continue
            text = raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
            used += len(raw) + 8
            if used > self.max_read_bytes:
                if out:
                    return out, number - 1, f"the reply limit of {self.max_read_bytes} bytes"
                text = f"{text[: self.max_read_bytes]}... [line {number} is cut here]"
            out.append(f"{number:>6}\t{text}")
        return out, number, ""

    def search(self, pattern: str, path: str = ".") -> str:
        """Search the repository's text files for a regular expression, line by line.

        Args:
            pattern: a Python regular expression, e.g. "def add\\(" or "TODO|FIXME".
            path: a file or directory relative to the repository root; "." searches all.
        """
        matches = _matcher(pattern)
        hits: list[str] = []
        omitted_files: set[str] = set()
        notes: list[str] = []
        omitted = large = 0
        own, deadline = self._deadline()
        where = ""
        try:
            for rel, data in self._text_files(self._real(path), notes, deadline):
                if data is None:
                    large += 1
                    continue
                where = f" at {rel}"
                for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
                    # every line: 999,000 lines of 0.1 ms each, checked per file, ran 92 s
                    # past a 40 s executor timeout (review 21d)
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stopped.is_set():
                        raise TimeoutError
                    if matches(line, left):
                        if len(hits) < self.max_results:
                            hits.append(f"{rel}:{number}: {_clip(line.rstrip(chr(13)))}")
                        else:
                            omitted += 1
                            omitted_files.add(rel)
                where = ""  # the walk's own check stops between files
        except TimeoutError:
            if where:
                where += f":{number}"
            notes.append(f"\n[search stopped {self._why(own, deadline)}{where}: incomplete; "
                         "simplify the pattern or narrow the path]")
        if omitted:
            hits.append(
                f"[{omitted} more matches in {len(omitted_files)} files not shown; "
                "narrow the pattern or path]"
            )
        if large:
            notes.append(f"\n[{large} files over {_SEARCH_FILE_BYTES} bytes were not searched]")
        body = "\n".join(hits) or f"no matches for {pattern!r} under {self._clean(path) or '.'}"
        return body + "".join(notes)

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file with exactly the given text (UTF-8).

        Parent directories are created. For a small change to a big file, apply_patch is
        cheaper and safer.

        Args:
            path: file path relative to the repository root, e.g. "src/app.py".
            content: the complete new content of the file.
        """
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolInputError(f"content is not encodable as UTF-8: {exc}") from None
        if len(data) > self.max_write_bytes:
            raise ToolInputError(
                f"content is {len(data)} bytes; the limit is {self.max_write_bytes}"
            )
        parts = self._writable(path)
        key = "/".join(parts)
        before, mode = self._current(parts, key)
        if before == data:
            return f"{key} unchanged ({len(data)} bytes, {_lines(data)} lines)"
        self._commit([FileState(key, before, data, mode)])
        if before is None:
            return f"created {key}: {len(data)} bytes, {_lines(data)} lines"
        return (
            f"wrote {key}: {len(before)} -> {len(data)} bytes, "
            f"{_lines(before)} -> {_lines(data)} lines"
        )

    def apply_patch(self, patch: str) -> str:
        """Apply a unified diff (as git diff or diff -u print it) to one or more files.

        All or nothing: if any hunk does not match, no file changes. Hunks may have moved
        by some lines, but their context and "-" lines must match the file exactly.

        Args:
            patch: the diff text: "--- a/PATH" and "+++ b/PATH" headers ("/dev/null" to
                create or delete a file), then "@@ -START,COUNT +START,COUNT @@" hunks.
        """
        if len(patch) > self.max_write_bytes:
            raise ToolInputError(
                f"patch is {len(patch)} characters; the limit is {self.max_write_bytes}"
            )
        changes, report = plan_patch(
            patch,
            exists=self._exists,
            key_of=lambda p: "/".join(self._writable(p)),
            load=lambda key: self._current(key.split("/"), key),
        )
        for change in changes:
            if change.data is not None and len(change.data) > self.max_write_bytes:
                raise ToolInputError(
                    f"{change.key} would be {len(change.data)} bytes; the "
                    f"limit is {self.max_write_bytes}"
                )
        self._commit(changes)
        return "\n".join(report)

    def stop(self) -> None:
        """End this instance's work: a search still running stops at its next line, and no
        write starts; returns once a write under way is done.

        A caller that timed out leaves a tool's thread behind (it cannot be killed); after
        ``stop`` that thread only reads, and the tree it leaves is the tree it stays.
        """
        self._stopped.set()
        with self._writing:
            pass

    def changed_files(self) -> list[str]:
        """Paths (from the root) this instance created, changed or deleted, first-touched
        first."""
        return list(self._changed)

    def _deadline(self) -> tuple[float, float]:
        """A tool's own bound, and the time it stops: that bound or the caller's, sooner."""
        own = time.monotonic() + _SEARCH_SECONDS
        return own, own if self.deadline is None else min(own, self.deadline)

    def _why(self, own: float, deadline: float) -> str:
        return (f"after {_SEARCH_SECONDS:g} s" if deadline == own and not self._stopped.is_set()
                else "when the executor's time ran out")

    # -- paths ---------------------------------------------------------------------------

    def _clean(self, path: str) -> str:
        """The lexical check; the relative path as ``a/b`` (``""`` is the root)."""
        if not isinstance(path, str) or "\x00" in path or len(path) > _MAX_PATH:
            raise ToolInputError("a path must be a string under 4096 characters, without NUL")
        if path.startswith(("/", "\\", "~")):
            raise ToolInputError(
                f"{_clip(path)!r} is absolute; give a path relative to the repository root"
            )
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ToolInputError(
                f"{_clip(path)!r} uses '..'; paths must stay inside the repository"
            )
        return "/".join(parts)

    def _real(self, path: str) -> list[str]:
        """The components of the real location, which must be under the root."""
        real = os.path.realpath(os.path.join(self.root, self._clean(path)))
        if real == str(self.root):
            return []
        if not real.startswith(self._prefix):
            raise ToolInputError(
                f"{_clip(path)!r} leads outside the repository through a symlink; refused"
            )
        rel = real[len(self._prefix) :]
        if self._is_hidden(rel.replace(os.sep, "/")):
            raise ToolInputError(f"{_clip(path)!r} is Choir's own (its home, its artifact "
                                 "store or a held-out check): not the executor's to see")
        return rel.split(os.sep)

    def _is_hidden(self, rel: str) -> bool:
        return any(rel == h or rel.startswith(h + "/") for h in self.hidden)

    def _writable(self, path: str) -> list[str]:
        """The real components of a path that may be written (never in .git and the like)."""
        parts = self._real(path)
        if not parts:
            raise ToolInputError("the repository root itself cannot be written")
        vcs = VCS_DIRS & {*parts, *self._clean(path).split("/")}
        if vcs:
            raise ToolInputError(
                f"{_clip(path)!r} is inside a version-control folder "
                f"({', '.join(sorted(vcs))}); refused"
            )
        joined = "/".join(parts)
        if any(joined == p or joined.startswith(p + "/") for p in self.protected):
            raise ToolInputError(f"{joined} is protected (the verifier allowlist, the "
                                 "verifiers' interpreter, a pinned check or work item, or "
                                 "another path the caller guards): it may not be changed; "
                                 "refused")
        return parts

    def _exists(self, path: str) -> bool:
        try:
            return os.path.lexists(os.path.join(self.root, *self._real(path)))
        except ToolInputError:
            return False

    @contextmanager
    def _dir(self, parts: list[str], created: list[tuple[int, str]] | None = None) -> Iterator[int]:
        """A descriptor of the directory ``parts``, reached without following any symlink.

        With ``created``, missing directories are made and recorded there (for rollback).
        """
        fd = os.open(self.root, _DIR)
        try:
            for k, name in enumerate(parts):
                try:
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if created is None:
                        raise _Missing(
                            f"no such file or directory: {'/'.join(parts[: k + 1])}"
                        ) from None
                    os.mkdir(name, dir_fd=fd)
                    created.append((os.dup(fd), name))
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except OSError as exc:
                    raise ToolInputError(
                        f"{'/'.join(parts[: k + 1])} is not a directory or "
                        f"changed while opened ({exc.strerror})"
                    ) from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _open_regular(self, parts: list[str], shown: str) -> Iterator[tuple[int, os.stat_result]]:
        if not parts:
            raise ToolInputError("the repository root is a directory; use list_files")
        with self._dir(parts[:-1]) as dfd:
            try:
                _require_regular(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False), shown)
                fd = os.open(parts[-1], _FILE, dir_fd=dfd)
            except FileNotFoundError:
                raise _Missing(f"no such file: {shown}") from None
            except OSError as exc:
                raise ToolInputError(f"{shown} cannot be opened ({exc.strerror})") from None
            try:
                st = os.fstat(fd)
                _require_regular(st, shown)
                yield fd, st
            finally:
                os.close(fd)

    # -- walking -------------------------------------------------------------------------

    def _walk(
        self, parts: list[str], notes: list[str], deadline: float
    ) -> Iterator[tuple[str, Callable[[], int], str]]:
        """``(path, opener, kind)`` of every entry under ``parts``; kind: file, link, other.

        Raises:
            TimeoutError: past ``deadline`` (``time.monotonic()``) or after ``stop``, read at
                every entry: a walk over many files or empty folders is as long as the repo.
        """
        if parts:
            with self._dir(parts[:-1]) as dfd:
                try:
                    st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    raise ToolInputError(f"no such file or directory: {'/'.join(parts)}") from None
                if not stat.S_ISDIR(st.st_mode):
                    kind = "file" if stat.S_ISREG(st.st_mode) else "other"
                    yield "/".join(parts), _opener(dfd, parts[-1]), kind
                    return
        with self._dir(parts) as top:
            yield from self._walk_fd(top, "/".join(parts) + "/" if parts else "", 0, notes,
                                     deadline)

    def _walk_fd(
        self, dfd: int, prefix: str, depth: int, notes: list[str], deadline: float
    ) -> Iterator[tuple[str, Callable[[], int], str]]:
        with os.scandir(dfd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if time.monotonic() >= deadline or self._stopped.is_set():
                raise TimeoutError
            rel = prefix + entry.name
            if self._is_hidden(rel):
                continue
            if entry.is_dir(follow_symlinks=False):
                if entry.name in VCS_DIRS:
                    continue
                if depth >= _MAX_DEPTH:
                    notes.append(f"\n[{rel}: deeper than {_MAX_DEPTH} levels, not listed]")
                    continue
                try:
                    sub = os.open(entry.name, _DIR, dir_fd=dfd)
                except OSError as exc:  # said, never passed over in silence (review 21)
                    if exc.errno not in fsopen.GONE:
                        notes.append(f"\n[{rel}: cannot be opened ({exc.strerror}), not listed]")
                    continue
                try:
                    yield from self._walk_fd(sub, rel + "/", depth + 1, notes, deadline)
                finally:
                    os.close(sub)
            elif entry.is_symlink():
                yield rel, _opener(dfd, entry.name), "link"
            else:
                kind = "file" if entry.is_file(follow_symlinks=False) else "other"
                yield rel, _opener(dfd, entry.name), kind

    def _text_files(self, parts: list[str], notes: list[str],
                    deadline: float) -> Iterator[tuple[str, bytes | None]]:
        """Regular text files under ``parts``: their bytes, or None when too large."""
        for rel, opener, kind in self._walk(parts, notes, deadline):
            if kind != "file":
                continue
            try:
                fd = opener()
            except OSError:
                continue
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                if st.st_size > _SEARCH_FILE_BYTES:
                    yield rel, None
                    continue
                data = fh.read(_SEARCH_FILE_BYTES)
            if b"\x00" not in data[:_SNIFF]:
                yield rel, data

    # -- writing -------------------------------------------------------------------------

    def _current(self, parts: list[str], key: str) -> tuple[bytes | None, int | None]:
        """The file's bytes and permission bits now, or (None, None) when absent."""
        try:
            with self._open_regular(parts, key) as (fd, st):
                if st.st_size > 4 * self.max_write_bytes:
                    raise ToolInputError(f"{key} is {st.st_size} bytes, too large to edit here")
                with os.fdopen(os.dup(fd), "rb") as fh:
                    return fh.read(), stat.S_IMODE(st.st_mode)
        except _Missing:
            return None, None

    def _commit(self, changes: list[FileState]) -> None:
        """Make ``changes`` and record them, unless ``stop`` was called (see there)."""
        with self._writing:
            if self._stopped.is_set():
                raise ToolInputError("the executor's time ran out; nothing was written")
            self._swap_in(changes)
            self._changed.update(dict.fromkeys(c.key for c in changes))

    def _swap_in(self, changes: list[FileState]) -> None:
        """Stage every change as a temp file, then swap them in; on any error undo all."""
        with ExitStack() as stack:
            created: list[tuple[int, str]] = []
            stack.callback(lambda: list(map(os.close, (fd for fd, _ in created))))
            staged: list[tuple[FileState, int, str | None]] = []
            done: list[tuple[FileState, int]] = []
            try:
                for change in changes:
                    dfd = stack.enter_context(self._dir(change.key.split("/")[:-1], created))
                    tmp = None if change.data is None else _stage(dfd, change)
                    staged.append((change, dfd, tmp))
                for change, dfd, tmp in staged:
                    name = change.key.rsplit("/", 1)[-1]
                    if tmp is None:
                        if change.before is not None:
                            os.unlink(name, dir_fd=dfd)
                    else:
                        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    done.append((change, dfd))
            except BaseException:
                for change, dfd in reversed(done):
                    _undo(dfd, change)
                for _, dfd, tmp in staged[len(done) :]:
                    if tmp is not None:
                        os.unlink(tmp, dir_fd=dfd)
                for fd, name in reversed(created):
                    try:
                        os.rmdir(name, dir_fd=fd)
                    except OSError:
                        pass
                raise


def _path_glob(pattern: str) -> Callable[[str], bool]:
    """A shell glob over a path: ``*``/``?``/``[...]`` never match ``/``; ``**/`` is any depth.

    ``fnmatch`` lets ``*`` cross ``/``, so ``src/*/test_*.py`` would list files at every
    depth; the agent must see what it asked for. Matched without backtracking: the model
    writes the pattern, and ``re`` took 73 s on ``*a*a*a*a*a/`` (review 20b).
    """
    try:
        return glob_match(pattern)
    except re.error as exc:
        raise ToolInputError(f"invalid pattern {pattern!r}: {exc}") from None


def _matcher(pattern: str) -> Callable[[str, float], bool]:
    """``(line, seconds_left) -> matched``; bounded in time when ``regex`` is installed.

    ``re`` cannot be interrupted, so a catastrophic pattern would hang the agent; ``regex``
    (a dependency of litellm's tokenizer, hence present wherever the llm executor runs)
    accepts a per-match timeout and raises TimeoutError. ``seconds_left`` must be positive.
    """
    if len(pattern) > _MAX_PATTERN:
        raise ToolInputError(f"pattern is longer than {_MAX_PATTERN} characters")
    _check_unrolled(pattern)
    try:
        import regex
    except ImportError:
        regex = None
    try:
        if regex is not None:
            compiled = regex.compile(pattern)
            return lambda line, left: compiled.search(line, timeout=left) is not None
        plain = re.compile(pattern)
    except Exception as exc:  # re.error, regex.error, RecursionError, OverflowError
        raise ToolInputError(f"invalid regular expression {pattern!r}: {exc}") from None
    return lambda line, left: plain.search(line) is not None


def _check_unrolled(pattern: str) -> None:
    """Refuse a pattern whose counted repeats, multiplied through their nesting, spell out
    more than ``_MAX_UNROLLED`` items.

    ``regex`` unrolls ``{m,n}`` when it compiles, in one C call nothing interrupts: the 29
    characters ``(?:(?:(?:a{50}){50}){50}){50}`` took 12 s and 1.8 GB (review 21d); 10,000
    items take about 10 ms. The size is read from Python's own parse of the pattern (the
    tool takes Python regular expressions, which ``regex`` reads alike), each repeat counted
    at its upper bound (at its lower one when it has none: ``*`` and ``+`` are not unrolled).
    """
    from re import _parser  # type: ignore[attr-defined]  # re's parser: no public API

    def size(items: Iterable[tuple[Any, Any]]) -> int:
        total = 0
        for op, av in items:
            if op in (_parser.MAX_REPEAT, _parser.MIN_REPEAT, _parser.POSSESSIVE_REPEAT):
                low, high, body = av
                total += max(low if high == _parser.MAXREPEAT else high, 1) * size(body)
            else:  # a group, branch, lookaround...: itself and what it holds
                total += 1 + sum(size(sub) for sub in _subpatterns(av, _parser.SubPattern))
        return total

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # re's FutureWarning on "[[" (a set to come)
            unrolled = size(_parser.parse(pattern))
    except Exception as exc:  # re.error, RecursionError, OverflowError
        raise ToolInputError(f"invalid regular expression {pattern!r}: {exc}") from None
    if unrolled > _MAX_UNROLLED:
        raise ToolInputError(
            f"pattern {_clip(pattern)!r} repeats too much: its {{m,n}} counts, multiplied "
            f"through their nesting, make {unrolled} items; the limit is {_MAX_UNROLLED}. "
            "Use * or + for a long run, or fewer nested counts"
        )


def _subpatterns(value: Any, kind: type) -> Iterator[Any]:
    """The parsed subpatterns in a node's arguments (tuples and lists of them, at any depth)."""
    if isinstance(value, kind):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _subpatterns(item, kind)


def _opener(dfd: int, name: str) -> Callable[[], int]:
    return lambda: os.open(name, _FILE, dir_fd=dfd)


def _stage(dfd: int, change: FileState) -> str:
    """Write ``change.data`` to a fresh temp file beside its target; return the temp name."""
    assert change.data is not None
    tmp = f".choir-{secrets.token_hex(6)}.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd
    )
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(change.data)
            mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
            if change.mode is not None:
                mode = change.mode
            if change.executable is True:
                mode |= (mode & 0o444) >> 2
            elif change.executable is False:
                mode &= ~0o111
            os.fchmod(fh.fileno(), mode)
    except BaseException:
        os.unlink(tmp, dir_fd=dfd)
        raise
    return tmp


def _undo(dfd: int, change: FileState) -> None:
    """Put back what a committed change replaced (best effort, during a rollback)."""
    name = change.key.rsplit("/", 1)[-1]
    if change.before is None:
        os.unlink(name, dir_fd=dfd)
        return
    tmp = _stage(dfd, FileState(change.key, None, change.before, change.mode))
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
