"""kubeconfig files and in-cluster service-account folders load into one KubeConfig, whose
TLS context really loads; pure (files in a temporary folder, no root, no server)."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from railyard.kube.config import (
    TOKEN_REREAD_S,
    KubeConfigError,
    TokenSource,
    load_in_cluster,
    load_kubeconfig,
)


@pytest.fixture(scope="module")
def pems(tmp_path_factory) -> dict[str, Path]:
    """A self-signed CA and a client certificate and key, as PEM files."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=test",
                    "-keyout", str(d / "client.key"), "-out", str(d / "client.crt")],
                   check=True, capture_output=True)
    shutil.copy(d / "client.crt", d / "ca.crt")
    return {"ca": d / "ca.crt", "cert": d / "client.crt", "key": d / "client.key"}


def kubeconfig(user: dict, cluster: dict | None = None, **top) -> dict:
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u",
                                                  "namespace": "team"}}],
        "current-context": "ctx", **top,
    }


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_embedded_certificates_load_into_a_working_tls_context(tmp_path, pems):
    path = tmp_path / "config"
    path.write_text(json.dumps(kubeconfig(
        {"client-certificate-data": b64(pems["cert"]), "client-key-data": b64(pems["key"])},
        {"server": "https://10.0.0.1:6443/", "certificate-authority-data": b64(pems["ca"])})))
    config = load_kubeconfig(path)
    assert config.server == "https://10.0.0.1:6443"
    assert config.namespace == "team"
    context = config.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1


def test_file_references_are_relative_to_the_kubeconfig_folder(tmp_path, pems):
    (tmp_path / "pki").mkdir()
    for name in ("ca", "cert", "key"):
        shutil.copy(pems[name], tmp_path / "pki" / pems[name].name)
    path = tmp_path / "config.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\n"
        "clusters: [{name: c, cluster: {server: 'https://h:1',\n"
        "                               certificate-authority: pki/ca.crt}}]\n"
        "users: [{name: u, user: {client-certificate: pki/client.crt,\n"
        "                         client-key: pki/client.key}}]\n"
        "contexts: [{name: ctx, context: {cluster: c, user: u}}]\n")
    config = load_kubeconfig(path)
    assert config.ca is not None and config.ca.path == tmp_path / "pki" / "ca.crt"
    assert config.namespace == "default"
    config.ssl_context()  # loads the files


def test_a_token_and_a_token_file_are_both_bearer_tokens(tmp_path):
    path = tmp_path / "config"
    path.write_text(json.dumps(kubeconfig({"token": "abc"})))
    token = load_kubeconfig(path).token
    assert token is not None and token.get() == "abc"
    (tmp_path / "tok").write_text("from-file\n")
    path.write_text(json.dumps(kubeconfig({"tokenFile": "tok"})))
    token = load_kubeconfig(path).token
    assert token is not None and token.get() == "from-file"


def test_a_named_context_is_used_over_the_current_one(tmp_path):
    doc = kubeconfig({"token": "a"})
    doc["clusters"].append({"name": "other", "cluster": {"server": "https://other:6443"}})
    doc["contexts"].append({"name": "second", "context": {"cluster": "other", "user": "u"}})
    path = tmp_path / "config"
    path.write_text(json.dumps(doc))
    assert load_kubeconfig(path, context="second").server == "https://other:6443"


@pytest.mark.parametrize(("doc", "says"), [
    ({"current-context": "nope"}, "no context named 'nope'"),
    ({"users": [{"name": "u", "user": {"exec": {"command": "x"}}}]}, "'exec' credentials"),
    ({"users": [{"name": "u", "user": {"client-certificate-data": "QQ=="}}]},
     "needs its key"),
    ({"clusters": [{"name": "c", "cluster": {"server": "10.0.0.1"}}]}, "not an http(s) URL"),
])
def test_an_unusable_kubeconfig_is_an_error_naming_the_file(tmp_path, doc, says):
    path = tmp_path / "config"
    path.write_text(json.dumps({**kubeconfig({"token": "t"}), **doc}))
    with pytest.raises(KubeConfigError) as e:
        load_kubeconfig(path)
    assert says in str(e.value) and str(path) in str(e.value)


def test_a_missing_kubeconfig_file_is_an_error_not_a_traceback(tmp_path):
    with pytest.raises(KubeConfigError, match="cannot read"):
        load_kubeconfig(tmp_path / "absent")


def service_account(folder: Path, pems) -> Path:
    folder.mkdir()
    (folder / "token").write_text("sa-token\n")
    shutil.copy(pems["ca"], folder / "ca.crt")
    (folder / "namespace").write_text("railyard-system")
    return folder


def test_in_cluster_config_comes_from_the_service_account_folder(tmp_path, pems):
    folder = service_account(tmp_path / "sa", pems)
    config = load_in_cluster(folder, {"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                      "KUBERNETES_SERVICE_PORT": "443"})
    assert config.server == "https://10.96.0.1:443"
    assert config.namespace == "railyard-system"
    assert config.token is not None and config.token.get() == "sa-token"
    assert len(config.ssl_context().get_ca_certs()) == 1


def test_in_cluster_config_brackets_an_ipv6_service_host(tmp_path, pems):
    folder = service_account(tmp_path / "sa", pems)
    config = load_in_cluster(folder, {"KUBERNETES_SERVICE_HOST": "fd00::1",
                                      "KUBERNETES_SERVICE_PORT": "443"})
    assert config.server == "https://[fd00::1]:443"


def test_outside_a_cluster_the_in_cluster_config_says_so(tmp_path, pems):
    folder = service_account(tmp_path / "sa", pems)
    with pytest.raises(KubeConfigError, match="not in a cluster"):
        load_in_cluster(folder, {})
    (folder / "token").unlink()
    with pytest.raises(KubeConfigError, match="token: missing"):
        load_in_cluster(folder, {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"})


def test_a_rotated_token_file_is_read_again_after_a_minute(tmp_path):
    path = tmp_path / "token"
    path.write_text("one")
    token = TokenSource(path=path)
    assert token.get(now=0.0) == "one"
    path.write_text("two")
    assert token.get(now=TOKEN_REREAD_S / 2) == "one"
    assert token.get(now=TOKEN_REREAD_S) == "two"
    path.unlink()  # mid-rotation: keep the last token rather than fail a request
    assert token.get(now=3 * TOKEN_REREAD_S) == "two"
