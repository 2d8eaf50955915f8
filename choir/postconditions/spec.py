"""Postcondition verifiers in ``choir.yaml``, turned into ordinary allowlisted verifiers.

A callable verifier (``callable: verifiers/x.py`` or ``module:function``) and the two
scaffolds (``read_after_write:``, ``invariant_check:``) become a ``VerifierSpec`` of kind
``postcondition`` with one step: the stdlib-only harness (``_harness.py``) run by the
project's interpreter inside the configured sandbox. So a postcondition goes through the
very path a command verifier does: sandbox, artifacts, report, attestation, AHDB. What it
checks (the spec) and the harness source travel in the step's environment, which
``verifier_config_hash`` covers, so the attestation binds the exact code and targets.
"""

from __future__ import annotations

import json
import shlex
import urllib.parse
from importlib import resources as _resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from choir.exceptions import ConfigError
from choir.models._base import Frozen

METHODS = ("callable", "read_after_write", "invariant_check")
DEFAULT_VERIFY_TIMEOUT_MS = 5000
GRACE_S = 2.0  # the harness's own start and teardown on top of verify_timeout_ms
BACKSTOP_S = 10.0
_PORTS = {"http": 80, "https": 443, "postgres": 5432, "postgresql": 5432}
_REF = r"^([A-Za-z_][\w.]*:[A-Za-z_]\w*|[\w./-]+\.py(:[A-Za-z_]\w*)?)$"


class Resource(Frozen):
    """A system a postcondition may read: exactly one of a SQLite file, a Postgres DSN or
    an HTTP base URL. Nothing else is reachable through the scaffolds (an allowlist)."""

    sqlite: str | None = None
    postgres: str | None = None
    http: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Resource:
        given = [k for k in ("sqlite", "postgres", "http") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("a resource is exactly one of 'sqlite: PATH', 'postgres: DSN' "
                             "or 'http: BASE_URL'")
        if self.http and urllib.parse.urlsplit(self.http).scheme not in ("http", "https"):
            raise ValueError("'http:' must be an http:// or https:// base URL")
        return self

    def host(self) -> str | None:
        """The endpoint this resource needs (``hosts:``: the only one its checks may reach,
        recorded in the attestation), if any; the scheme's port when the URL names none."""
        url = self.http or self.postgres
        if not url:
            return None
        parts = urllib.parse.urlsplit(url)
        if not parts.hostname:
            return None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return f"{host}:{parts.port or _PORTS.get(parts.scheme, 443)}"

    def for_harness(self, repo: Path) -> dict[str, Any]:
        if self.sqlite:
            path = Path(self.sqlite).expanduser()
            return {"kind": "sqlite", "path": str(path if path.is_absolute() else repo / path)}
        if self.postgres:
            return {"kind": "postgres", "dsn": self.postgres}
        return {"kind": "http", "base_url": self.http}


class _Check(Frozen):
    resource: str | None = None
    sql: str | None = Field(default=None, min_length=1)
    path: str | None = Field(default=None, min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    verify_timeout_ms: int | None = Field(default=None, gt=0, le=3_600_000)


class ReadAfterWrite(_Check):
    """Re-read the target: ``sql`` (first column of the first row) or ``path`` (GET; the
    status, or ``field`` of a JSON body) must show ``expect`` (or the action's
    ``expect_from`` value) within ``verify_timeout_ms``."""

    field: str | None = None
    expect: Any = None
    expect_from: str | None = None


class InvariantCheck(_Check):
    """A boolean over system state: ``sql`` returning a truthy value, ``path`` answering
    ``status``, or a ``callable`` returning True."""

    status: int | None = Field(default=None, ge=100, le=599)
    callable: str | None = Field(default=None, pattern=_REF)


class PostconditionSpec(Frozen):
    """One postcondition verifier as ``choir.yaml`` declares it."""

    callable: str | None = Field(default=None, pattern=_REF)
    read_after_write: ReadAfterWrite | None = None
    invariant_check: InvariantCheck | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    network: bool = False
    hosts: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    kind: Literal["postcondition"] = "postcondition"

    def method(self) -> str:
        given = [m for m in METHODS if getattr(self, m) is not None]
        return given[0] if len(given) == 1 else ""


def is_postcondition(raw: Any) -> bool:
    return isinstance(raw, dict) and any(key in raw for key in METHODS)


def harness_source() -> str:
    return (_resources.files("choir.postconditions") / "_harness.py").read_text("utf-8")


def _error(doc: Any, loc: tuple[str | int, ...], message: str, hint: str) -> ConfigError:
    return ConfigError(message, path=str(doc.path), line=doc.line_of(loc), hint=hint)


def expand(doc: Any, name: str, raw: dict[str, Any], resources: dict[str, Resource],
           decision_ms: int | None = None) -> dict[str, Any]:
    """The ``VerifierSpec`` fields of postcondition verifier ``name``.

    ``decision_ms``: the smallest ``verify_timeout_ms`` of the decisions naming it, the
    budget when the verifier sets none of its own.

    Raises:
        ConfigError: several or no methods, an unknown resource, a check with neither
            ``sql`` nor ``path`` (or one that does not fit its resource), a verifier file
            that does not exist, or network use without ``hosts`` (file and line given).
    """
    from choir.config._yaml import validation_errors

    loc = ("verifiers", name)
    spec, errors = validation_errors(doc, PostconditionSpec, raw, prefix=loc)
    ConfigError.raise_all(errors)
    assert spec is not None
    method = spec.method()
    if not method:
        raise _error(doc, loc, f"verifier '{name}' names several postcondition methods",
                     "give exactly one of: callable, read_after_write, invariant_check")
    repo = Path(doc.path).parent
    payload: dict[str, Any] = {"name": name, "method": method}
    hosts = list(spec.hosts)
    check = getattr(spec, method)
    ref = spec.callable if method == "callable" else getattr(check, "callable", None)
    if ref is not None:
        file = ref.partition(":")[0] if ref.split(":")[0].endswith(".py") else None
        if file is not None and not (repo / file).is_file():
            raise _error(doc, (*loc, method) if method == "callable" else
                         (*loc, method, "callable"),
                         f"verifier '{name}': {file} does not exist in the repo",
                         "put the file under verifiers/ with a 'verify(context)' function, "
                         "or name an installed 'module:function'")
        payload["callable"] = ref
        payload["resources"] = {n: r.for_harness(repo) for n, r in sorted(resources.items())}
    verify_ms = decision_ms or DEFAULT_VERIFY_TIMEOUT_MS
    if method != "callable":
        assert isinstance(check, ReadAfterWrite | InvariantCheck)
        verify_ms = check.verify_timeout_ms or verify_ms
        payload.update(check.model_dump(mode="json", exclude_none=True))
        payload["verify_timeout_ms"] = verify_ms
        if ref is None:
            payload.update(_resource(doc, name, method, check, resources, repo, hosts))
    if (spec.network or hosts) and not spec.hosts and method == "callable":
        raise _error(doc, (*loc, "network"),
                     f"verifier '{name}' needs the network but names no host",
                     "add 'hosts: [HOST]': every host a postcondition talks to is recorded "
                     "in its attestation")
    payload["hosts"] = sorted(set(hosts))
    payload["timeout_s"] = spec.timeout_s or (verify_ms / 1000 + GRACE_S
                                              if method != "callable" or decision_ms
                                              else 30.0)
    from choir.postconditions._harness import ARGV, START_S

    words = [f"postcondition={name}", f"method={method}"]
    command = shlex.join(("python3", *ARGV)) + " " + " ".join(words)
    return {
        "kind": "postcondition",
        "steps": [{"name": "postcondition", "command": command}],
        "parser": "postcondition",
        # the host's backstop: the harness stops itself first (its child's start allowed
        # START_S on top); a sandbox that is slow to start (a container under load) must not
        # turn a verdict into a host timeout
        "timeout_s": START_S + payload["timeout_s"] + BACKSTOP_S,
        "network": bool(payload["hosts"]) or spec.network,
        "hosts": payload["hosts"],  # enforced by the sandbox's egress proxy, attested
        "env": {**spec.env, "CHOIR_PC_SPEC": json.dumps(payload, sort_keys=True),
                "CHOIR_PC_HARNESS": harness_source()},
    }


def _resource(doc: Any, name: str, method: str, check: ReadAfterWrite | InvariantCheck,
              resources: dict[str, Resource], repo: Path,
              hosts: list[str]) -> dict[str, Any]:
    loc = ("verifiers", name, method)
    if check.resource is None or check.resource not in resources:
        known = ", ".join(sorted(resources)) or "none declared"
        raise _error(doc, (*loc, "resource") if check.resource else loc,
                     f"verifier '{name}': unknown resource '{check.resource}'"
                     if check.resource else f"verifier '{name}': {method} names no resource",
                     f"declare it under 'resources:' (known: {known})")
    resource = resources[check.resource]
    if resource.http:
        ok = check.path is not None and check.sql is None
        need = "'path:' (a GET under the base URL)"
    else:
        ok = check.sql is not None and check.path is None
        need = "'sql:' (a query; named :params come from the action)"
    if isinstance(check, InvariantCheck) and check.status is not None and not resource.http:
        ok = False
    if not ok:
        raise _error(doc, loc, f"verifier '{name}': {method} against resource "
                               f"'{check.resource}' needs {need}", f"give {need}")
    if isinstance(check, ReadAfterWrite) and check.expect is None and check.expect_from is None:
        raise _error(doc, loc, f"verifier '{name}': read_after_write needs the value to see",
                     "add 'expect: VALUE' or 'expect_from: ACTION_KEY'")
    host = resource.host()
    if host:
        hosts.append(host)
    return {"resource": resource.for_harness(repo), "resource_name": check.resource}


def resource_binds(resources: dict[str, Resource], repo: Path) -> dict[str, str]:
    """Folders of SQLite resources by resource name, bound read-only so the sandbox can read
    them (each still to be checked with ``check_bind``: the folder may be a planted link)."""
    out = {}
    for name, res in resources.items():
        if res.sqlite:
            # inside the repo too: verifiers see a snapshot of the tree, not the live file
            out[name] = str(Path(res.for_harness(repo)["path"]).parent.absolute())
    return out
