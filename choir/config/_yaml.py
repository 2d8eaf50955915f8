"""YAML loading that remembers where every value came from, so errors name file and line."""

from __future__ import annotations

import copy
import difflib
import errno
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from choir._core.canonical import blake3_hex
from choir.exceptions import ConfigError, UserError


@dataclass(frozen=True)
class YamlDoc:
    """A parsed YAML file: plain data plus the ruamel tree that knows line numbers."""

    path: Path
    data: Any
    _tree: Any

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """1-based line of the deepest node on ``loc`` that exists in the file."""
        node, line = self._tree, 1 if self._tree is not None else None
        for key in loc:
            lc = getattr(node, "lc", None)
            try:
                if isinstance(node, dict) and key in node:
                    if lc is not None:
                        line = lc.key(key)[0] + 1
                    node = node[key]
                elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
                    if lc is not None:
                        line = lc.item(key)[0] + 1
                    node = node[key]
                else:
                    break
            except (KeyError, IndexError, TypeError):
                break
        return line


MAX_BYTES = 1 << 20  # a choir.yaml or work item is a few KiB; 1 MiB is generous
MAX_BYTES_ENV = "CHOIR_CONFIG_MAX_BYTES"
MAX_ALIASES = 256  # aliases in one file
MAX_NODES = 100_000  # values after alias expansion: a 499-byte bomb expands to 10^9


def max_bytes() -> int:
    """The size cap for one configuration file (``CHOIR_CONFIG_MAX_BYTES`` overrides it)."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return MAX_BYTES
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= 1 << 40:
        raise UserError(f"{MAX_BYTES_ENV}={raw[:40]!r}: expected a whole number of bytes "
                        f"from 1 to {1 << 40}\n  fix: e.g. {MAX_BYTES_ENV}={MAX_BYTES}, or "
                        "unset it")  # it was ignored (abc, -1) or overflowed a read
    return int(raw)


def _open(path: Path, root: Path | None) -> int:
    """A read descriptor of the regular file ``path``: never a FIFO or a device (which
    would block or never end), and under ``root`` (a repo) no link followed on the way."""
    from choir._core import fsopen

    if root is not None:
        parts = fsopen.split(path.relative_to(root).as_posix())
        with fsopen.DirCursor(root) as cursor:
            return fsopen.open_regular(parts[-1], cursor.dir(parts[:-1]))[0]
    fd = os.open(path, fsopen.FILE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_pinned(path: Path, root: Path, pinned: str) -> None:
    """Refuse ``path`` (in ``root``) unless its bytes hash to ``pinned``; nothing parsed.

    Raises:
        ConfigError: it changed (or cannot be read as a regular file of ``root``).
    """
    _read_capped(path, root, pinned)


def _read_capped(path: Path, root: Path | None = None, pinned: str | None = None,
                 data: bytes | None = None) -> str:
    """The file's text, refused before parsing when it is larger than the cap, or (with
    ``pinned``) when the blake3 of its bytes is not that one: the bytes parsed are the bytes
    checked, so nothing can be swapped in between. ``data``: the bytes, read elsewhere (a
    commit's blob); the file is not opened."""
    cap = max_bytes()
    try:
        if data is not None:
            raw = data[:cap + 1]
        else:
            with os.fdopen(_open(path, root), "rb") as fh:
                raw = fh.read(cap + 1)
    except FileNotFoundError:
        raise ConfigError("file not found", path=str(path),
                          hint="check the path (it is relative to the current folder)") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and root is not None:
            raise ConfigError("is a symlink, or lies under one: Choir reads it only as a "
                              "regular file of the repo (a link could lead outside the tree "
                              "it verifies)", path=str(path),
                              hint="replace the link with the file itself") from None
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link as the file's last part
            raise ConfigError("is a symlink: Choir opens a configuration file without "
                              "following a link", path=str(path),
                              hint="replace the link with the file itself") from None
        if exc.errno == errno.EINVAL:
            raise ConfigError("not a regular file (a FIFO, a device or a folder)",
                              path=str(path), hint="make it a plain YAML file") from None
        raise ConfigError(f"cannot read file: {exc}", path=str(path),
                          hint="make the file readable") from None
    if len(raw) > cap:
        raise ConfigError(f"file is larger than {cap} bytes: refused before parsing",
                          path=str(path),
                          hint=f"shorten it (configuration is small), or raise {MAX_BYTES_ENV}")
    if pinned is not None and blake3_hex(raw) != pinned:
        raise ConfigError("changed since `choir mcp` started: it is not the one pinned then "
                          "(the allowlist and the mood policy are the person's)", path=str(path),
                          hint="restart `choir mcp` to accept the new configuration")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read file: not UTF-8 ({exc.reason} at byte {exc.start})",
                          path=str(path), hint="save the file as UTF-8") from None


def _counting(path: Path) -> Any:
    """A ruamel composer that refuses a file with more than ``MAX_ALIASES`` aliases as it
    meets them, in the one pass that builds the tree (a first pass over the parser's events
    only to count them cost half of every parse: 8-10 ms of a cold command's)."""
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.events import AliasEvent

    class Counting(Composer):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.parser.check_event(AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    mark = self.parser.peek_event().start_mark
                    raise ConfigError(
                        f"more than {MAX_ALIASES} YAML aliases (*name): refused as an alias "
                        "bomb", path=str(path), line=mark.line + 1 if mark else None,
                        hint="write the values out, or use fewer anchors and aliases")
            return super().compose_node(parent, index)

    return Counting


def _marking(path: Path) -> Any:
    """A ruamel constructor that turns a value it cannot build into a ConfigError at the
    value's line: an integer of more than 4300 digits (Python's limit on converting text to
    an int) or a date that is no date (``2024-13-45``) raises a bare ValueError, which was
    an internal error with a traceback (review 20, F3)."""
    from ruamel.yaml.constructor import RoundTripConstructor

    class Marking(RoundTripConstructor):
        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except ValueError as exc:
                mark = getattr(node, "start_mark", None)
                raise ConfigError(
                    f"invalid value: {_unreadable(exc)}", path=str(path),
                    line=mark.line + 1 if mark is not None else None,
                    hint="write a number of at most 64 bits or a real date, or quote the "
                         "value to keep it text") from None

    return Marking


def _unreadable(exc: ValueError) -> str:
    """Why a value could not be built, without Python's advice to raise its own limit
    (``sys.set_int_max_str_digits``), which is no fix for a file."""
    return str(exc).partition(";")[0][:160]


def load_yaml(path: Path, *, root: Path | None = None, pinned: str | None = None,
              data: bytes | None = None) -> YamlDoc:
    """Parse ``path``; a syntax error becomes a ConfigError naming the line.

    Hostile files cannot hurt the host: only a regular file is read (a FIFO would block), the
    size is capped before parsing, the alias count while parsing, and the expanded size while
    converting to plain data. With ``root`` (the repo ``path`` lies in), the file is opened
    from ``root`` one component at a time and no link on the way is followed. With
    ``pinned`` (a blake3 hex digest), bytes that do not hash to it are refused. ``data``:
    the file's bytes as read elsewhere (a commit's blob), under the same caps; ``path`` only
    names it.

    Raises:
        ConfigError: the file is missing, unreadable, too large, an alias bomb, not valid
            YAML, or holds a value YAML cannot build (the line given).
    """
    text = _read_capped(path, root, pinned, data)
    seen = _PARSED.get((str(path), text))
    if seen is not None:  # the same bytes parse to the same values: a copy of them
        return YamlDoc(path=path, data=copy.deepcopy(seen[0]), _tree=seen[1])
    doc = _parse(path, text)
    if len(text) <= _PARSED_MAX_CHARS:
        while len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[(str(path), text)] = (copy.deepcopy(doc.data), doc._tree)
    return doc


# What ``load_yaml`` parsed, by file name and text: a warm service's worker reads the same
# choir.yaml for every request, and ruamel's parse was its largest single cost before the
# step (14-20 ms of a request here). The key is the whole text, so edited bytes are parsed
# again; a parse that failed is not kept (its error is raised again, naming its line).
_PARSED: dict[tuple[str, str], tuple[Any, Any]] = {}
_PARSED_MAX = 16
_PARSED_MAX_CHARS = 1 << 16
AHEAD_S = 1.0  # ``parse_ahead``'s time: no file is begun after it


def parsed() -> list[str]:
    """The files whose parse this process keeps (``load_yaml``), oldest first."""
    return list(dict.fromkeys(path for path, _text in _PARSED))


def parse_ahead(paths: list[str]) -> None:
    """Parse ``paths`` now, for a later ``load_yaml`` of the same bytes: a warm service's
    idle worker, with the files its last requests read. Each is read again then, under its
    caller's checks (its repo, its pin), and only the same text finds this parse; a file
    that is gone or fails says nothing here (its caller hears it)."""
    import time

    end = time.monotonic() + AHEAD_S
    for path in paths[-_PARSED_MAX:]:
        if time.monotonic() > end:
            return
        try:  # one the memo would not keep is not parsed (an executor may have grown it:
            # ruamel took 32 s over 1 MiB of hostile YAML, with the next request waiting)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > _PARSED_MAX_CHARS:
                continue
            load_yaml(Path(path))
        except Exception:  # noqa: BLE001, S112 - its request reads it again and says why
            continue


def _parse(path: Path, text: str) -> YamlDoc:
    """``text`` parsed, under the alias and value caps (``load_yaml``)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    yaml = YAML(typ="rt")
    yaml.Composer = _counting(path)
    yaml.Constructor = _marking(path)
    try:
        tree = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(
            f"invalid YAML: {problem}",
            path=str(path),
            line=line,
            hint="check indentation and that every 'key: value' has a space after the colon",
        ) from None
    except RecursionError:
        raise ConfigError("YAML nested too deeply", path=str(path),
                          hint="flatten the structure (configuration is a few levels deep)"
                          ) from None
    except YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=str(path),
                          hint="check the YAML syntax near the start of the file") from None
    except ValueError as exc:  # a value no node could be blamed for (``_marking``)
        raise ConfigError(f"invalid value: {_unreadable(exc)}", path=str(path),
                          hint="quote the value to keep it text") from None
    budget = [MAX_NODES]
    try:
        data = _plain(tree, budget, ())
    except _TooLarge:
        raise ConfigError(
            f"YAML aliases expand to more than {MAX_NODES} values: refused as an alias bomb",
            path=str(path), line=1,
            hint="write the values out, or use fewer anchors and aliases") from None
    except _Unrecordable as exc:
        where = ".".join(str(k) for k in exc.loc) or "the document"
        raise ConfigError(f"{where!r}: {exc.what}, which no record Choir signs can hold",
                          path=str(path), line=YamlDoc(path, None, tree).line_of(exc.loc),
                          hint=exc.hint) from None
    return YamlDoc(path=path, data=data, _tree=tree)


class _TooLarge(Exception):
    pass


class _Unrecordable(Exception):
    """A value that validates but that the canonical JSON (and msgpack checkpoints) of what
    is signed refuses: found only after the work, as a crash (review 16c)."""

    def __init__(self, loc: tuple[str | int, ...], what: str, hint: str) -> None:
        super().__init__(what)
        self.loc, self.what, self.hint = loc, what, hint


INT_RANGE = (-(1 << 63), (1 << 63) - 1)  # what msgpack and the stores hold


def _plain(node: Any, budget: list[int], loc: tuple[str | int, ...]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge
    if isinstance(node, dict):
        return {str(k): _plain(v, budget, (*loc, str(k))) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v, budget, (*loc, n)) for n, v in enumerate(node)]
    if hasattr(node, "value") and type(node).__module__.startswith("ruamel"):
        return node.value  # pragma: no cover - scalar wrappers are rare in rt mode
    if isinstance(node, str) and not node.isascii():
        try:
            node.encode("utf-8")
        except UnicodeEncodeError:
            raise _Unrecordable(loc, "a lone surrogate (an escape like \\ud800)",
                                "write the character itself") \
                from None
    if isinstance(node, int) and not isinstance(node, bool) and \
            not INT_RANGE[0] <= node <= INT_RANGE[1]:
        raise _Unrecordable(loc, "an integer beyond 64 bits",
                            f"use a number between {INT_RANGE[0]} and {INT_RANGE[1]}")
    return node


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as ``tuple[M, ...]`` or ``M | None``."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_fields(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names valid at the parent of ``loc``, best effort, for "did you mean" hints."""
    current: Any = model
    annotation: Any = model
    for key in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if isinstance(key, str) and fields is not None and key in fields:
            annotation = fields[key].annotation
            current = _model_in(annotation)
        elif current is None or isinstance(key, int) or fields is None or key not in fields:
            # a list index or a dict key (e.g. a verifier name): step into the item type
            current = _model_in(annotation)
        if current is None:
            return []
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


def _quoted(expected: str) -> list[str]:
    return re.findall(r"'([^']*)'", expected)


def _error(doc: YamlDoc, model: type[BaseModel], err: Any, prefix: tuple[str, ...]
           ) -> ConfigError:
    """One pydantic error as a ConfigError with file, line and a fix."""
    loc = tuple(err["loc"])
    full = (*prefix, *loc)
    dotted = ".".join(str(p) for p in full) or "(top level)"
    ctx = err.get("ctx") or {}
    key = str(loc[-1]) if loc else "the value"
    if err["type"] == "extra_forbidden":
        allowed = _allowed_fields(model, loc)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        if close:
            hint = f"did you mean '{close[0]}'? allowed keys here: {', '.join(allowed)}"
        elif allowed:
            hint = f"remove it; allowed keys here: {', '.join(allowed)}"
        else:
            hint = "remove it"
        message = f"unknown key '{dotted}'"
    elif err["type"] == "missing":
        message = f"'{dotted}' is required"
        hint = f"add '{loc[-1]}:'"
    else:
        message = f"'{dotted}': {err['msg']}"
        if "expected" in ctx:
            names = _quoted(str(ctx["expected"]))
            close = difflib.get_close_matches(str(err.get("input")), names, n=1)
            hint = (f"did you mean '{close[0]}'? " if close else "") + \
                f"use one of {ctx['expected']}"
        else:
            bound = next(((word, ctx[k]) for k, word in (
                ("gt", "greater than"), ("ge", "at least"), ("lt", "less than"),
                ("le", "at most")) if k in ctx), None)
            if bound:
                hint = f"set '{key}' to a value {bound[0]} {bound[1]}"
            elif "min_length" in ctx or "max_length" in ctx:
                # a string's length in characters, a list's in items; no upper bound, no
                # "between 1 and any number" (review 17h)
                unit = "character" if str(err["type"]).startswith("string_") else "item"
                low, high = ctx.get("min_length"), ctx.get("max_length")
                hint = (f"give '{key}' at least {low} {unit}{'s' * (low != 1)}"
                        if high is None else f"give '{key}' at most {high} {unit}s"
                        if not low else f"give '{key}' {low} to {high} {unit}s")
            else:  # the message as pydantic says it, its first letter only lowered (a
                # pattern's letters are the pattern's: review 17h)
                msg = str(err["msg"])
                hint = f"set '{key}' to a valid value ({msg[:1].lower()}{msg[1:]})"
    return ConfigError(message, path=str(doc.path), line=doc.line_of(full), hint=hint)


def validation_errors(doc: YamlDoc, model: type[BaseModel], data: Any | None = None,
                      prefix: tuple[str, ...] = ()) -> tuple[Any, list[ConfigError]]:
    """``(model instance or None, every error found)``: a file's errors are all reported."""
    try:
        return model.model_validate(doc.data if data is None else data), []
    except ValidationError as exc:
        raw = exc.errors()
    typos = set()
    for err in raw:  # a misspelt key explains the "missing" one beside it: report the typo
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and loc:
            for close in difflib.get_close_matches(str(loc[-1]),
                                                   _allowed_fields(model, loc), n=1):
                typos.add((*loc[:-1], close))
    deeper = {tuple(err["loc"])[:n] for err in raw for n in range(len(err["loc"]))}
    return None, [_error(doc, model, err, prefix) for err in raw
                  if not (err["type"] == "missing" and tuple(err["loc"]) in typos)
                  # pydantic adds "too short" to a list whose bad item it dropped
                  and not (err["type"] == "too_short" and tuple(err["loc"]) in deeper)]


def validate(
    doc: YamlDoc, model: type[BaseModel], data: Any | None = None, prefix: tuple[str, ...] = ()
) -> Any:
    """Validate ``data`` (default: the whole document, else the node at ``prefix``) into
    ``model``; every error becomes a ConfigError with its line and a fix.

    Raises:
        ConfigError: the validation errors (one, or all of them as ConfigErrors).
    """
    value, errors = validation_errors(doc, model, data, prefix)
    ConfigError.raise_all(errors)
    return value
