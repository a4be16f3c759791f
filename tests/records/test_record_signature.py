"""Record signatures (records.signature, node.keys; decision 0087): a signature holds for the
pod it was made for and the record as signed, whatever order a reader's JSON keeps; keys
are read from the files openssl writes, and a node's own key is made once and kept."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from railyard.node.keys import load_private_key, load_public_key, node_signing_key
from railyard.records.allocation import decode_allocation, encode_allocation
from railyard.records.signature import (
    RecordTrust,
    SignatureKeyError,
    public_key_from_text,
    public_key_text,
    sign_record,
)
from support.allocations import allocation, h100, vf

KEY = Ed25519PrivateKey.generate()
TOPO = h100(node="node-a")
RECORD = encode_allocation(allocation(TOPO, [(0, vf(TOPO, 0, 0))]))
TRUST = RecordTrust.keys([KEY.public_key()], lambda node: None)


def test_a_signed_record_still_decodes_and_keeps_its_fields_first_in_order():
    text = sign_record(RECORD, "uid-1", KEY)
    assert text.startswith(RECORD[:-1] + ',"signature":"')
    assert decode_allocation(text) == decode_allocation(RECORD)
    assert sign_record(text, "uid-1", KEY) == text  # signing again replaces, not appends


def test_a_signature_holds_for_its_pod_and_record_only():
    text = sign_record(RECORD, "uid-1", KEY)
    assert TRUST.refusal(text, "uid-1") is None
    # Re-serialised by another JSON writer (other key order, spaces): the same record.
    assert TRUST.refusal(json.dumps(dict(reversed(json.loads(text).items()))), "uid-1") is None
    assert "uid uid-2" in (TRUST.refusal(text, "uid-2") or "")
    edited = text.replace('"decidedAt":"2026-', '"decidedAt":"2027-')
    assert edited != text and TRUST.refusal(edited, "uid-1")
    assert "no signature" in (TRUST.refusal(RECORD, "uid-1") or "")
    other = RecordTrust.keys([Ed25519PrivateKey.generate().public_key()], lambda n: None)
    assert other.refusal(text, "uid-1")
    assert RecordTrust().refusal(RECORD, "uid-1") is None  # no keys: trusted


def test_published_public_keys_round_trip_and_garbage_is_named():
    assert public_key_from_text(public_key_text(KEY.public_key()), "x") == KEY.public_key()
    with pytest.raises(SignatureKeyError, match="NodeTopology a"):
        public_key_from_text("not base64!", "NodeTopology a")


def test_key_files_as_openssl_writes_them(tmp_path):
    private = tmp_path / "signing.key"
    private.write_bytes(KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public = tmp_path / "signing.pub"
    public.write_bytes(KEY.public_key().public_bytes(Encoding.PEM,
                                                     PublicFormat.SubjectPublicKeyInfo))
    assert load_private_key(private).public_key() == KEY.public_key()
    assert load_public_key(public) == load_public_key(private) == KEY.public_key()
    (tmp_path / "bad").write_text("hello")
    with pytest.raises(SignatureKeyError, match="bad: not a PEM private key"):
        load_private_key(tmp_path / "bad")
    with pytest.raises(SignatureKeyError, match="missing"):
        load_public_key(tmp_path / "missing")


@pytest.mark.skipif(not any(os.access(os.path.join(p, "openssl"), os.X_OK)
                            for p in os.environ.get("PATH", "").split(os.pathsep)),
                    reason="openssl is not installed")
def test_the_keys_docs_install_md_makes_with_openssl_load(tmp_path):
    key, pub = tmp_path / "signing.key", tmp_path / "signing.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)],
                   check=True)
    assert load_public_key(pub) == load_private_key(key).public_key()


def test_a_nodes_key_is_made_once_private_and_kept(tmp_path):
    path = tmp_path / "state" / "record-signing.key"
    first = node_signing_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert node_signing_key(path).public_key() == first.public_key()
