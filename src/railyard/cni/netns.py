"""Network namespaces held by file descriptor, and the few link operations the CNI service needs.

setns(2) on a thread moves that thread alone, so a namespace is entered only long enough to
open a netlink socket there; the socket keeps talking to that namespace from any thread (no
helper process: pyroute2's own `netns=` forks one per socket). Links are then driven over
those sockets with pyroute2's rtnetlink message codecs.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    nlmsg,
)
from pyroute2.netlink.rtnl import (
    RTM_DELLINKPROP,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETNSID,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWLINKPROP,
    RTM_NEWROUTE,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.nsidmsg import nsidmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs file: which kind of namespace (linux/nsfs.h)
IFF_UP = 0x1
IFF_NOARP, IFF_PROMISC, IFF_ALLMULTI, IFF_MULTICAST = 0x80, 0x100, 0x200, 0x1000
# Flags a pod may change on its VF that stay with the netdev when it moves: restored on DEL.
RESTORED_FLAGS = IFF_NOARP | IFF_PROMISC | IFF_ALLMULTI | IFF_MULTICAST
_IFLA_IFALIAS = 20
_NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_RTEXT_FILTER_SKIP_STATS = 1 << 3  # no counters in RTM_GETLINK replies: less to decode
_RT_TABLE_MAIN, _RTPROT_BOOT, _RTN_UNICAST = 254, 3, 1
_RT_SCOPE_UNIVERSE, _RT_SCOPE_LINK = 0, 253
_SELF = "/proc/thread-self/ns/net"
# ethtool's ETHTOOL_GDRVINFO (linux/ethtool.h): struct ethtool_drvinfo is 196 bytes, the
# command word, then driver, version, fw_version and bus_info (32 bytes each), and the rest.
_SIOCETHTOOL, _ETHTOOL_GDRVINFO, _DRVINFO_SIZE, _BUS_INFO_AT = 0x8946, 3, 196, 4 + 3 * 32
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
    # Alternative names: they travel with the device, and a lookup by name matches them too.
    altnames: tuple[str, ...] = ()
    # What else a pod can change on its VF that moves with it (see RESTORED_FLAGS).
    flags: int = 0
    txqlen: int | None = None
    group: int | None = None
    alias: str | None = None
    # IFLA_LINK and IFLA_LINK_NETNSID: the other end of a veth (a macvlan's lower device), by
    # its ifindex where it lives; the netnsid, the id this namespace gives that one, only when
    # it is another namespace. A pod can choose the ifindex, never which namespace it is in.
    link_index: int | None = None
    link_netnsid: int | None = None

    @classmethod
    def of(cls, msg: ifinfmsg) -> Link:
        props = msg.get_attr("IFLA_PROP_LIST")
        altnames = tuple(props.get_attrs("IFLA_ALT_IFNAME")) if props else ()
        return cls(msg["index"], msg.get_attr("IFLA_IFNAME"), msg.get_attr("IFLA_ADDRESS"),
                   msg.get_attr("IFLA_MTU"), bool(msg["flags"] & IFF_UP),
                   msg.get_attr("IFLA_PARENT_DEV_NAME"), altnames, msg["flags"],
                   msg.get_attr("IFLA_TXQLEN"), msg.get_attr("IFLA_GROUP"),
                   msg.get_attr("IFLA_IFALIAS") or None, msg.get_attr("IFLA_LINK"),
                   msg.get_attr("IFLA_LINK_NETNSID"))


class Links:
    """Link operations inside one namespace: synchronous rtnetlink over a socket opened there.

    Messages are pyroute2's rtnl codecs, sent and read directly: one system call pair per
    request, without the event loop pyroute2's IPRoute runs per call (measured: 0.3 ms per
    request against 0.7–2 ms on this project's loaded CI machines, and ADD of 8 VFs makes
    about 40 of them). Not thread-safe; one per thread, or a lock around it.
    """

    def __init__(self, sock: socket.socket, netns: Netns) -> None:
        self.netns = netns
        self._sock = sock
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Links:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, msg: nlmsg, kind: int, flags: int = 0,
                 raw_attrs: bytes = b"") -> list[nlmsg]:
        """Send one request; the decoded replies (a dump's parts), or NetlinkFailure.

        `raw_attrs` are appended as encoded (for attributes pyroute2 cannot write empty)."""
        self._seq += 1
        msg["header"]["type"] = kind
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | flags
        msg["header"]["sequence_number"] = self._seq
        msg.encode()
        data = bytes(msg.data)
        if raw_attrs:
            data = struct.pack("=I", len(data) + len(raw_attrs)) + data[4:] + raw_attrs
        self._sock.send(data)
        cls = type(msg)
        replies: list[nlmsg] = []
        while True:
            # A link's message can outgrow any fixed buffer (a pod may give one of its links
            # ~64 KiB of altnames): ask the datagram's size first, as iproute2 does.
            size = self._sock.recv_into(bytearray(1), 1, socket.MSG_PEEK | socket.MSG_TRUNC)
            data = self._sock.recv(max(size, 1 << 16))
            off = 0
            while off + 16 <= len(data):
                length, mtype = _HEADER.unpack_from(data, off)[:2]
                seq = _HEADER.unpack_from(data, off)[3]
                if length < 16:
                    break
                if seq == self._seq:
                    if mtype == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", data, off + 16)[0]
                        if code:
                            raise NetlinkFailure(code)
                        return replies  # the ACK ends every request
                    if mtype == NLMSG_DONE:
                        return replies
                    reply = cls(data[off:off + length])
                    try:
                        reply.decode()
                    except Exception:  # pyroute2's decoders raise their own kinds
                        raise NetlinkFailure(errno.EBADMSG) from None
                    replies.append(reply)
                off += (length + 3) & ~3

    def _do(self, op: str, device: str, msg: nlmsg, kind: int, flags: int = 0) -> list[nlmsg]:
        try:
            return self._request(msg, kind, flags)
        except NetlinkFailure as e:
            raise LinkError(op, f"{device} in {self.netns.label}", e.code,
                            os.strerror(e.code)) from None

    def all(self) -> list[Link]:
        """Every link, in index order."""
        msg = ifinfmsg()
        msg["attrs"] = [("IFLA_EXT_MASK", _RTEXT_FILTER_SKIP_STATS)]
        return [Link.of(m) for m in self._request(msg, RTM_GETLINK, NLM_F_DUMP)]

    def get(self, name: str) -> Link | None:
        msg = ifinfmsg()
        msg["attrs"] = [("IFLA_IFNAME", name), ("IFLA_EXT_MASK", _RTEXT_FILTER_SKIP_STATS)]
        try:
            replies = self._request(msg, RTM_GETLINK)
        except NetlinkFailure as e:
            if e.code == errno.ENODEV:
                return None
            raise LinkError("get", name, e.code, os.strerror(e.code)) from None
        return Link.of(replies[0]) if replies else None

    def bus_info(self, link: Link) -> str | None:
        """What the driver reports as the device's bus address (ethtool -i `bus_info`): a PCI
        NIC's own function address; "" for a veth; None when no link has this name here or its
        driver answers nothing. By name (the ioctl knows no other way): only as certain as the
        name, so ask where nobody else renames links."""
        buf = ctypes.create_string_buffer(_DRVINFO_SIZE)
        struct.pack_into("=I", buf, 0, _ETHTOOL_GDRVINFO)
        ifreq = struct.pack("16sP16x", link.name.encode(), ctypes.addressof(buf))  # an ifreq
        try:
            # Any socket reaches the device ioctls of its own namespace: this netlink one does.
            fcntl.ioctl(self._sock.fileno(), _SIOCETHTOOL, ifreq)
        except OSError:
            return None
        raw = buf.raw[_BUS_INFO_AT:_BUS_INFO_AT + 32]
        return raw.split(b"\0", 1)[0].decode("ascii", "replace")

    def id_of(self, other: Netns) -> int | None:
        """The id this namespace gives `other` (IFLA_LINK_NETNSID of its links whose peer is
        there), or None when it gives it none (RTM_GETNSID; it assigns none)."""
        msg = nsidmsg()
        msg["attrs"] = [("NETNSA_FD", other.fd)]
        try:
            replies = self._request(msg, RTM_GETNSID)
        except NetlinkFailure as e:
            raise LinkError("find the id of", f"{other.label} in {self.netns.label}", e.code,
                            os.strerror(e.code)) from None
        nsid = replies[0].get_attr("NETNSA_NSID") if replies else None
        # NETNSA_NSID_NOT_ASSIGNED is -1, decoded as unsigned by pyroute2.
        return nsid if isinstance(nsid, int) and 0 <= nsid < 1 << 31 else None

    def set(self, link: Link, *, name: str | None = None, mtu: int | None = None,
            mac: str | None = None, up: bool | None = None) -> Link:
        """One request with every change; returns the link as it now is. Not atomic: the
        kernel applies MAC and MTU before the name, and keeps them if the rename fails. Older
        kernels rename only a link that is down."""
        msg = ifinfmsg()
        msg["index"] = link.index
        attrs: list[tuple[str, str | int]] = []
        if name is not None and name != link.name:
            attrs.append(("IFLA_IFNAME", name))
        if mtu is not None and mtu != link.mtu:
            attrs.append(("IFLA_MTU", mtu))
        if mac is not None and (link.mac or "").lower() != mac.lower():
            attrs.append(("IFLA_ADDRESS", mac.lower()))
        if up is not None and up != link.up:
            msg["flags"], msg["change"] = (IFF_UP if up else 0), IFF_UP
        if not attrs and not msg["change"]:
            return link
        msg["attrs"] = attrs
        self._do("set", link.name, msg, RTM_NEWLINK)
        return replace(link, name=name or link.name, mac=mac or link.mac, mtu=mtu or link.mtu,
                       up=link.up if up is None else up)

    def restore(self, link: Link, *, flags: int, txqlen: int | None, group: int | None,
                alias: str | None) -> None:
        """Put back the RESTORED_FLAGS bits, txqueuelen, group and alias a link had."""
        msg = ifinfmsg()
        msg["index"] = link.index
        msg["flags"], msg["change"] = flags & RESTORED_FLAGS, RESTORED_FLAGS
        attrs: list = []
        if txqlen is not None:
            attrs.append(("IFLA_TXQLEN", txqlen))
        if group is not None:
            attrs.append(("IFLA_GROUP", group))
        raw = b""
        if alias:
            attrs.append(("IFLA_IFALIAS", alias))
        else:  # an empty attribute clears it; pyroute2 would send one NUL byte, an alias ""
            raw = struct.pack("=HH", 4, _IFLA_IFALIAS)
        msg["attrs"] = attrs
        try:
            self._request(msg, RTM_NEWLINK, raw_attrs=raw)
        except NetlinkFailure as e:
            raise LinkError("restore flags, txqueuelen, group and alias of",
                            f"{link.name} in {self.netns.label}", e.code,
                            os.strerror(e.code)) from None

    def add_altnames(self, link: Link, names: list[str]) -> Link:
        """Give the link these alternative names (RTM_NEWLINKPROP)."""
        self._altnames(link, names, RTM_NEWLINKPROP, "add altnames {} to")
        return replace(link, altnames=(*link.altnames, *names))

    def drop_altnames(self, link: Link, names: list[str]) -> Link:
        """Remove these alternative names from the link (RTM_DELLINKPROP)."""
        self._altnames(link, names, RTM_DELLINKPROP, "drop altnames {} of")
        return replace(link, altnames=tuple(a for a in link.altnames if a not in names))

    def _altnames(self, link: Link, names: list[str], kind: int, op: str) -> None:
        if names:
            msg = ifinfmsg()
            msg["index"] = link.index
            msg["attrs"] = [("IFLA_PROP_LIST",
                             {"attrs": [("IFLA_ALT_IFNAME", n) for n in names]})]
            self._do(op.format(", ".join(names)), link.name, msg, kind)

    def down(self, link: Link) -> Link:
        return self.set(link, up=False)

    def move(self, link: Link, target: Netns) -> None:
        msg = ifinfmsg()
        msg["index"] = link.index
        msg["attrs"] = [("IFLA_NET_NS_FD", target.fd)]
        self._do(f"move to {target.label}", link.name, msg, RTM_NEWLINK)

    def add_address(self, link: Link, cidr: str) -> None:
        ip = ipaddress.ip_interface(cidr)
        msg = ifaddrmsg()
        msg["family"] = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        msg["prefixlen"] = ip.network.prefixlen
        msg["index"] = link.index
        msg["attrs"] = [("IFA_LOCAL", str(ip.ip)), ("IFA_ADDRESS", str(ip.ip))]
        try:
            self._request(msg, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL)
        except NetlinkFailure as e:
            if e.code != errno.EEXIST:
                raise LinkError(f"add address {cidr}", link.name, e.code,
                                os.strerror(e.code)) from None

    def addresses(self, link: Link) -> builtins.set[str]:  # `set` here is Links.set
        msg = ifaddrmsg()
        out: builtins.set[str] = set()
        for m in self._request(msg, RTM_GETADDR, NLM_F_DUMP):
            if m["index"] == link.index:
                out.add(f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}")
        return out

    def add_route(self, link: Link, dst: str, gateway: str | None) -> None:
        net = ipaddress.ip_network(dst, strict=False)
        msg = rtmsg()
        msg["family"] = socket.AF_INET6 if net.version == 6 else socket.AF_INET
        msg["dst_len"] = net.prefixlen
        msg["table"] = _RT_TABLE_MAIN
        msg["proto"] = _RTPROT_BOOT
        msg["scope"] = _RT_SCOPE_UNIVERSE if gateway else _RT_SCOPE_LINK
        msg["type"] = _RTN_UNICAST
        attrs: list = [("RTA_OIF", link.index)]
        if net.prefixlen:
            attrs.append(("RTA_DST", str(net.network_address)))
        if gateway:
            attrs.append(("RTA_GATEWAY", gateway))
        msg["attrs"] = attrs
        try:
            self._request(msg, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL)
        except NetlinkFailure as e:
            if e.code != errno.EEXIST:
                raise LinkError(f"add route {dst} via {gateway}", link.name, e.code,
                                os.strerror(e.code)) from None


class NetlinkFailure(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.code = code
