"""The chart's record signing (recordSigning values, decision 0087): off by default; given the
two Secrets, the extender alone mounts the private key and signs, the agents mount only the
public key and keep their own node key in the state folder; a half configuration is refused."""

from __future__ import annotations

from typing import Any

import pytest

from support.chart import CHART, NAMESPACE, documents, helm


def _pods(home, *options: str) -> dict[str, dict[str, Any]]:
    out = documents(helm(home, "template", "railyard", str(CHART), "--namespace", NAMESPACE,
                         *options))
    return {o["kind"]: o["spec"]["template"]["spec"] for o in out
            if o["kind"] in ("Deployment", "DaemonSet")}


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["containers"][0]


def test_off_by_default_nothing_is_signed(tmp_path):
    for pod in _pods(tmp_path).values():
        assert not [a for a in _main(pod)["args"] if "key-file" in a]


def test_the_extender_holds_the_private_key_and_the_agents_the_public_one(tmp_path):
    pods = _pods(tmp_path, "--set", "recordSigning.secretName=ry-signing",
                 "--set", "recordSigning.publicKeySecretName=ry-signing-pub")
    extender, agent = pods["Deployment"], pods["DaemonSet"]
    assert "--signing-key-file=/etc/railyard/signing/signing.key" in _main(extender)["args"]
    assert {"name": "signing", "secret": {"secretName": "ry-signing", "items": [
        {"key": "signing.key", "path": "signing.key"}]}} in extender["volumes"]
    args = _main(agent)["args"]
    assert "--signing-key-file=/var/lib/railyard/record-signing.key" in args
    assert "--extender-public-key-file=/etc/railyard/extender-key/signing.pub" in args
    assert {"name": "extender-key", "secret": {"secretName": "ry-signing-pub", "items": [
        {"key": "signing.pub", "path": "signing.pub"}]}} in agent["volumes"]
    secrets = [v["secret"]["secretName"] for v in agent["volumes"] if "secret" in v]
    assert secrets == ["ry-signing-pub"]  # never the private key on a node


def test_a_private_key_without_its_public_half_for_the_agents_is_refused(tmp_path):
    with pytest.raises(AssertionError, match=r"recordSigning\.publicKeySecretName"):
        _pods(tmp_path, "--set", "recordSigning.secretName=ry-signing")
