"""Who may call the extender: TLS for its port, a client certificate kube-scheduler presents,
and the bearer token its admin call (`DELETE /pods/<uid>`, cluster-file mode) needs.

All opt-in, so `railyard scheduler --cluster-file F --listen 127.0.0.1:P` serves plain HTTP
as before; kube-scheduler speaks TLS to an extender through its `tlsConfig`
(KubeSchedulerConfiguration `extenders[].tlsConfig`: caFile/caData, certFile/keyFile,
serverName). docs/decisions/0083.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger("railyard.scheduler")

# A token shorter than this is refused at start: `head -c 32 /dev/urandom | base64` is 44.
MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096  # read no more than a token could be


class AccessError(Exception):
    """A TLS or token file that cannot be used; the message names the flag and the file."""


@dataclass(frozen=True, slots=True)
class AdminToken:
    """The bearer token admin calls must carry (`Authorization: Bearer <token>`). Kept as
    its SHA-256 only, so comparing costs the same whatever the caller sends."""

    digest: bytes

    @classmethod
    def from_file(cls, path: Path) -> AdminToken:
        """The token in `path` (white space around it ignored): printable ASCII, at least
        MIN_TOKEN_CHARS long."""
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_TOKEN_BYTES + 1)
        except OSError as e:
            raise AccessError(f"--admin-token-file {path}: cannot read: {e}") from None
        if len(raw) > MAX_TOKEN_BYTES:
            raise AccessError(f"--admin-token-file {path}: longer than {MAX_TOKEN_BYTES} bytes")
        token = raw.strip()
        if not (token.isascii() and all(0x21 <= b <= 0x7E for b in token)):
            raise AccessError(f"--admin-token-file {path}: the token must be printable ASCII "
                              "without spaces (it travels in an HTTP header)")
        if len(token) < MIN_TOKEN_CHARS:
            raise AccessError(f"--admin-token-file {path}: the token has {len(token)} "
                              f"characters; at least {MIN_TOKEN_CHARS} are needed "
                              "(head -c 32 /dev/urandom | base64)")
        return cls.of(token)

    @classmethod
    def of(cls, token: bytes) -> AdminToken:
        return cls(hashlib.sha256(token).digest())

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries this token (constant time)."""
        if authorization is None:
            return False
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(digest, self.digest)


def server_tls(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> ssl.SSLContext:
    """The TLS context the extender serves with: its certificate and key, TLS 1.2 or later.

    With `client_ca_file`, a client certificate is asked for and, when given, verified against
    it (a bad one fails the handshake); whether one was given is checked per request
    (`has_client_certificate`), so kubelet's probes of `/healthz`, which present none, still
    connect. kube-scheduler presents one through `tlsConfig.certFile`/`keyFile`.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise AccessError(f"--tls-cert-file {cert_file} / --tls-key-file {key_file}: "
                          f"cannot load the certificate and its key: {e}") from None
    if client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as e:
            raise AccessError(f"--client-ca-file {client_ca_file}: cannot load: {e}") from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def has_client_certificate(request: web.Request) -> bool:
    """Whether the request's connection presented a client certificate that the TLS
    handshake verified (against `--client-ca-file`)."""
    transport = request.transport
    return transport is not None and bool(transport.get_extra_info("peercert"))


# Open without a client certificate: kubelet's probes present none.
OPEN_PATHS = frozenset({"/healthz"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def client_certificates() -> Middleware:
    """Refuse (403) any call but `/healthz` whose connection presented no client
    certificate; one that does not verify never gets past the handshake."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not has_client_certificate(request):
            log.warning("%s %s from %s refused: no client certificate", request.method,
                        request.path, request.remote)
            return web.Response(status=403, text="this extender needs a client certificate "
                                "signed by its --client-ca-file (kube-scheduler: "
                                "tlsConfig.certFile and keyFile)\n")
        return await handler(request)

    return middleware
