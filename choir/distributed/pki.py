"""Choir's own certificate authority for its Dask cluster: who may talk to it, who ran what.

Dask's own traffic has no authentication: whoever reaches the scheduler submits code that
the workers run, and a worker that runs it can seal a forged PASS whose every hash matches.
So the cluster speaks TLS only, with certificates from a CA Choir makes per ``CHOIR_HOME``,
and both ends of every connection must show one (Dask's TLS contexts require the peer's
certificate, checked against this CA alone: no system roots).

Files, all under ``CHOIR_SCHEDULER_CERTS`` (default ``$CHOIR_HOME/dask``; directory 0700,
keys 0600, created without following links): ``ca.pem``/``ca.key``, then
``ROLE/NAME.pem``/``.key`` for each certificate issued. The role (``scheduler``, ``worker``,
``client``) is the subject's organisational unit and the name its common name. Keys are
ECDSA P-256.

A worker also signs what it returns with its certificate's key, so a result names the worker
that made it and the coordinator checks that name against this CA (``identify``) instead of
believing the scheduler or the worker's own word.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import re
import secrets
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from choir._core.paths import choir_home
from choir.exceptions import IntegrityError, UserError

if TYPE_CHECKING:
    from distributed.security import Security

Role = Literal["scheduler", "worker", "client"]
ROLES: tuple[Role, ...] = ("scheduler", "worker", "client")
DIRNAME = "dask"
CERTS_ENV = "CHOIR_SCHEDULER_CERTS"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_LEAF_DAYS = 397
_CA_DAYS = 3650
_SIGNED = ec.ECDSA(hashes.SHA256())


@dataclass(frozen=True)
class CertFiles:
    """One certificate and its key, as the ``--tls-cert``/``--tls-key`` of a Dask command."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Identity:
    """Who a certificate names: its role, name and the sha256 of its DER bytes."""

    role: str
    name: str
    fingerprint: str


def _fingerprint(cert: x509.Certificate) -> str:
    return "sha256:" + cert.fingerprint(hashes.SHA256()).hex()


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` (never through a link, never over a file) readable by the owner only."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise IntegrityError(f"{path} exists already (a link, or a leftover of an earlier "
                             "attempt): remove it, then issue the certificate again") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _private_dir(path: Path) -> Path:
    """``path`` as a directory of the owner's alone (created 0700; refused when looser)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UserError(f"{path} must be a directory owned by this user (not a link)")
    if info.st_mode & 0o077:
        raise UserError(f"{path} is open to other users (mode {info.st_mode & 0o777:o}); "
                        f"run: chmod 700 {path}")
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_mode & 0o077:
            raise UserError(f"{path} is readable by other users; run: chmod 600 {path}")
        key = serialization.load_pem_private_key(fh.read(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise IntegrityError(f"{path} is not an ECDSA key")
    return key


class ClusterPKI:
    """The CA in ``directory`` (``ClusterPKI.configured()``: ``CHOIR_SCHEDULER_CERTS``, else
    ``$CHOIR_HOME/dask``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def configured(cls) -> ClusterPKI:
        chosen = os.environ.get(CERTS_ENV)
        return cls(Path(chosen).expanduser() if chosen else choir_home() / DIRNAME)

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    def exists(self) -> bool:
        return self.ca_file.is_file()

    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        return (x509.load_pem_x509_certificate(self.ca_file.read_bytes()),
                _load_key(self.directory / "ca.key"))

    def ensure(self) -> ClusterPKI:
        """Make the CA when there is none (safe when several processes race: a lock)."""
        _private_dir(self.directory)
        lock = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(lock, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            if not self.exists():
                key = ec.generate_private_key(ec.SECP256R1())
                name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Choir"),
                                  x509.NameAttribute(NameOID.COMMON_NAME,
                                                     f"Choir cluster CA {secrets.token_hex(4)}")])
                now = datetime.datetime.now(datetime.UTC)
                cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                        .public_key(key.public_key()).serial_number(x509.random_serial_number())
                        .not_valid_before(now - datetime.timedelta(minutes=5))
                        .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
                        .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
                        .add_extension(x509.KeyUsage(False, False, False, False, False, True,
                                                     True, False, False), True)
                        .sign(key, hashes.SHA256()))
                _write_private(self.directory / "ca.key", _pem_key(key))
                _write_private(self.ca_file, cert.public_bytes(serialization.Encoding.PEM))
        return self

    def files(self, role: Role, name: str, out: Path | None = None) -> CertFiles:
        base = _private_dir(out or self.directory / role)
        return CertFiles(base / f"{name}.pem", base / f"{name}.key")

    def issue(self, role: Role, name: str, out: Path | None = None) -> CertFiles:
        """The certificate of ``name`` in ``role``, made (signed by the CA) unless it exists.

        Raises:
            UserError: an unknown role or a name that is not ``[A-Za-z0-9._-]``.
        """
        if role not in ROLES or not _NAME.match(name):
            raise UserError(f"cannot issue a {role!r} certificate named {name!r}: the role is "
                            f"one of {', '.join(ROLES)}, the name letters, digits, '.', '_', '-'")
        self.ensure()
        files = self.files(role, name, out)
        if files.cert.exists():
            return files
        ca_cert, ca_key = self._ca()
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Choir"),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), False)
                .sign(ca_key, hashes.SHA256()))
        _write_private(files.key, _pem_key(key))
        _write_private(files.cert, cert.public_bytes(serialization.Encoding.PEM))
        return files

    def client_security(self, name: str = "coordinator") -> Security:
        """Dask ``Security`` for Choir's client: this CA only, TLS 1.3, encryption required.

        Raises:
            UserError: there is no CA here yet (the cluster was not set up from this home).
        """
        from distributed.security import Security

        if not self.exists():
            raise UserError(f"no cluster certificates in {self.directory}: set the cluster up "
                            "with `python -m choir.distributed.pki init` (see "
                            "docs/distributed.md)")
        files = self.issue("client", name)
        return Security(  # type: ignore[no-untyped-call]
            require_encryption=True, tls_ca_file=str(self.ca_file),
            tls_client_cert=str(files.cert), tls_client_key=str(files.key),
            tls_min_version=ssl.TLSVersion.TLSv1_3)

    def identify(self, cert_pem: bytes, role: Role) -> Identity:
        """Who ``cert_pem`` names, once it is shown to be this CA's, valid now, of ``role``.

        Raises:
            IntegrityError: not a certificate, not signed by this CA, expired, or another role.
        """
        ca_cert, _ = self._ca()
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
            cert.verify_directly_issued_by(ca_cert)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise IntegrityError(f"a {role} certificate not issued by this cluster's CA "
                                 f"({self.ca_file}): {exc}") from None
        now = datetime.datetime.now(datetime.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise IntegrityError(f"the {role} certificate of {_cn(cert)!r} is not valid now")
        units = [a.value for a in cert.subject.get_attributes_for_oid(
            NameOID.ORGANIZATIONAL_UNIT_NAME)]
        if units != [role]:
            raise IntegrityError(f"the certificate of {_cn(cert)!r} is not a {role}'s "
                                 f"(its role: {units})")
        return Identity(role=role, name=_cn(cert), fingerprint=_fingerprint(cert))

    def verify_signed(self, cert_pem: bytes, signature: bytes, data: bytes,
                      role: Role) -> Identity:
        """``identify``, and check that its key signed ``data``.

        Raises:
            IntegrityError: see ``identify``, or the signature does not match.
        """
        identity = self.identify(cert_pem, role)
        public = x509.load_pem_x509_certificate(cert_pem).public_key()
        try:
            if not isinstance(public, ec.EllipticCurvePublicKey):
                raise InvalidSignature
            public.verify(signature, data, _SIGNED)
        except InvalidSignature:
            raise IntegrityError(f"the {role} {identity.name!r} did not sign what it "
                                 "returned") from None
        return identity


def _cn(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def peer_subject(comm: object, field: str) -> str | None:
    """One field of the subject of the certificate the peer of a Dask ``comm`` showed (TLS
    only; None without one, or when the field is missing or repeated)."""
    cert = (getattr(comm, "extra_info", None) or {}).get("peercert") or {}
    values = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == field]
    return values[0] if len(values) == 1 else None


def peer_role(comm: object) -> str | None:
    """The role (the subject's OU) in the certificate the peer of ``comm`` showed."""
    return peer_subject(comm, "organizationalUnitName")


def sign_as(files: CertFiles, data: bytes) -> tuple[bytes, bytes]:
    """``(certificate PEM, signature of data)`` with the key of ``files`` (a worker's)."""
    return files.cert.read_bytes(), _load_key(files.key).sign(data, _SIGNED)


def identity_of(cert_pem: bytes) -> tuple[str, str]:
    """``(common name, fingerprint)`` of a certificate, unchecked (what it claims)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return _cn(cert), _fingerprint(cert)


def main(argv: list[str] | None = None) -> int:
    """``python -m choir.distributed.pki init | issue ROLE NAME [--out DIR]``: make the CA
    (and the scheduler's and this coordinator's certificates), or one more certificate, e.g.
    a worker's to copy to its machine with ``ca.pem``. Prints the files made."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m choir.distributed.pki")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="the CA, the scheduler's and the client's certificates")
    issue = sub.add_parser("issue", help="one certificate signed by the CA")
    issue.add_argument("role", choices=ROLES)
    issue.add_argument("name")
    issue.add_argument("--out", type=Path, help="folder for it (default: under the CA's)")
    args = parser.parse_args(argv)
    pki = ClusterPKI.configured().ensure()
    try:
        made = ([pki.issue("scheduler", "scheduler"), pki.issue("client", "coordinator")]
                if args.command == "init" else [pki.issue(args.role, args.name, args.out)])
    except (UserError, IntegrityError) as exc:
        print(f"error: {exc}")
        return 2
    print(f"CA: {pki.ca_file}")
    for files in made:
        print(f"{files.cert}\n{files.key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
