"""RDMA devices and network namespaces: the seam, and its one real implementation over RDMA netlink.

The kernel's RDMA subsystem runs in `shared` mode (every RDMA device visible in every netns;
only the char devices isolate a pod) or `exclusive` mode (an RDMA device lives in one netns and
must be moved with the pod's netdev; `rdma system set netns exclusive`, usually at boot via
`ib_core netns_mode=0`). The service asks once, at start, and in exclusive mode moves a
device's RDMA device into the pod before its netdev (IPoIB needs that order) and back after it.

Wire facts (include/uapi/rdma/rdma_netlink.h): NETLINK_RDMA = 20, message type
`(RDMA_NL_NLDEV << 10) + op` with RDMA_NL_NLDEV = 5; ops GET = 1, SET = 2, SYS_GET = 6;
attributes DEV_INDEX = 1 (u32), DEV_NAME = 2 (string), SYS_ATTR_NETNS_MODE = 66 (u8, 1 =
shared), NET_NS_FD = 68 (u32). SET must be sent from the namespace the device is in.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Literal, Protocol

from railyard.cni.netns import Netns, _inside

Mode = Literal["shared", "exclusive"]

NETLINK_RDMA = 20
_NLDEV = 5
RDMA_NLDEV_CMD_GET, RDMA_NLDEV_CMD_SET, RDMA_NLDEV_CMD_SYS_GET = 1, 2, 6
ATTR_DEV_INDEX, ATTR_DEV_NAME, ATTR_NETNS_MODE, ATTR_NET_NS_FD = 1, 2, 66, 68
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3


class RdmaError(Exception):
    """An RDMA netlink request failed; names the device and why."""


class RdmaNetns(Protocol):
    def mode(self) -> Mode: ...

    def move(self, device: str, source: Netns, target: Netns) -> None:
        """Move RDMA device `device` from namespace `source` into `target`."""
        ...

    def holds(self, device: str, netns: Netns) -> bool:
        """Is RDMA device `device` in namespace `netns` now? (Lets an undo be repeated.)"""
        ...


def nl_type(op: int) -> int:
    return (_NLDEV << 10) + op


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(op: int, flags: int, attrs: bytes = b"", seq: int = 1) -> bytes:
    return struct.pack("=IHHII", 16 + len(attrs), nl_type(op), flags, seq, 0) + attrs


def parse_messages(data: bytes) -> list[tuple[int, dict[int, bytes]]]:
    """(type, {attribute: payload}) for each message; an NLMSG_ERROR becomes its errno."""
    out = []
    off = 0
    while off + 16 <= len(data):
        length, mtype, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
        if length < 16:
            break
        body = data[off + 16: off + length]
        if mtype == NLMSG_ERROR:
            code = -struct.unpack_from("=i", body, 0)[0]
            out.append((mtype, {0: code.to_bytes(4, "little")}))
        else:
            attrs: dict[int, bytes] = {}
            a = 0
            while a + 4 <= len(body):
                alen, akind = struct.unpack_from("=HH", body, a)
                if alen < 4:
                    break
                attrs[akind & 0x3FFF] = body[a + 4: a + alen]
                a += (alen + 3) & ~3
            out.append((mtype, attrs))
        off += (length + 3) & ~3
    return out


class RdmaNetlink:
    """The real seam: RDMA netlink sockets opened inside the namespace they must talk to."""

    def __init__(self) -> None:
        self._mode: Mode | None = None

    def _socket(self, netns: Netns | None) -> socket.socket:
        if netns is None:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
        with _inside(netns.fd):
            return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)

    def _request(self, sock: socket.socket, msg: bytes) -> list[tuple[int, dict[int, bytes]]]:
        sock.send(msg)
        replies: list[tuple[int, dict[int, bytes]]] = []
        while True:
            batch = parse_messages(sock.recv(65536))
            for mtype, attrs in batch:
                if mtype == NLMSG_ERROR:
                    code = int.from_bytes(attrs[0], "little")
                    if code:
                        raise OSError(code, os.strerror(code))
                    return replies  # the ACK
                if mtype == NLMSG_DONE:
                    return replies
                replies.append((mtype, attrs))
            if not batch:
                return replies

    def mode(self) -> Mode:
        """Asked once; a kernel without the RDMA subsystem behaves as shared (nothing to move)."""
        if self._mode is None:
            try:
                sock = self._socket(None)
            except OSError as e:
                if e.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT):
                    self._mode = "shared"
                    return self._mode
                raise
            with sock:
                replies = self._request(sock, message(RDMA_NLDEV_CMD_SYS_GET,
                                                      NLM_F_REQUEST | NLM_F_ACK))
            value = next((a[ATTR_NETNS_MODE] for _, a in replies if ATTR_NETNS_MODE in a), b"\1")
            self._mode = "shared" if value[:1] != b"\0" else "exclusive"
        return self._mode

    def _index(self, sock: socket.socket, device: str) -> int:
        for _, attrs in self._request(sock, message(RDMA_NLDEV_CMD_GET,
                                                    NLM_F_REQUEST | NLM_F_DUMP)):
            name = attrs.get(ATTR_DEV_NAME, b"").rstrip(b"\0").decode()
            if name == device and ATTR_DEV_INDEX in attrs:
                return struct.unpack("=I", attrs[ATTR_DEV_INDEX][:4])[0]
        raise RdmaError(f"RDMA device {device} is not in this network namespace")

    def holds(self, device: str, netns: Netns) -> bool:
        try:
            with self._socket(netns) as sock:
                self._index(sock, device)
        except RdmaError:
            return False
        except OSError as e:
            raise RdmaError(f"list RDMA devices in {netns.label}: {e.strerror}") from None
        return True

    def move(self, device: str, source: Netns, target: Netns) -> None:
        try:
            with self._socket(source) as sock:
                index = self._index(sock, device)
                self._request(sock, message(
                    RDMA_NLDEV_CMD_SET, NLM_F_REQUEST | NLM_F_ACK,
                    attr(ATTR_DEV_INDEX, struct.pack("=I", index))
                    + attr(ATTR_NET_NS_FD, struct.pack("=I", target.fd))))
        except OSError as e:
            raise RdmaError(f"move RDMA device {device} to {target.label}: {e.strerror}") from None
