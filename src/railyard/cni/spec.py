"""CNI wire rules, pure: versions, error codes, the call's environment, CNI_ARGS, the network
config Railyard reads, IPAM results, and our result in the shape of each version.

No I/O here: the plugin validates a call once, at this boundary, and trusts the values after.
Facts follow the CNI 1.1 specification (containernetworking/cni SPEC.md) and libcni's habits.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from railyard.cni.shim import LATEST_VERSION, NESTED_TOO_DEEPLY, SUPPORTED_VERSIONS
from railyard.node.ifnames import (
    GPU_INDEX,
    IFNAME_SCHEMES,
    SEQUENTIAL,
    ifname_problem,
    pod_ifname,
    pod_ifnames,
)
from railyard.records.fields import FieldError, Fields, clipped, kind_of

__all__ = ["LATEST_VERSION", "SUPPORTED_VERSIONS"]

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
VALID_ATTACHMENTS = "cni.dev/valid-attachments"
# The key's name in the CNI 1.1.0 text until a 2024 correction; libcni sends both since.
VALID_ATTACHMENTS_OLD = "cni.dev/attachments"


class Code(IntEnum):
    """Error codes: 1–99 from the spec, 100+ Railyard's own."""

    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO = 5
    DECODE = 6
    INVALID_CONFIG = 7
    TRY_AGAIN = 11
    NOT_AVAILABLE = 50
    DEVICE_UNAVAILABLE = 100  # a granted device is not in the host netns, or in use elsewhere
    NOT_CONFIRMED = 101  # kubelet's PodResources disagrees with the node state store
    CHECK_FAILED = 102
    ATTACHMENT_EXISTS = 103
    MOVE_FAILED = 104  # netlink refused a move, rename or setting (rolled back)
    IPAM_FAILED = 105  # the delegated IPAM plugin failed without a spec code of its own


# What an error may say, whatever a runtime or a network config put in the value it quotes:
# the runtime logs it and may copy it into a pod's Events (issue 19: a 7,500-character
# CNI_COMMAND came back whole).
MAX_MSG_CHARS = 1024
MAX_DETAILS_CHARS = 4096


def _shown(value: Any) -> str:
    """A value a config or a runtime gave, quoted for an error: a string's start, or what kind
    of thing it is (repr of a value nested 10,000 deep would itself overflow the stack)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else f"{value[:60]!r}…"
    return kind_of(value)


class CniError(Exception):
    """A failure the runtime sees as the spec's JSON error (code, msg, details)."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        msg = clipped(msg, MAX_MSG_CHARS)
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = clipped(details, MAX_DETAILS_CHARS)

    def to_json(self, version: str) -> dict[str, Any]:
        return {"cniVersion": version, "code": self.code, "msg": self.msg,
                "details": self.details}


def version_key(v: str) -> tuple[int, ...]:
    """Order semantic versions ("0.4.0" < "1.0.0"); ValueError on anything else."""
    parts = v.split(".")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"not a version: {v!r}")
    return tuple(int(p) for p in parts)


def newest_common(ours_max: str, theirs: list[str] | tuple[str, ...],
                  floor: str = "0.1.0") -> str | None:
    """The newest version in `theirs` that is ≤ `ours_max` and ≥ `floor` (IPAM negotiation)."""
    best: tuple[tuple[int, ...], str] | None = None
    hi, lo = version_key(ours_max), version_key(floor)
    for v in theirs:
        try:
            k = version_key(v)
        except ValueError:
            continue
        if lo <= k <= hi and (best is None or k > best[0]):
            best = (k, v)
    return best[1] if best else None


# ----------------------------------------------------------------------- environment

# Characters no interface name may hold: the kernel's (dev_valid_name: '/', ':', white space)
# and ours ('%', which iproute2 reads as a format; NUL and other control characters).
# Every pattern below is used with fullmatch: `$` would also pass a trailing newline.
# Both name files in the state folder (attachments/<network>/<container ID>:<ifname>.json), so
# each stays well inside a file name's 255 bytes; runtimes use 64 hex digits for an ID.
MAX_NAME_CHARS = 200
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")


def check_ifname(name: str, what: str = "CNI_IFNAME") -> str:
    """Linux interface name rules (dev_valid_name): 1–15 bytes, no '/', ':' or space; and
    valid UTF-8 without control characters."""
    if not name:
        raise CniError(Code.INVALID_ENV, f"{what} is empty")
    if not _is_utf8(name):
        raise CniError(Code.INVALID_ENV, f"{what} {name!r} is not valid UTF-8")
    problem = ifname_problem(name)
    if problem is not None:
        raise CniError(Code.INVALID_ENV, f"{what} {name!r} {problem}")
    return name


def _is_utf8(text: str) -> bool:
    """False for a string holding the shim's surrogate escapes of bytes that are not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def pair_ifnames(ifname: str, count: int, *, scheme: str = SEQUENTIAL,
                 pair_indexes: tuple[int | None, ...] | None = None) -> tuple[str, ...]:
    """Names of the pod's `count` NICs in their order (`railyard.node.ifnames`, the rule the
    device plugin's pair map names them by too). `sequential`: the first NIC takes CNI_IFNAME,
    NIC i `<ifname>-<i>`; `gpu-index`: `rdma<first pair index>`, `rdmau<j>` for unpaired ones
    (`pair_indexes`, one per NIC; None: every NIC is its own pair's, in order)."""
    if scheme == GPU_INDEX:
        indexes = pair_indexes if pair_indexes is not None else tuple(range(count))
        return pod_ifnames(indexes, GPU_INDEX)
    names = tuple(pod_ifname(ifname, i) for i in range(count))
    for n in names[1:]:
        if len(n.encode()) > 15:
            raise CniError(Code.INVALID_ENV,
                           f"CNI_IFNAME {ifname!r} is too long for {count} interfaces: "
                           f"{n!r} exceeds 15 bytes")
    return names


@dataclass(frozen=True, slots=True)
class PodArgs:
    """The pod identity in CNI_ARGS (Kubernetes runtimes and Multus set these keys)."""

    uid: str | None = None
    namespace: str | None = None
    name: str | None = None
    infra_container_id: str | None = None


_KNOWN_ARGS = {"IgnoreUnknown", "K8S_POD_UID", "K8S_POD_NAMESPACE", "K8S_POD_NAME",
               "K8S_POD_INFRA_CONTAINER_ID"}


def _parse_bool(key: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true"):
        return True
    if low in ("0", "false"):
        return False
    raise CniError(Code.INVALID_ENV, f"CNI_ARGS {key}={text!r}: expected 1, true, 0 or false")


def parse_cni_args(text: str) -> PodArgs:
    """`K=V;K=V` in any order; a key may repeat (Multus thin mode) only with the same value.

    Unknown keys are an error unless IgnoreUnknown is 1 or true, as libcni's skel does.
    """
    values: dict[str, str] = {}
    ignore_unknown: bool | None = None
    unknown: list[str] = []
    for raw in text.split(";"):
        if not raw:
            continue
        key, eq, value = raw.partition("=")
        if not eq or not key:
            raise CniError(Code.INVALID_ENV, f"CNI_ARGS: {raw!r} is not KEY=VALUE")
        if key == "IgnoreUnknown":
            b = _parse_bool(key, value)
            if ignore_unknown is not None and b != ignore_unknown:
                raise CniError(Code.INVALID_ENV, "CNI_ARGS: IgnoreUnknown given twice, differently")
            ignore_unknown = b
            continue
        if key not in _KNOWN_ARGS:
            unknown.append(key)
            continue
        if key in values and values[key] != value:
            raise CniError(Code.INVALID_ENV,
                           f"CNI_ARGS: {key} given twice with different values "
                           f"({values[key]!r}, {value!r})")
        values[key] = value
    if unknown and not ignore_unknown:
        raise CniError(Code.INVALID_ENV,
                       f"CNI_ARGS: unknown key(s) {', '.join(sorted(set(unknown)))} "
                       "(set IgnoreUnknown=1 to allow them)")
    return PodArgs(values.get("K8S_POD_UID") or None, values.get("K8S_POD_NAMESPACE") or None,
                   values.get("K8S_POD_NAME") or None,
                   values.get("K8S_POD_INFRA_CONTAINER_ID") or None)


@dataclass(frozen=True, slots=True)
class Call:
    """One plugin invocation's environment, validated for its command."""

    command: str
    container_id: str
    netns: str
    ifname: str
    args: PodArgs
    path: tuple[str, ...]
    args_text: str = ""


def parse_env(env: Mapping[str, str]) -> Call:
    """Validate the CNI_* variables the command needs; INVALID_ENV names the variable."""
    command = env.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        raise CniError(Code.INVALID_ENV,
                       f"CNI_COMMAND {command!r} is not one of {', '.join(COMMANDS)}")
    container_id = env.get("CNI_CONTAINERID", "")
    netns = env.get("CNI_NETNS", "")
    ifname = env.get("CNI_IFNAME", "")
    path = tuple(p for p in env.get("CNI_PATH", "").split(":") if p)
    if command in ("ADD", "DEL", "CHECK"):
        if not container_id:
            raise CniError(Code.INVALID_ENV, "CNI_CONTAINERID is required")
        if not _CONTAINER_ID.fullmatch(container_id):
            raise CniError(Code.INVALID_ENV,
                           f"CNI_CONTAINERID {container_id!r} is not {MAX_NAME_CHARS} or fewer "
                           "letters, digits, '_', '.' and '-'")
        check_ifname(ifname)
        if command != "DEL" and not netns:
            raise CniError(Code.INVALID_ENV, f"CNI_NETNS is required for {command}")
        if netns and not netns.startswith("/"):
            raise CniError(Code.INVALID_ENV, f"CNI_NETNS {netns!r} is not an absolute path")
    args_text = env.get("CNI_ARGS", "")
    args = PodArgs()
    if command in ("ADD", "CHECK"):
        args = parse_cni_args(args_text)
    elif command == "DEL":
        # DEL takes everything from the attachment record; arguments it cannot read must not
        # keep devices in a pod.
        with contextlib.suppress(CniError):
            args = parse_cni_args(args_text)
    return Call(command, container_id, netns, ifname, args, path, args_text)


# ----------------------------------------------------------------------- network config

_NET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")  # MAX_NAME_CHARS
_PLUGIN_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_MAC = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}")


@dataclass(frozen=True, slots=True)
class InterfaceConf:
    """Per-interface settings, in pair order (`interfaces[i]` of the config)."""

    mtu: int | None = None
    mac: str | None = None
    ipam: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Attachment:
    container_id: str
    ifname: str


@dataclass(frozen=True, slots=True)
class NetConf:
    """The keys Railyard acts on; `raw` keeps everything (runtimes and Multus add their own)."""

    version: str
    name: str
    type: str
    raw: Mapping[str, Any] = field(repr=False)
    ipam: Mapping[str, Any] | None = None
    mtu: int | None = None
    mac: str | None = None  # the first interface's MAC (config `mac`, or runtimeConfig.mac)
    interfaces: tuple[InterfaceConf, ...] = ()
    prev_result: Mapping[str, Any] | None = None
    standalone: bool = False
    state_dir: str | None = None
    device_info_file: str | None = None  # runtimeConfig.CNIDeviceInfoFile (Multus)
    valid_attachments: tuple[Attachment, ...] | None = None
    ifname_scheme: str = SEQUENTIAL  # `ifnameScheme`: how the pod's interfaces are named

    def interface(self, i: int) -> InterfaceConf:
        """Settings for pair i: its `interfaces[i]` entry over the top-level defaults."""
        own = self.interfaces[i] if i < len(self.interfaces) else InterfaceConf()
        mac = own.mac or (self.mac if i == 0 else None)
        return InterfaceConf(own.mtu or self.mtu, mac, own.ipam or self.ipam)


class NetConfError(FieldError):
    """A network config key that cannot be used; `parse_netconf` answers it with code 7."""


def _mtu(f: Fields, key: str) -> int | None:
    if f.get(key) is None:
        return None
    return f.integer(key, 68, 65535)


def _mac(f: Fields, key: str) -> str | None:
    v = f.string_or_null(key)
    if v is None:
        return None
    if not _MAC.fullmatch(v):
        f.fail(key, f"expected a MAC address like 02:00:00:00:00:01, got {v!r}")
    if int(v[:2], 16) & 1:
        f.fail(key, f"{v} is a multicast address")
    return v.lower()


def _ipam(f: Fields, key: str) -> Mapping[str, Any] | None:
    if f.get(key) is None:
        return None
    ipam = f.object(key)
    if not ipam.d:
        return None  # `"ipam": {}` means no IPAM, as in the reference plugins
    t = ipam.get("type")
    if not isinstance(t, str) or not _PLUGIN_TYPE.fullmatch(t):
        ipam.fail("type", "expected a plugin name (letters, digits, '_', '.', '-'), "
                          f"got {_shown(t)}")
    return ipam.d


def load_config(stdin: bytes) -> dict[str, Any]:
    """The network config on stdin as a JSON object; CniError(DECODE) otherwise, also for one
    nested deeper than MAX_CONFIG_DEPTH."""
    try:
        data = json.loads(stdin)
    except (ValueError, UnicodeDecodeError) as e:
        raise CniError(Code.DECODE, f"network config on stdin is not JSON: {e}") from None
    except RecursionError:  # deeper than the parser's stack (about 1,000 levels)
        raise CniError(Code.DECODE, NESTED_TOO_DEEPLY) from None
    if not isinstance(data, dict):
        raise CniError(Code.DECODE, "network config on stdin is not a JSON object")
    if _nested_deeper_than(data, MAX_CONFIG_DEPTH):
        raise CniError(Code.DECODE, f"{NESTED_TOO_DEEPLY} (more than {MAX_CONFIG_DEPTH} "
                                    "levels)")
    return data


# Real configs (ipam ranges, a prevResult, Multus's additions) nest a handful of levels. One
# that still parses, near the parser's ~1,000 levels, overflows the stack later: ADD writes
# the config into the attachment record (json.dumps) a few dozen frames deeper, and answered
# an internal error (measured: 985 levels parse, and fail to dump 10 frames down).
MAX_CONFIG_DEPTH = 64


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in `value` nest more than `limit` levels (no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values() if isinstance(x, dict | list))
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v if isinstance(x, dict | list))
    return False


def reply_version(data: Mapping[str, Any]) -> str:
    """The version to answer in, errors included: the config's when we speak it, else ours."""
    asked = data.get("cniVersion")
    return asked if isinstance(asked, str) and asked in SUPPORTED_VERSIONS else LATEST_VERSION


def parse_netconf(data: Mapping[str, Any]) -> NetConf:
    """Validate the decoded config; INCOMPATIBLE_VERSION, or INVALID_CONFIG naming the key."""
    version = data.get("cniVersion")
    if not isinstance(version, str):
        raise CniError(Code.INCOMPATIBLE_VERSION,
                       "cniVersion: missing (this plugin speaks "
                       f"{', '.join(SUPPORTED_VERSIONS)})")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(Code.INCOMPATIBLE_VERSION,
                       f"cniVersion {version!r} is not supported",
                       f"supported: {', '.join(SUPPORTED_VERSIONS)}")
    try:
        return _netconf(version, data)
    except FieldError as e:
        raise CniError(Code.INVALID_CONFIG, str(e)) from None


def _netconf(version: str, data: Mapping[str, Any]) -> NetConf:
    f = Fields(data, "", NetConfError)
    name = f.get("name")
    if not isinstance(name, str) or not _NET_NAME.fullmatch(name):
        f.fail("name", f"expected a network name ({MAX_NAME_CHARS} or fewer letters, digits, "
                       f"'_', '.', '-'), got {_shown(name)}")
    ptype = f.string("type", nonempty=True, what="the plugin's name")
    if not _PLUGIN_TYPE.fullmatch(ptype):
        f.fail("type", f"expected a plugin name (letters, digits, '_', '.', '-'), got {ptype!r}")
    ipam = _ipam(f, "ipam")
    # `or {}` / `or []`: a false value (null, {}, "") is as good as none, as it always was.
    runtime = (f.object("runtimeConfig") if f.get("runtimeConfig")
               else Fields({}, "runtimeConfig", NetConfError))
    mac = _mac(runtime, "mac") or _mac(f, "mac")
    interfaces = []
    if f.get("interfaces"):
        if not isinstance(f.get("interfaces"), list):
            f.fail("interfaces", "expected a list (one object per pair, in pair order)")
        for item in f.objects("interfaces"):
            interfaces.append(InterfaceConf(_mtu(item, "mtu"), _mac(item, "mac"),
                                            _ipam(item, "ipam")))
    prev = f.get("prevResult")
    if prev is not None:
        _check_prev_result(f.object("prevResult"))
    standalone = f.boolean("standalone", False)
    state_dir = f.string_or_null("stateDir")
    if state_dir is not None and not state_dir.startswith("/"):
        f.fail("stateDir", f"expected an absolute path, got {state_dir!r}")
    for key in ("agentSocket",):
        v = f.string_or_null(key)
        if v is not None and not v.startswith("/"):
            f.fail(key, f"expected an absolute path, got {v!r}")
    scheme = f.one_of("ifnameScheme", IFNAME_SCHEMES) if "ifnameScheme" in f else SEQUENTIAL
    if scheme == GPU_INDEX and f.get("ifname") is not None:
        f.fail("ifname", "names the interfaces under ifnameScheme sequential only; "
                         "ifnameScheme gpu-index names them rdma0, rdma1, … (leave one out)")
    valid = None
    for key in (VALID_ATTACHMENTS, VALID_ATTACHMENTS_OLD):
        if key in f:
            valid = _attachments(f, key)
            break
    return NetConf(
        version=version, name=name, type=ptype, raw=data, ipam=ipam,
        mtu=_mtu(f, "mtu"), mac=mac, interfaces=tuple(interfaces),
        prev_result=prev, standalone=standalone, state_dir=state_dir,
        device_info_file=runtime.string_or_null("CNIDeviceInfoFile"),
        valid_attachments=valid, ifname_scheme=scheme,
    )


def _check_prev_result(prev: Fields) -> None:
    """The chain's result is passed through and extended: every part we touch is checked
    here, before anything moves, so a malformed one is a config error, not a crash later."""
    for key in ("interfaces", "ips", "routes"):
        if prev.get(key) is not None:
            for _ in prev.objects(key):
                pass
    for ip in prev.objects("ips") if prev.get("ips") else ():
        address = ip.get("address")
        try:
            if not isinstance(address, str):
                raise ValueError("expected a CIDR string")
            ipaddress.ip_interface(address)
        except ValueError as e:
            ip.fail("address", str(e))


def _attachments(f: Fields, key: str) -> tuple[Attachment, ...]:
    if not isinstance(f.get(key), list):
        f.fail(key, "expected a list of {containerID, ifname}")
    out = []
    for a in f.objects(key):
        cid, ifn = a.get("containerID"), a.get("ifname")
        if not isinstance(cid, str) or not isinstance(ifn, str):
            a.fail("", "containerID and ifname must be strings")
        out.append(Attachment(cid, ifn))
    return tuple(out)


# ----------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class IpamResult:
    """What an IPAM plugin answered: addresses (CIDR) with gateways, routes, DNS."""

    ips: tuple[tuple[str, str | None], ...]
    routes: tuple[Mapping[str, Any], ...] = ()
    dns: Mapping[str, Any] | None = None


def parse_ipam_result(data: Any, plugin: str) -> IpamResult:
    """Accept 0.3.x–1.1.0 result shapes (plugins are never asked for older ones); errors name
    the plugin and the field."""
    where = f"IPAM plugin {plugin} result"
    if not isinstance(data, dict):
        raise CniError(Code.DECODE, f"{where}: expected an object")
    for key in ("ips", "routes"):
        if data.get(key) is not None and not isinstance(data[key], list):
            raise CniError(Code.DECODE, f"{where}: {key}: expected a list")
    ips = []
    for i, ip in enumerate(data.get("ips") or []):
        if not isinstance(ip, dict) or not isinstance(ip.get("address"), str):
            raise CniError(Code.DECODE, f"{where}: ips[{i}].address missing")
        gw = ip.get("gateway")
        try:
            ipaddress.ip_interface(ip["address"])
            if gw is not None:
                _address(gw)
        except ValueError as e:
            raise CniError(Code.DECODE, f"{where}: ips[{i}]: {e}") from None
        ips.append((ip["address"], gw))
    routes = []
    for i, r in enumerate(data.get("routes") or []):
        if not isinstance(r, dict) or not isinstance(r.get("dst"), str):
            raise CniError(Code.DECODE, f"{where}: routes[{i}].dst missing")
        try:
            ipaddress.ip_network(r["dst"], strict=False)
            if r.get("gw") is not None:
                _address(r["gw"])
        except ValueError as e:
            raise CniError(Code.DECODE, f"{where}: routes[{i}]: {e}") from None
        routes.append(r)
    dns = data.get("dns")
    return IpamResult(tuple(ips), tuple(routes), dns if isinstance(dns, dict) else None)


def _address(v: Any) -> None:
    """An IP address written as a string (`ipaddress` would take an integer too)."""
    if not isinstance(v, str):
        raise ValueError(f"gateway {_shown(v)}: expected an address string")
    ipaddress.ip_address(v)


@dataclass(frozen=True, slots=True)
class ResultInterface:
    name: str
    mac: str
    sandbox: str
    mtu: int | None = None
    pci_id: str | None = None


def build_result(version: str, prev: Mapping[str, Any] | None,
                 interfaces: list[ResultInterface], ipams: list[IpamResult | None]) -> dict:
    """The ADD result: `prevResult` passed through with our interfaces and IPs appended.

    Shaped for `version`: 0.4.0 IPs carry `version`; `mtu`, `pciID` appear from 1.1.0 on
    (libcni 1.1 drops them and refuses a 1.1.0 result, so older configs never see them).
    """
    out: dict[str, Any] = dict(prev or {})
    out["cniVersion"] = version
    ifaces = [dict(i) for i in out.get("interfaces") or []]
    ips = [dict(i) for i in out.get("ips") or []]
    routes = [dict(r) for r in out.get("routes") or []]
    v11 = version_key(version) >= (1, 1, 0)
    for iface, ipam in zip(interfaces, ipams, strict=True):
        entry: dict[str, Any] = {"name": iface.name, "mac": iface.mac, "sandbox": iface.sandbox}
        if v11:
            if iface.mtu is not None:
                entry["mtu"] = iface.mtu
            if iface.pci_id:
                entry["pciID"] = iface.pci_id
        index = len(ifaces)
        ifaces.append(entry)
        if ipam is None:
            continue
        for address, gateway in ipam.ips:
            ip: dict[str, Any] = {"address": address, "interface": index}
            if gateway:
                ip["gateway"] = gateway
            ips.append(ip)
        routes.extend(dict(r) for r in ipam.routes)
        if ipam.dns and not out.get("dns"):
            out["dns"] = dict(ipam.dns)
    for ip in ips:
        if version == "0.4.0":
            ip.setdefault("version",
                          "6" if ipaddress.ip_interface(ip["address"]).version == 6 else "4")
        else:
            ip.pop("version", None)
    if not v11:
        for entry in ifaces:
            for key in ("mtu", "pciID", "socketPath"):
                entry.pop(key, None)
    out["interfaces"] = ifaces
    out["ips"] = ips
    if routes:
        out["routes"] = routes
    else:
        out.pop("routes", None)
    return out
