"""Where the API server is and how to prove who we are: a kubeconfig file (`--kubeconfig
PATH`) or the pod's in-cluster service account. Both end as one `KubeConfig`, whose TLS
context and bearer token the client uses as they are.

Embedded certificates and keys (`*-data`) are decoded here; Python's `ssl` loads a client
key only from a file, so `ssl_context()` writes them to a private temporary folder for the
one call and removes it (the official client does the same).
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# client-go re-reads a token file once a minute: bound service-account tokens rotate (the
# kubelet refreshes them at 80 % of their hour), so a token read once at start would expire.
TOKEN_REREAD_S = 60.0


class KubeConfigError(ValueError):
    """A configuration that cannot be used: where it came from, and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Credential:
    """PEM bytes, or the file they live in (read when a TLS context is made)."""

    data: bytes | None = None
    path: Path | None = None

    def read(self) -> bytes | None:
        if self.data is not None:
            return self.data
        return self.path.read_bytes() if self.path is not None else None


@dataclass(slots=True)
class TokenSource:
    """A bearer token, given or read from a file that may be rotated under us."""

    token: str | None = None
    path: Path | None = None
    _read_at: float = field(default=-1e18, repr=False)

    def get(self, now: float | None = None) -> str | None:
        if self.path is None:
            return self.token
        now = time.monotonic() if now is None else now
        if self.token is None or now - self._read_at >= TOKEN_REREAD_S:
            try:
                self.token = self.path.read_text(encoding="utf-8").strip()
            except OSError as e:
                if self.token is None:
                    raise KubeConfigError(str(self.path), f"cannot read token: {e}") from None
                # Keep the last token: the kubelet replaces the file by rename, and a
                # read between its steps fails once.
            self._read_at = now
        return self.token


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """One API server and one identity."""

    server: str  # https://host:port, no trailing slash
    ca: Credential | None = None  # None: the system's trust store
    client_cert: Credential | None = None
    client_key: Credential | None = None
    token: TokenSource | None = None
    insecure_skip_tls_verify: bool = False
    namespace: str = "default"  # the context's (or the service account's) namespace
    where: str = ""  # the file or folder it came from, for messages

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the cluster's CA (or the system's), and our certificate."""
        if self.ca is not None and not self.insecure_skip_tls_verify:
            # The cluster's CA alone, as kubectl: not the system's roots as well.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        else:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca is not None:
            ca = self.ca.read()
            assert ca is not None
            try:
                context.load_verify_locations(cadata=ca.decode("ascii"))
            except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
                raise KubeConfigError(self.where, f"bad certificate authority: {e}") from None
        if self.client_cert is not None and self.client_key is not None:
            cert, key = self.client_cert.read(), self.client_key.read()
            assert cert is not None and key is not None
            with tempfile.TemporaryDirectory(prefix="railyard-kube-") as folder:
                cert_path, key_path = Path(folder, "tls.crt"), Path(folder, "tls.key")
                for path, pem in ((cert_path, cert), (key_path, key)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(pem)
                try:
                    context.load_cert_chain(cert_path, key_path)
                except ssl.SSLError as e:
                    raise KubeConfigError(self.where,
                                          f"bad client certificate or key: {e}") from None
        return context


# ---------------------------------------------------------------------------- kubeconfig


def load_kubeconfig(path: Path | str, context: str | None = None) -> KubeConfig:
    """The current (or named) context of a kubeconfig file. File references in it are
    relative to the file's folder, as kubectl reads them."""
    path = Path(path)
    where = str(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise KubeConfigError(where, f"cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise KubeConfigError(where, f"not YAML: {e}") from None
    if not isinstance(document, dict):
        raise KubeConfigError(where, "expected a kubeconfig object")
    name = context or document.get("current-context")
    if not name:
        raise KubeConfigError(where, "no context named and no current-context")
    ctx = _named(document, "contexts", "context", name, where)
    cluster = _named(document, "clusters", "cluster", _str(ctx, "cluster", where), where)
    user_name = ctx.get("user")
    user = _named(document, "users", "user", user_name, where) if user_name else {}
    base = path.resolve().parent

    server = _str(cluster, "server", where).rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(where, f"cluster server {server!r} is not an http(s) URL")
    token: TokenSource | None = None
    if user.get("token"):
        token = TokenSource(token=_str(user, "token", where))
    elif user.get("tokenFile"):
        token = TokenSource(path=base / _str(user, "tokenFile", where))
    for unsupported in ("exec", "auth-provider", "username"):
        if user.get(unsupported):
            raise KubeConfigError(where, f"user {user_name!r}: {unsupported!r} credentials "
                                         "are not supported (use a certificate or a token)")
    cert = _credential(user, "client-certificate", base, where)
    key = _credential(user, "client-key", base, where)
    if (cert is None) != (key is None):
        raise KubeConfigError(where, f"user {user_name!r}: a client certificate needs its key")
    return KubeConfig(
        server=server,
        ca=_credential(cluster, "certificate-authority", base, where),
        client_cert=cert,
        client_key=key,
        token=token,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        namespace=str(ctx.get("namespace") or "default"),
        where=where,
    )


def _named(document: Mapping[str, Any], section: str, inner: str, name: Any,
           where: str) -> Mapping[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(inner) or {}
            if not isinstance(value, dict):
                raise KubeConfigError(where, f"{section}[{name}].{inner}: expected an object")
            return value
    raise KubeConfigError(where, f"no {inner} named {name!r} in {section}")


def _str(section: Mapping[str, Any], key: str, where: str) -> str:
    value = section.get(key)
    if not isinstance(value, str) or not value:
        raise KubeConfigError(where, f"{key}: expected a non-empty string")
    return value


def _credential(section: Mapping[str, Any], key: str, base: Path,
                where: str) -> Credential | None:
    """`<key>-data` (base64 PEM) or `<key>` (a file path); the data wins, as in kubectl."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return Credential(data=base64.b64decode(str(data), validate=True))
        except (binascii.Error, ValueError):
            raise KubeConfigError(where, f"{key}-data: not base64") from None
    file = section.get(key)
    if file:
        return Credential(path=base / str(file))
    return None


# ---------------------------------------------------------------------------- in cluster


def load_in_cluster(folder: Path = SERVICE_ACCOUNT_DIR,
                    environ: Mapping[str, str] | None = None) -> KubeConfig:
    """The pod's own service account: KUBERNETES_SERVICE_HOST/PORT, and `token`, `ca.crt`
    and `namespace` from the folder the kubelet mounts."""
    environ = os.environ if environ is None else environ
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("environment", "not in a cluster: KUBERNETES_SERVICE_HOST and "
                                             "KUBERNETES_SERVICE_PORT must both be set")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    token_path, ca_path = folder / "token", folder / "ca.crt"
    for needed in (token_path, ca_path):
        if not needed.is_file():
            raise KubeConfigError(str(needed), "missing (is a service account mounted?)")
    token = TokenSource(path=token_path)
    token.get()  # fail now, not at the first request
    try:
        namespace = (folder / "namespace").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        namespace = "default"
    return KubeConfig(server=f"https://{host}:{port}", ca=Credential(path=ca_path),
                      token=token, namespace=namespace, where=str(folder))


def load(kubeconfig: Path | str | None, context: str | None = None) -> KubeConfig:
    """`--kubeconfig PATH` when given, else the in-cluster service account: the one rule
    every service follows."""
    if kubeconfig:
        return load_kubeconfig(kubeconfig, context)
    return load_in_cluster()
