"""Network namespaces held by file descriptor, and the few link operations the CNI service needs.

setns(2) on a thread moves that thread alone, so a namespace is entered only long enough to
open a netlink socket there; the socket keeps talking to that namespace from any thread. A
temporary namespace is unshare(2) on the calling thread plus the fd we keep: no bind mount, no
helper process (pyroute2's own `netns=` forks one per socket), and the kernel removes it with its
last fd. Links are then driven with pyroute2 over those sockets.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs file: which kind of namespace (linux/nsfs.h)
IFF_UP = 0x1
_NETLINK_ROUTE = 0
_SELF = "/proc/thread-self/ns/net"
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(OSError):
    """A namespace that cannot be opened or entered; names the path."""


class LinkError(Exception):
    """A netlink operation on one device failed; says which operation, device and why."""

    def __init__(self, op: str, device: str, err: int, reason: str) -> None:
        super().__init__(f"{op} {device}: {reason}")
        self.op, self.device, self.errno, self.reason = op, device, err, reason


def _call(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise NetnsError(err, f"{what}: {os.strerror(err)}")


@contextlib.contextmanager
def _inside(fd: int) -> Iterator[None]:
    """Run the block with this thread in the namespace `fd`, then come home."""
    home = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _call(_libc.setns(fd, CLONE_NEWNET), "setns")
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                # Unreachable in practice (we hold our own namespace's fd); a thread left in a
                # pod's namespace would do later work in the wrong place, so stop hard.
                os.abort()
    finally:
        os.close(home)


class Netns:
    """An open network namespace; `close()` drops our reference."""

    def __init__(self, fd: int, label: str) -> None:
        self.fd = fd
        self.label = label

    @classmethod
    def open(cls, path: str) -> Netns:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise NetnsError(e.errno, f"{path}: {e.strerror}") from None
        try:
            kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
        except OSError:
            kind = -1
        if kind != CLONE_NEWNET:
            os.close(fd)
            raise NetnsError(errno.EINVAL, f"{path}: not a network namespace")
        return cls(fd, path)

    @classmethod
    def current(cls) -> Netns:
        return cls(os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC), "host")

    @classmethod
    def create(cls, label: str = "temporary") -> Netns:
        """A fresh, empty namespace that lives as long as this object's fd."""
        home = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _call(_libc.unshare(CLONE_NEWNET), "unshare")
            try:
                fd = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
            finally:
                if _libc.setns(home, CLONE_NEWNET) != 0:
                    os.abort()  # see _inside
        finally:
            os.close(home)
        return cls(fd, label)

    def identity(self) -> tuple[int, int]:
        """(device, inode) of the namespace: equal for two fds of one namespace."""
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino

    def links(self) -> Links:
        with _inside(self.fd):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
        return Links(sock, self)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def netns_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the namespace at `path`, or None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True, slots=True)
class Link:
    index: int
    name: str
    mac: str | None
    mtu: int
    up: bool
    parent: str | None  # IFLA_PARENT_DEV_NAME: the PCI address of a real NIC's netdev

    @classmethod
    def of(cls, msg) -> Link:
        return cls(msg["index"], msg.get_attr("IFLA_IFNAME"), msg.get_attr("IFLA_ADDRESS"),
                   msg.get_attr("IFLA_MTU"), bool(msg["flags"] & IFF_UP),
                   msg.get_attr("IFLA_PARENT_DEV_NAME"))


class Links:
    """Link operations inside one namespace (pyroute2 over a socket opened there)."""

    def __init__(self, sock: socket.socket, netns: Netns) -> None:
        self.netns = netns
        self._ipr = IPRoute(use_socket=sock)

    def close(self) -> None:
        self._ipr.close()

    def __enter__(self) -> Links:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _do(self, op: str, device: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except NetlinkError as e:
            raise LinkError(op, f"{device} in {self.netns.label}", e.code,
                            os.strerror(e.code) if e.code > 0 else str(e)) from None

    def get(self, name: str) -> Link | None:
        try:
            msgs = self._ipr.link("get", ifname=name)
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                return None
            raise LinkError("get", name, e.code, os.strerror(e.code)) from None
        return Link.of(msgs[0]) if msgs else None

    def names(self) -> list[str]:
        return [m.get_attr("IFLA_IFNAME") for m in self._ipr.get_links()]

    def set(self, link: Link, *, name: str | None = None, mtu: int | None = None,
            mac: str | None = None, up: bool | None = None) -> None:
        """One RTM_NEWLINK with every change; the kernel renames only a link that is down."""
        kw: dict = {}
        if name is not None and name != link.name:
            kw["ifname"] = name
        if mtu is not None and mtu != link.mtu:
            kw["mtu"] = mtu
        if mac is not None and (link.mac or "").lower() != mac.lower():
            kw["address"] = mac
        if up is not None and up != link.up:
            kw["state"] = "up" if up else "down"
        if kw:
            self._do("set", link.name, self._ipr.link, "set", index=link.index, **kw)

    def down(self, link: Link) -> None:
        if link.up:
            self._do("down", link.name, self._ipr.link, "set", index=link.index, state="down")

    def move(self, link: Link, target: Netns) -> None:
        self._do(f"move to {target.label}", link.name, self._ipr.link, "set",
                 index=link.index, net_ns_fd=target.fd)

    def add_address(self, link: Link, cidr: str) -> None:
        ip = ipaddress.ip_interface(cidr)
        try:
            self._ipr.addr("add", index=link.index, address=str(ip.ip),
                           prefixlen=ip.network.prefixlen)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise LinkError(f"add address {cidr}", link.name, e.code,
                                os.strerror(e.code)) from None

    def addresses(self, link: Link) -> set[str]:
        out = set()
        for m in self._ipr.get_addr(index=link.index):
            out.add(f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}")
        return out

    def add_route(self, link: Link, dst: str, gateway: str | None) -> None:
        net = ipaddress.ip_network(dst, strict=False)
        kw: dict = {"dst": f"{net.network_address}/{net.prefixlen}", "oif": link.index}
        if net.version == 6:
            kw["family"] = socket.AF_INET6
        if gateway:
            kw["gateway"] = gateway
        try:
            self._ipr.route("add", **kw)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise LinkError(f"add route {dst} via {gateway}", link.name, e.code,
                                os.strerror(e.code)) from None
