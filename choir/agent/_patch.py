"""Unified diffs in pure Python: parse, then apply to text in memory.

Only the shapes ``git diff`` and ``diff -u`` write are accepted (one or many files, new,
deleted and renamed files, ``\\ No newline at end of file``). A hunk must match the file
exactly (fuzz 0); only its position may move, as GNU patch's offset search allows. No I/O
happens here, so ``RepoFiles.apply_patch`` can check every hunk of every file before it
touches the disk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from choir.exceptions import ToolInputError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_MODE = re.compile(r"^(?:new file mode|new mode) ([0-7]{6})$")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_SHOWN = 120
# lines compared (and offsets tried) placing one patch's hunks: about a second of CPU at most
_SEARCH_BUDGET = 10_000_000


def split_lines(text: str) -> list[str]:
    """Lines with their ``\\n`` kept; only ``\\n`` ends a line (``\\r`` stays content)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass
class Hunk:
    """One ``@@`` block: the lines it expects (``old``) and what replaces them (``new``)."""

    header: str
    old_start: int
    new_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    added: int = 0
    removed: int = 0


@dataclass
class FilePatch:
    """The change to one file; a ``None`` path is ``/dev/null`` (created or deleted)."""

    old_path: str | None
    new_path: str | None
    git: bool
    hunks: list[Hunk] = field(default_factory=list)
    new_mode: int | None = None
    deleted: bool = False
    created: bool = False

    @property
    def label(self) -> str:
        return self.new_path or self.old_path or "?"


def _unquote(raw: str) -> str:
    """A path as git writes it: C-quoted when it holds unusual bytes."""
    if not (len(raw) >= 2 and raw.startswith('"') and raw.endswith('"')):
        return raw
    out, i, body = bytearray(), 0, raw[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and re.match(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
        out.extend(ch.encode())
        i += 1
    return out.decode("utf-8", errors="replace")


def _header_path(raw: str) -> str | None:
    """The path of a ``---``/``+++`` line, without a timestamp; ``None`` for /dev/null."""
    raw = raw.rstrip("\r")
    path = _unquote(raw) if raw.startswith('"') else raw.split("\t", 1)[0].rstrip()
    return None if path == "/dev/null" else path


def _strip(path: str | None, prefix: str) -> str | None:
    return path[len(prefix) :] if path is not None and path.startswith(prefix) else path


def _git_paths(rest: str) -> tuple[str | None, str | None]:
    """``diff --git a/X b/Y``: best effort, the ``---``/``+++`` lines win when present."""
    if rest.startswith('"'):
        end = rest.find('" ', 1)
        if end > 0:
            return _unquote(rest[: end + 1]), _unquote(rest[end + 2 :])
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[2:half] == rest[half + 3 :]:
        return rest[:half], rest[half + 1 :]
    return None, None


def parse_patch(text: str) -> list[FilePatch]:
    """Every file change in ``text``, in order.

    Raises:
        ToolInputError: the text is not a unified diff, a hunk's line counts do not match
            its header, or the diff is binary.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the end of the last line, not an empty context line
    patches: list[FilePatch] = []
    cur: FilePatch | None = None
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r") if not lines[i].startswith(("+", "-", " ")) else lines[i]
        if line.startswith("diff --git "):
            old, new = _git_paths(line[len("diff --git ") :])
            cur = FilePatch(_strip(old, "a/"), _strip(new, "b/"), git=True)
            patches.append(cur)
        elif cur is not None and cur.git and not cur.hunks and _git_extended(cur, line):
            pass
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _header_path(line[4:]), _header_path(lines[i + 1][4:])
            if cur is None or not cur.git or cur.hunks:
                cur = FilePatch(old, new, git=False)
                patches.append(cur)
            if cur.git or (old or "a/").startswith("a/") and (new or "b/").startswith("b/"):
                old, new = _strip(old, "a/"), _strip(new, "b/")
            cur.old_path, cur.new_path = old, new
            cur.created, cur.deleted = cur.created or old is None, cur.deleted or new is None
            i += 1
        elif line.startswith("@@"):
            if cur is None:
                raise ToolInputError(f"line {i + 1}: a hunk with no ---/+++ file header before it")
            i = _parse_hunk(lines, i, cur)
        elif cur is not None and cur.hunks and line[:1] in ("+", "-", " ") and line != "-- ":
            raise ToolInputError(
                f"{cur.label}: line {i + 1} ({_clip(line)}) comes after hunk "
                f"#{len(cur.hunks)} ended; fix the counts in its @@ header"
            )
        elif line.startswith("Binary files ") or line == "GIT binary patch":
            raise ToolInputError(
                f"line {i + 1}: binary diffs are not supported; use write_file for that file"
            )
        i += 1
    if not patches:
        raise ToolInputError(
            "no file changes found: expected a unified diff with "
            "'--- a/PATH', '+++ b/PATH' and '@@ -l,n +l,n @@' lines"
        )
    return patches


def _git_extended(cur: FilePatch, line: str) -> bool:
    """Apply one git extended header line to ``cur``; False when it is not one."""
    mode = _MODE.match(line)
    if mode:
        cur.new_mode = int(mode.group(1), 8)
        cur.created = cur.created or line.startswith("new file")
        if cur.created:
            cur.old_path = None
        return True
    if line.startswith("deleted file mode "):
        cur.deleted, cur.new_path = True, None
        return True
    for key, attr in (("rename from ", "old_path"), ("rename to ", "new_path")):
        if line.startswith(key):
            setattr(cur, attr, _unquote(line[len(key) :]))
            return True
    if line.startswith(("copy from ", "copy to ")):
        raise ToolInputError(
            f"{cur.label}: copy patches are not supported; use write_file to create the copy"
        )
    return line.startswith(("old mode ", "index ", "similarity index ", "dissimilarity index "))


def _parse_hunk(lines: list[str], i: int, cur: FilePatch) -> int:
    """Read the hunk starting at ``lines[i]``; return the index of its last line."""
    header = lines[i].rstrip("\r")
    match = _HUNK.match(header)
    number = len(cur.hunks) + 1
    where = f"{cur.label}: hunk #{number} ({_clip(header)})"
    if not match:
        raise ToolInputError(
            f"{where}: bad hunk header; expected '@@ -START,COUNT +START,COUNT @@'"
        )
    old_left = 1 if match.group(2) is None else int(match.group(2))
    new_left = 1 if match.group(4) is None else int(match.group(4))
    hunk = Hunk(header, int(match.group(1)), int(match.group(3)))
    last = ""
    while old_left > 0 or new_left > 0 or (i + 1 < len(lines) and lines[i + 1][:1] == "\\"):
        i += 1
        if i >= len(lines):
            raise ToolInputError(
                f"{where}: the patch ends early; the header promises "
                f"{old_left} more old and {new_left} more new line(s)"
            )
        text = lines[i]
        tag, body = (text[:1], text[1:]) if text else (" ", "")
        if tag == "\\":
            if last in (" ", "-"):
                hunk.old[-1] = hunk.old[-1].removesuffix("\n")
            if last in (" ", "+"):
                hunk.new[-1] = hunk.new[-1].removesuffix("\n")
            continue
        if tag not in (" ", "-", "+"):
            raise ToolInputError(
                f"{where}: line {i + 1} ({_clip(text)}) is not context, "
                f"'-' or '+'; the header promises {old_left} more old and "
                f"{new_left} more new line(s)"
            )
        if tag in (" ", "-"):
            hunk.old.append(body + "\n")
            old_left -= 1
        if tag in (" ", "+"):
            hunk.new.append(body + "\n")
            new_left -= 1
        hunk.added += tag == "+"
        hunk.removed += tag == "-"
        if old_left < 0 or new_left < 0:
            raise ToolInputError(f"{where}: more lines than the header's counts")
        last = tag
    cur.hunks.append(hunk)
    return i


@dataclass
class FileState:
    """One file's bytes before and after a change (``None``: absent) and its permissions."""

    key: str
    before: bytes | None
    data: bytes | None
    mode: int | None
    executable: bool | None = None


def plan_patch(
    text: str,
    *,
    exists: Callable[[str], bool],
    key_of: Callable[[str], str],
    load: Callable[[str], tuple[bytes | None, int | None]],
) -> tuple[list[FileState], list[str]]:
    """What ``text`` does to each file, checked in memory, and a report line per change.

    Args:
        text: the unified diff.
        exists: whether a path (as the patch names it) exists.
        key_of: a patch path to its checked, writable key (raises ToolInputError).
        load: a key to the file's current bytes and permission bits, (None, None) if absent.

    Raises:
        ToolInputError: a path is refused, a hunk does not apply, a created file exists, a
            changed file is missing, or a deletion leaves lines behind.
    """
    state: dict[str, FileState] = {}

    def get(key: str) -> FileState:
        if key not in state:
            before, mode = load(key)
            state[key] = FileState(key, before, before, mode)
        return state[key]

    report: list[str] = []
    notes: list[str] = []
    budget = _Budget()
    for fp in parse_patch(text):
        old, new = resolve_names(fp, exists)
        if old is None and new is None:
            raise ToolInputError("a file header in the patch names no file (both /dev/null?)")
        src = key_of(old) if old else None
        dst = key_of(new) if new else None
        if src is None and dst is not None and get(dst).data is not None:
            raise ToolInputError(
                f"{dst}: the patch creates it but it exists; patch it as a change instead"
            )
        result, moved = apply_hunks(
            fp.label, "" if src is None else _text(get(src)), fp.hunks, budget=budget
        )
        notes += moved
        plus, minus = sum(h.added for h in fp.hunks), sum(h.removed for h in fp.hunks)
        if dst is None:
            if src is None or result:
                raise ToolInputError(
                    f"{src}: the patch deletes the file but does not remove all of its lines"
                )
            get(src).data = None
            report.append(f"D {src} (-{minus})")
            continue
        if src is not None and src != dst:
            if get(dst).data is not None:
                raise ToolInputError(f"{dst}: the patch renames {src} onto an existing file")
            get(dst).mode, get(src).data = get(src).mode, None
            report.append(f"R {src} -> {dst} (+{plus} -{minus})")
        else:
            report.append(f"{'A' if src is None else 'M'} {dst} (+{plus} -{minus})")
        get(dst).data = result.encode("utf-8")
        if fp.new_mode is not None:
            get(dst).executable = bool(fp.new_mode & 0o111)
    changes = [c for c in state.values() if c.data != c.before or c.executable is not None]
    return changes, [f"applied: {len(report)} file change(s)", *report, *notes]


def _text(state: FileState) -> str:
    if state.data is None:
        raise ToolInputError(
            f"no such file: {state.key} (to create a file, write its old name as /dev/null)"
        )
    try:
        return state.data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolInputError(f"{state.key} is not UTF-8 text; use write_file") from None


def resolve_names(fp: FilePatch, exists: Callable[[str], bool]) -> tuple[str | None, str | None]:
    """The (read, write) paths of a patch; for plain ``diff -u`` output, an existing name wins.

    ``diff -u calc.py.orig calc.py`` names two files but patches one, as GNU patch reads it;
    ``diff -ru old new`` prefixes both with a folder, which is dropped when that finds the file.
    """
    if fp.git or fp.created or fp.deleted:
        return fp.old_path, fp.new_path
    names = [n for n in (fp.new_path, fp.old_path) if n]
    names += [n.split("/", 1)[1] for n in names if "/" in n]  # diff -ruN old/ new/: -p1
    for name in names:
        if exists(name):
            return name, name
    return fp.old_path, fp.new_path


@dataclass
class _Budget:
    """The comparisons a patch may still spend finding where its hunks go (shared by all
    its files, so many files cannot multiply the bound)."""

    left: int = _SEARCH_BUDGET


def apply_hunks(
    label: str,
    text: str,
    hunks: list[Hunk],
    max_offset: int = 10_000,
    budget: _Budget | None = None,
) -> tuple[str, list[str]]:
    """``text`` with every hunk applied, and a note for each hunk that moved.

    Raises:
        ToolInputError: a hunk's context or removed lines are not in the file, naming the
            file, the hunk and the first line that differs; or finding the hunks took more
            than ``budget`` line comparisons.
    """
    budget = _Budget() if budget is None else budget
    lines = split_lines(text)
    out: list[str] = []
    pos, shift = 0, 0
    notes: list[str] = []
    for number, hunk in enumerate(hunks, 1):
        nominal = hunk.old_start - 1 if hunk.old else hunk.old_start
        at = _find(lines, hunk.old, nominal + shift, pos, max_offset, budget)
        if budget.left < 0:
            raise ToolInputError(
                f"{label}: finding where hunk #{number} goes took too long (over "
                f"{_SEARCH_BUDGET:,} line comparisons for the patch); send smaller hunks "
                "whose line numbers match the file"
            )
        if at is None:
            raise ToolInputError(_mismatch(label, number, hunk, lines, nominal + shift))
        if at != nominal + shift:
            notes.append(
                f"{label}: hunk #{number} applied at line {at + 1} (offset {at - nominal:+d} lines)"
            )
        shift = at - nominal
        out.extend(lines[pos:at])
        out.extend(hunk.new)
        pos = at + len(hunk.old)
    out.extend(lines[pos:])
    return "".join(out), notes


def _find(
    lines: list[str], old: list[str], want: int, lo: int, max_offset: int, budget: _Budget
) -> int | None:
    """The start nearest ``want`` (not before ``lo``) where ``old`` matches exactly.

    Slicing ``old``'s length at every offset let a 400,000-line hunk over a file of empty
    lines cost 36 s of CPU (review 20b): an offset is now tried on the first and last lines
    first, and the lines compared and offsets passed over are charged to ``budget``; ``None``
    with ``budget.left < 0`` says the search stopped there.
    """
    hi = len(lines) - len(old)
    if not old:
        return want if lo <= want <= len(lines) else None
    first, last, size = old[0], old[-1], len(old)
    start = max(0, lo - want, want - hi)  # the offsets before reach no line: skip them
    for delta in range(start, max_offset + 1):
        for at in (want - delta, want + delta) if delta else (want,):
            if lo <= at <= hi and lines[at] == first and lines[at + size - 1] == last:
                budget.left -= size
                if budget.left < 0:
                    return None
                if lines[at : at + size] == old:
                    budget.left -= delta - start
                    return at
        if want - delta < lo and want + delta > hi:
            break
    return None


def _mismatch(label: str, number: int, hunk: Hunk, lines: list[str], want: int) -> str:
    text = (
        f"{label}: hunk #{number} ({_clip(hunk.header)}) does not apply: its context and "
        f"'-' lines are not in the file (searched around line {want + 1})"
    )
    for k, expected in enumerate(hunk.old):
        actual = lines[want + k] if 0 <= want + k < len(lines) else None
        if actual != expected:
            found = "end of file" if actual is None else repr(_clip(actual))
            text += (
                f"; at line {want + k + 1} the hunk expects {_clip(expected)!r} "
                f"but the file has {found}"
            )
            break
    return text + ". Read the file again and rebuild the hunk from its current text."


def _clip(text: str) -> str:
    text = text.removesuffix("\n")
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
