"""Who may call the extender (docs/decisions/0083): the admin call needs the bearer token and
is absent with the API; TLS and client certificates are opt-in, as kube-scheduler's
`tlsConfig` uses them; plain HTTP stays the default. Certificates are made here with openssl."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml
from scheduler_helpers import args, pod
from test_scheduler_cli import free_port, railyard, stop

from railyard.scheduler.access import AccessError, AdminToken, server_tls
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.connections import HttpLimits
from railyard.scheduler.service import Extender, bound_port, start
from railyard.scheduler.state import ClusterState
from railyard.scheduler.state_file import StateFile, read_state

NAMES = ["dgx-h100-000", "dgx-h100-001"]
TOKEN = "0123456789abcdef-the-admin-token"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path
    rogue_client: Path  # signed by another CA
    rogue_client_key: Path


def _openssl(*argv: str, cwd: Path) -> None:
    subprocess.run(["openssl", *argv], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN={name}", cwd=d)


def _signed(d: Path, name: str, ca: str, ext: str | None = None) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    extra = []
    if ext is not None:
        (d / f"{name}.ext").write_text(ext)
        extra = ["-extfile", f"{name}.ext"]
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _signed(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _signed(d, "client", "ca")
    _signed(d, "rogue-client", "rogue-ca")
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
                 d / "client.key", d / "rogue-client.pem", d / "rogue-client.key")


def client_tls(certs: Certs, cert: Path | None = None, key: Path | None = None
               ) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs.ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def extender(**kw) -> Extender:
    return Extender(ClusterState(cluster_from_spec("dgx-h100:2")), **kw)


def serve(ext: Extender, scenario, tls: ssl.SSLContext | None = None):
    async def go():
        runner = await start(ext, "127.0.0.1", 0, tls)
        scheme = "http" if tls is None else "https"
        try:
            async with aiohttp.ClientSession() as s:
                return await scenario(s, f"{scheme}://127.0.0.1:{bound_port(runner)}")
        finally:
            await runner.cleanup()
    return asyncio.run(go())


async def post(s: aiohttp.ClientSession, url: str, body: dict,
               tls: ssl.SSLContext | None = None) -> tuple[int, object]:
    async with s.post(url, json=body, ssl=tls if tls is not None else True) as r:
        return r.status, (await r.json() if r.content_type == "application/json"
                          else await r.text())


async def delete(s: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
                 ) -> tuple[int, dict[str, str]]:
    async with s.delete(url, headers=headers or {}) as r:
        return r.status, dict(r.headers)


async def bind_one(s: aiohttp.ClientSession, url: str) -> None:
    await post(s, f"{url}/filter", args(pod("u1", gpus=2, vfs=2), NAMES))
    _, body = await post(s, f"{url}/bind", {"PodName": "pod-u1", "PodNamespace": "default",
                                            "PodUID": "u1", "Node": "dgx-h100-000"})
    assert body == {"Error": ""}


# ------------------------------------------------------------------------ the admin call


def test_a_delete_without_the_admin_token_is_refused_and_frees_nothing(tmp_path):
    sf, _ = StateFile.open(tmp_path / "state")
    sf.compact()
    ext = extender(writer=sf, state_file=sf, admin_token=AdminToken.of(TOKEN.encode()))

    async def scenario(s, url):
        await bind_one(s, url)
        refused = [await delete(s, f"{url}/pods/u1"),
                   await delete(s, f"{url}/pods/u1", {"Authorization": "Bearer not-the-token"}),
                   await delete(s, f"{url}/pods/u1", {"Authorization": f"Basic {TOKEN}"}),
                   await delete(s, f"{url}/pods/u1", {"Authorization": TOKEN})]
        held = (ext.state.pod("u1"), len(ext.state.ledger("dgx-h100-000")),
                [p.uid for p in read_state(sf.path)])
        allowed = await delete(s, f"{url}/pods/u1", {"Authorization": f"Bearer {TOKEN}"})
        return refused, held, allowed

    try:
        refused, (pod_held, ledger_size, recorded), allowed = serve(ext, scenario)
    finally:
        sf.close()
    assert [status for status, _ in refused] == [401, 403, 403, 403]
    assert refused[0][1]["WWW-Authenticate"] == "Bearer"
    assert pod_held is not None and ledger_size == 1 and recorded == ["u1"]
    assert allowed[0] == 200
    assert ext.state.pod("u1") is None and len(ext.state.ledger("dgx-h100-000")) == 0
    assert read_state(sf.path) == []


def test_a_delete_is_refused_to_everyone_when_no_admin_token_is_configured():
    ext = extender()

    async def scenario(s, url):
        await bind_one(s, url)
        return await delete(s, f"{url}/pods/u1", {"Authorization": f"Bearer {TOKEN}"})

    status, _ = serve(ext, scenario)
    assert status == 403 and ext.state.pod("u1") is not None


def test_with_the_api_as_the_source_there_is_no_delete():
    # The pod watch frees a pod's devices; a DELETE could only free a running pod's.
    ext = extender(admin_calls=False, admin_token=AdminToken.of(TOKEN.encode()))

    async def scenario(s, url):
        await bind_one(s, url)
        return await delete(s, f"{url}/pods/u1", {"Authorization": f"Bearer {TOKEN}"})

    status, _ = serve(ext, scenario)
    assert status in (404, 405) and ext.state.pod("u1") is not None


def test_an_admin_token_file_must_hold_a_long_printable_token(tmp_path):
    good = tmp_path / "good"
    good.write_text(f"{TOKEN}\n")
    assert AdminToken.from_file(good).allows(f"Bearer {TOKEN}")
    assert not AdminToken.from_file(good).allows(f"Bearer {TOKEN}x")
    for name, content in [("short", b"abc\n"), ("spaced", b"0123456789 abcdef0123"),
                          ("binary", b"0123456789abcdef\xff"), ("empty", b"")]:
        f = tmp_path / name
        f.write_bytes(content)
        with pytest.raises(AccessError, match="--admin-token-file"):
            AdminToken.from_file(f)
    with pytest.raises(AccessError, match="cannot read"):
        AdminToken.from_file(tmp_path / "missing")


# ------------------------------------------------------------------------ TLS


def test_filter_round_trips_over_https_and_plain_http_gets_no_answer_there(certs):
    ext = extender()
    server = server_tls(certs.server, certs.server_key, None)

    async def scenario(s, url):
        answered = await post(s, f"{url}/filter", args(pod("u1", gpus=1, vfs=1), NAMES),
                              client_tls(certs))
        plain = url.replace("https://", "http://")
        with pytest.raises(aiohttp.ClientError):
            await post(s, f"{plain}/filter", args(pod("u1", gpus=1, vfs=1), NAMES))
        return answered

    status, body = serve(ext, scenario, server)
    assert status == 200 and body["NodeNames"] == NAMES and body["Error"] == ""


def test_with_a_client_ca_every_call_but_healthz_needs_a_certificate_it_signed(certs):
    ext = extender()
    server = server_tls(certs.server, certs.server_key, certs.ca)
    filter_args = args(pod("u1", gpus=1, vfs=1), NAMES)

    async def scenario(s, url):
        anonymous = client_tls(certs)
        async with s.get(f"{url}/healthz", ssl=anonymous) as r:
            health = r.status  # kubelet's probes present no certificate
        refused = [(await post(s, f"{url}/{verb}", filter_args, anonymous))[0]
                   for verb in ("filter", "prioritize", "bind")]
        async with s.get(f"{url}/allocations", ssl=anonymous) as r:
            refused.append(r.status)
        signed = await post(s, f"{url}/filter", filter_args,
                            client_tls(certs, certs.client, certs.client_key))
        with pytest.raises(aiohttp.ClientError):
            await post(s, f"{url}/filter", filter_args,
                       client_tls(certs, certs.rogue_client, certs.rogue_client_key))
        return health, refused, signed

    health, refused, (status, body) = serve(ext, scenario, server)
    assert health == 200 and refused == [403, 403, 403, 403]
    assert status == 200 and body["NodeNames"] == NAMES


def test_a_client_that_never_starts_the_tls_handshake_is_shed_at_the_header_deadline(certs):
    ext = extender(limits=HttpLimits(header_timeout_s=0.3))
    server = server_tls(certs.server, certs.server_key, None)

    async def scenario(s, url):
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(5):
                closed = await reader.read() == b""
        finally:
            writer.close()
        return closed, time.monotonic() - t0

    closed, waited_s = serve(ext, scenario, server)
    assert closed and waited_s < 3


def test_a_certificate_that_does_not_load_is_an_error_naming_the_flags(tmp_path, certs):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(AccessError, match="--tls-cert-file"):
        server_tls(bad, certs.server_key, None)
    with pytest.raises(AccessError, match="--client-ca-file"):
        server_tls(certs.server, certs.server_key, bad)


# ------------------------------------------------------------------------ the command


def test_the_command_serves_https_and_the_admin_call_with_its_token(tmp_path, certs):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [{"name": "gpu-a", "profile": "dgx-h100"}]}))
    token = tmp_path / "token"
    token.write_text(f"{TOKEN}\n")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    proc = railyard("scheduler", "--listen", f"127.0.0.1:{port}", "--cluster-file",
                    str(cluster), "--tls-cert-file", str(certs.server), "--tls-key-file",
                    str(certs.server_key), "--admin-token-file", str(token))
    tls = client_tls(certs)

    def call(path: str, body: bytes | None = None, method: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{url}{path}", data=body, method=method,
                                         headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10, context=tls) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    try:
        for _ in range(200):
            if proc.poll() is not None:
                raise AssertionError(proc.communicate()[1])
            try:
                call("/healthz")
                break
            except OSError:
                time.sleep(0.05)
        status, _ = call("/filter", json.dumps(args(pod("u1", gpus=1, vfs=1),
                                                    ["gpu-a"])).encode())
        assert status == 200
        bind = {"PodName": "pod-u1", "PodNamespace": "default", "PodUID": "u1", "Node": "gpu-a"}
        assert call("/bind", json.dumps(bind).encode()) == (200, b'{"Error":""}')
        assert call("/pods/u1", method="DELETE")[0] == 401
        status, _ = call("/pods/u1", method="DELETE",
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
    finally:
        err = stop(proc)
    assert f"extender listening on https://127.0.0.1:{port}" in err


def test_plain_http_on_loopback_stays_the_default(tmp_path):
    from railyard.cli.scheduler import DEFAULT_LISTEN, parse_listen

    assert parse_listen(DEFAULT_LISTEN) == ("127.0.0.1", 8888)  # was 0.0.0.0: every interface
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [{"name": "gpu-a", "profile": "dgx-h100"}]}))
    port = free_port()
    proc = railyard("scheduler", "--listen", f"127.0.0.1:{port}", "--cluster-file",
                    str(cluster))
    try:
        for _ in range(200):
            if proc.poll() is not None:
                raise AssertionError(proc.communicate()[1])
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.read() == b"ok"
    finally:
        err = stop(proc)
    assert f"extender listening on http://127.0.0.1:{port}" in err
