"""Proof of a record's author (decision 0087): an Ed25519 signature over (record, pod UID,
node), kept in the record's optional `signature` field. The extender signs its decisions
(`decidedBy: scheduler`) with a key only it holds; each agent signs its node's truth
(`decidedBy: node`) with its node's own key. Readers hold public keys only.

A copied signature fails on another pod (the UID is signed) and an edited record fails on its
own pod. Pure: keys come in as objects or bytes; `node.keys` reads and writes key files.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SIGNATURE_FIELD = "signature"
# A node's public key, as its agent publishes it on its NodeTopology (base64 of the 32 raw
# bytes): where the extender learns the key of each node's truth.
NODE_KEY_ANNOTATION = "railyard.dev/record-key"
# Signed bytes begin with this context, so a signature over a record can never be replayed as
# one over anything else the same key might sign.
_CONTEXT = b"railyard.dev/allocation signature v1\0"


class SignatureKeyError(ValueError):
    """A key that cannot be used (a file, or a published key): `source` names where it was."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source, self.reason = source, reason


def _signed_bytes(record: dict[str, Any], pod_uid: str) -> bytes:
    """What a signature covers: the record without its signature, canonical JSON (sorted
    keys, so a reader that re-orders nothing still agrees), the pod's UID and the node."""
    body = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    node = body.get("node")
    return b"\0".join((_CONTEXT, pod_uid.encode(), str(node).encode(), canonical.encode()))


def sign_record(text: str, pod_uid: str, key: Ed25519PrivateKey) -> str:
    """The record `text` (the codec's compact JSON) with its signature for this pod as the
    last field; the fields before it keep their order (the admission policy reads the first)."""
    record = json.loads(text)
    record.pop(SIGNATURE_FIELD, None)
    signature = key.sign(_signed_bytes(record, pod_uid))
    record[SIGNATURE_FIELD] = base64.b64encode(signature).decode()
    return json.dumps(record, separators=(",", ":"))


def public_key_text(key: Ed25519PublicKey) -> str:
    """A public key as published: base64 of its 32 raw bytes."""
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def public_key_from_text(text: str, source: str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as e:
        raise SignatureKeyError(source, f"not an Ed25519 public key in base64: {e}") from None


@dataclass(frozen=True, slots=True)
class RecordTrust:
    """Which records a reader believes. Without keys (`enforced` False: the file modes of the
    tests and `railyard allocate`) every record that decodes is trusted, as before signatures.
    With keys, a record counts only when signed for its pod: a decision by one of `extender`,
    a node's truth by the key `node_key(record.node)` returns."""

    extender: tuple[Ed25519PublicKey, ...] = ()
    node_key: Callable[[str], Ed25519PublicKey | None] | None = None
    enforced: bool = False

    @classmethod
    def keys(cls, extender: Sequence[Ed25519PublicKey],
             node_key: Callable[[str], Ed25519PublicKey | None]) -> RecordTrust:
        return cls(tuple(extender), node_key, True)

    def refusal(self, text: str, pod_uid: str) -> str | None:
        """Why the record `text` on the pod `pod_uid` is not to be believed; None: it is.
        Anything this returns is a reason to treat the pod as having no record."""
        if not self.enforced:
            return None
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            return None  # not a record at all: the codec says why
        if not isinstance(record, dict):
            return None
        author = record.get("decidedBy")
        if author == "scheduler":
            keys, who = self.extender, "the extender's key"
        elif author == "node":
            node = record.get("node")
            found = self.node_key(node) if isinstance(node, str) and self.node_key else None
            keys, who = (found,) if found else (), f"node {node}'s key"
            if not keys:
                return f"no key is known for node {node!r}: its truth cannot be checked"
        else:
            return None  # the codec refuses it
        signature = record.get(SIGNATURE_FIELD)
        if not isinstance(signature, str):
            return f"no signature (decidedBy: {author}); records must be signed here"
        try:
            raw = base64.b64decode(signature, validate=True)
        except binascii.Error:
            return "a signature that is not base64"
        signed = _signed_bytes(record, pod_uid)
        for key in keys:
            try:
                key.verify(raw, signed)
                return None
            except InvalidSignature:
                continue
        return (f"a signature that {who} did not make for this pod (uid {pod_uid}): copied "
                "from another pod, or the record was edited")


# Every record that decodes is believed: no keys configured (a frozen value, shared).
TRUST_ALL = RecordTrust()
