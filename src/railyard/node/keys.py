"""Key files of signed records (decision 0087): the extender's private key and its public
half, and a node's own key, made by its agent on first start in the node's state folder.

PEM files as `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write them.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from railyard.node.files import write_atomic
from railyard.records.signature import SignatureKeyError


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise SignatureKeyError(str(path), e.strerror or str(e)) from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM (PKCS#8) file; SignatureKeyError naming the file."""
    path = Path(path)
    data = _read(path)
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise SignatureKeyError(str(path), f"not a PEM private key without password: {e}") \
            from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureKeyError(str(path), "not an Ed25519 key "
                                           "(openssl genpkey -algorithm ed25519)")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file, or the public half of a private key file."""
    path = Path(path)
    data = _read(path)
    if b"PRIVATE KEY" in data:
        return load_private_key(path).public_key()
    try:
        key = load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise SignatureKeyError(str(path), f"not a PEM public key: {e}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureKeyError(str(path), "not an Ed25519 public key")
    return key


def node_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """The node's own key: read from `path`, or made and written there (0600) if absent.
    A node's agent restarts with the same key, so its published truth stays checkable."""
    path = Path(path)
    if path.exists():
        return load_private_key(path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, pem, mode=0o600, fsync=True)
    except OSError as e:
        raise SignatureKeyError(str(path), f"cannot write a new node key: {e}") from None
    return key
