"""The agent's config file: resource names, which plugins run, and pool selectors.

Selectors use sriov-network-device-plugin's vocabulary (`vendors`, `devices`, `drivers`,
`pfNames`, `linkTypes`); what they mean is `railyard.kubelet.selectors`, beside the inventory
that applies them. This module only parses them.

Example (JSON or YAML):

    resources: {vf: railyard.dev/vf, pf: railyard.dev/pf, gpu: nvidia.com/gpu}
    gpuPlugin: true
    pools:
      vf: [{vendors: ["15b3"], drivers: ["mlx5_core"], pfNames: ["ibp24s0#0-3", "ibp64s0"]}]
      pf: [{linkTypes: ["infiniband"]}]
    # Several VF pools instead of `pools.vf`, in sriov-network-device-plugin's resourceList
    # form (its config.json pastes in as is); a pool without resourcePrefix is railyard.dev's.
    vfPools: {resourceList: [{resourceName: vf-rail, selectors: {pfNames: ["ibp24s0"]}}]}
    devinfoDir: /var/run/k8s.cni.cncf.io/devinfo/dp
    cniDevinfoDir: /var/run/k8s.cni.cncf.io/devinfo/cni   # the in-process CNI service's
    healthIntervalS: 1
    pairMap: {ncclGpuNicAffinity: false, podIfname: net1, podIfnameScheme: sequential}
    # docs/pair-map.md; podIfnameScheme: gpu-index when the CNI config says so (docs/cni.md)
    rails: {"0000:18:00.0": 0, ibp64s0: 1}   # or: rails: pci-order (docs/rails.md)
    # Koordinator interop, each off unless set (docs/decisions/0095): publish the node's
    # Device CR; believe Koordinator's device-allocated on a pod without a Railyard record.
    koordinator: {publishDevices: true, honourDeviceAllocated: true}
    # extender (default: device plugins, the extender decides) or dra (the agent publishes
    # ResourceSlices and serves kubelet's DRA plugin; docs/dra.md); --mode overrides it.
    mode: dra
    dra: {publishGpus: true, cdiDir: /var/run/cdi}   # GPUs in the slices too (no GPU driver)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.kubelet.dra_cdi import CDI_DIR
from railyard.kubelet.pairmap import DEFAULT_PAIR_MAP, PairMapOptions
from railyard.kubelet.selectors import PfName, Selector
from railyard.node.ifnames import IFNAME_SCHEMES, ifname_problem
from railyard.node.paths import CNI_DEVINFO_DIR, DEVINFO_DIR
from railyard.records.fields import FieldError, Fields
from railyard.topology.rails import MAX_RAIL, PCI_ORDER, RailScheme

# sriov-dp link type names, and the sysfs link_layer values they stand for.
_LINK_TYPES = {"ether": "Ethernet", "ethernet": "Ethernet", "eth": "Ethernet",
               "infiniband": "InfiniBand", "ib": "InfiniBand"}


class ConfigError(FieldError):
    """A config file that cannot be used: `path` names the field, `document` the file."""


# A pool's resource name without `resourcePrefix`: Railyard's, not sriov-dp's `intel.com`,
# so `resourceName: vf` is the default pool `railyard.dev/vf` (docs/decisions/0085).
POOL_PREFIX = "railyard.dev"
# sriov-dp selector fields Railyard applies; the others are refused by name, never ignored.
SELECTOR_FIELDS = ("vendors", "devices", "drivers", "pfNames", "linkTypes")
_RESOURCE_LIST_SELECTOR_FIELDS = (*SELECTOR_FIELDS, "isRdma")


@dataclass(frozen=True, slots=True)
class VfPool:
    """One VF pool: its resource name (the kubelet resource its plugin serves) and the
    selectors of the VFs in it (none: every RDMA VF)."""

    resource: str
    selectors: tuple[Selector, ...] = ()


@dataclass(frozen=True, slots=True)
class KoordinatorOptions:
    """Koordinator interop on the node (decision 0095); both off by default."""

    publish_devices: bool = False  # write the node's `Device` CR from discovery
    # Believe `scheduling.koordinator.sh/device-allocated` on a pod that has no Railyard
    # record, only while the agent trusts all records (no signature keys).
    honour_device_allocated: bool = False


# How the node serves its devices (issue 29): through device plugins and the extender's
# decisions, or as the DRA driver railyard.dev (ResourceSlices, kubelet's DRA plugin).
MODE_EXTENDER, MODE_DRA = "extender", "dra"
MODES = (MODE_EXTENDER, MODE_DRA)


@dataclass(frozen=True, slots=True)
class DraOptions:
    """DRA mode's settings (decision 0111)."""

    publish_gpus: bool = False  # the GPUs in our slices too, for clusters without a GPU driver
    cdi_dir: str = CDI_DIR  # where containerd (or CRI-O) reads CDI specs


@dataclass(frozen=True, slots=True)
class AgentConfig:
    resources: ResourceNames = DEFAULT_RESOURCES
    gpu_plugin: bool = True
    vf_plugin: bool = True
    pf_plugin: bool = True
    vf_pool: tuple[Selector, ...] = ()  # the default pool's selectors (`pools.vf`)
    pf_pool: tuple[Selector, ...] = ()
    # `vfPools`: every VF pool, each its own plugin; empty: the default pool alone, with
    # `vf_pool` (a config gives one or the other).
    vf_pools: tuple[VfPool, ...] = ()
    devinfo_dir: str = DEVINFO_DIR
    cni_devinfo_dir: str = CNI_DEVINFO_DIR  # where --cni-socket's service writes them
    health_interval_s: float = 1.0
    verify_delay_s: float = 1.0  # PodResources check after an Allocate
    pair_map: PairMapOptions = DEFAULT_PAIR_MAP  # the opt-in forms of the pair map
    # Each NIC's fabric rail (docs/rails.md): a map from PF PCI address, netdev or RDMA
    # device to rail, or the `pci-order` scheme; None: rails not known.
    rails: Mapping[str, int] | RailScheme | None = None
    koordinator: KoordinatorOptions = KoordinatorOptions()
    mode: str = MODE_EXTENDER
    dra: DraOptions = DraOptions()

    @property
    def dra_kinds(self) -> frozenset[str]:
        """The kinds DRA serves in DRA mode (no device plugin for them): VFs and PFs, and the
        GPUs when they are published; none in extender mode."""
        if self.mode != MODE_DRA:
            return frozenset()
        return frozenset({"vf", "pf", *(("gpu",) if self.dra.publish_gpus else ())})

    @property
    def pools(self) -> tuple[VfPool, ...]:
        """The VF pools the agent serves (the default pool alone without `vfPools`)."""
        return self.vf_pools or (VfPool(self.resources.vf, self.vf_pool),)


# ----------------------------------------------------------------------- parsing


def _hex_ids(f: Fields, key: str) -> frozenset[str]:
    out = set()
    for i, x in enumerate(f.strings(key, optional=True)):
        s = x.lower().removeprefix("0x")
        if not s or len(s) > 4 or any(c not in "0123456789abcdef" for c in s):
            f.fail(f"{key}[{i}]", f"expected a 4-digit hex PCI id, got {x!r}")
        out.add(s.rjust(4, "0"))
    return frozenset(out)


# `N` or `N-M` in ASCII digits (int() would take " 3\n", "1_0" and "３"); a PF has at most
# 65,535 VFs (sriov_totalvfs is 16 bits), so five digits.
_VF_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", re.ASCII)


def _pf_name(text: str, where: str) -> PfName:
    name, sep, rng = text.partition("#")
    if not name:
        raise ConfigError(where, "empty PF name")
    if not sep:
        return PfName(name)
    m = _VF_RANGE.fullmatch(rng)
    if m is None:
        raise ConfigError(where, f"VF range must be N or N-M, got {rng!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if first < 0 or last < first:
        raise ConfigError(where, f"VF range {rng!r} is empty or negative")
    return PfName(name, first, last)


def parse_selector(v: Any, where: str, *, resource_list: bool = False) -> Selector:
    f = Fields(v, where, ConfigError)
    if resource_list:
        unsupported = sorted(k for k in f.d if k not in _RESOURCE_LIST_SELECTOR_FIELDS)
        if unsupported:
            f.fail(str(unsupported[0]), "a sriov-network-device-plugin selector Railyard does "
                                        f"not support (it applies {', '.join(SELECTOR_FIELDS)}"
                                        " and isRdma: true)")
        if "isRdma" in f and f.get("isRdma") is not True:
            f.fail("isRdma", f"Railyard offers RDMA VFs only: expected true, got "
                             f"{f.get('isRdma')!r}")
    else:
        f.only(SELECTOR_FIELDS, "selector")
    links = set()
    for i, t in enumerate(f.strings("linkTypes", optional=True)):
        if t.lower() not in _LINK_TYPES:
            f.fail(f"linkTypes[{i}]", f"expected ether or infiniband, got {t!r}")
        links.add(_LINK_TYPES[t.lower()])
    return Selector(
        vendors=_hex_ids(f, "vendors"),
        devices=_hex_ids(f, "devices"),
        drivers=frozenset(f.strings("drivers", optional=True)),
        pf_names=tuple(_pf_name(p, f"{f.at('pfNames')}[{i}]")
                       for i, p in enumerate(f.strings("pfNames", optional=True))),
        link_types=frozenset(links),
    )


def _seconds(f: Fields, key: str, default: float) -> float:
    if key not in f:
        return default
    v = f.get(key)
    if type(v) not in (int, float) or not 0 < v <= 3600:
        f.fail(key, f"expected seconds, 0 < s ≤ 3600, got {v!r}")
    return float(v)


# Both used with fullmatch: `$` would also pass a trailing newline, which kubelet refuses.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def extended_resource_problem(name: Any) -> str | None:
    """Why kubelet's `Register` would refuse `name` (IsExtendedResourceName: a qualified name
    `prefix/name` outside kubernetes.io whose quota form `requests.<name>` is valid too);
    None when it is fine."""
    if not isinstance(name, str):
        return "expected a string"
    if name.count("/") != 1:
        return "expected exactly one '/'"
    if "kubernetes.io/" in name:
        return "the kubernetes.io namespace is Kubernetes' own"
    if name.startswith("requests."):
        return "'requests.' is the quota prefix"
    prefix, _, short = name.partition("/")
    quota_prefix = "requests." + prefix  # kubelet validates the quota form
    if not prefix or len(quota_prefix) > 253 or not all(
            _DNS_LABEL.fullmatch(label) for label in prefix.split(".")):
        return "the part before '/' must be a lower-case DNS subdomain"
    if not _NAME.fullmatch(short) or len(short) > 63:
        return ("the part after '/' must be at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def config_from_dict(d: Any) -> AgentConfig:
    if d is None:
        return AgentConfig()
    f = Fields(d, "", ConfigError)
    f.only(("resources", "gpuPlugin", "vfPlugin", "pfPlugin", "pools", "vfPools",
            "devinfoDir", "cniDevinfoDir", "healthIntervalS", "verifyDelayS", "pairMap",
            "rails", "koordinator", "mode", "dra"))
    res = f.object("resources", optional=True)
    res.only(("gpu", "vf", "pf"))
    names = {}
    for k, v in res.d.items():
        why = extended_resource_problem(v)
        if why is not None:
            res.fail(k, f"{v!r} is not an extended resource name (domain/name) kubelet "
                        f"accepts: {why}")
        names[k] = v
    resources = ResourceNames(**names)
    if len(set(resources.managed)) != 3:
        f.fail("resources", "the three resource names must differ")
    pools = f.object("pools", optional=True)
    pools.only(("vf", "pf"))

    def pool(kind: str) -> tuple[Selector, ...]:
        return tuple(parse_selector(s, at) for s, at in pools.items(kind, optional=True))

    vf_pools: tuple[VfPool, ...] = ()
    if "vfPools" in f and f.get("vfPools") is not None:
        if "vf" in pools:
            f.fail("vfPools", "give VF selectors once: in vfPools or in pools.vf, not both")
        vf_pools = _vf_pools(f, resources)
        others = tuple(sorted(p.resource for p in vf_pools if p.resource != resources.vf))
        if {resources.gpu, resources.pf} & set(others):
            f.fail("vfPools", "a VF pool's resource name must differ from the GPU and PF "
                              "resource names")
        resources = ResourceNames(resources.gpu, resources.vf, resources.pf, others)

    return AgentConfig(
        resources=resources,
        gpu_plugin=f.boolean("gpuPlugin", True),
        vf_plugin=f.boolean("vfPlugin", True),
        pf_plugin=f.boolean("pfPlugin", True),
        vf_pool=pool("vf"),
        pf_pool=pool("pf"),
        vf_pools=vf_pools,
        devinfo_dir=f.string("devinfoDir", nonempty=True, default=DEVINFO_DIR,
                             what="a folder path"),
        cni_devinfo_dir=f.string("cniDevinfoDir", nonempty=True, default=CNI_DEVINFO_DIR,
                                 what="a folder path"),
        health_interval_s=_seconds(f, "healthIntervalS", 1.0),
        verify_delay_s=_seconds(f, "verifyDelayS", 1.0),
        pair_map=_pair_map(f.object("pairMap", optional=True)),
        rails=parse_rails(f),
        koordinator=_koordinator(f.object("koordinator", optional=True)),
        mode=f.one_of("mode", MODES) if "mode" in f else MODE_EXTENDER,
        dra=_dra(f.object("dra", optional=True)),
    )


def _dra(f: Fields) -> DraOptions:
    f.only(("publishGpus", "cdiDir"))
    return DraOptions(publish_gpus=f.boolean("publishGpus", False),
                      cdi_dir=f.string("cdiDir", nonempty=True, default=CDI_DIR,
                                       what="a folder path"))


def _koordinator(f: Fields) -> KoordinatorOptions:
    f.only(("publishDevices", "honourDeviceAllocated"))
    return KoordinatorOptions(
        publish_devices=f.boolean("publishDevices", False),
        honour_device_allocated=f.boolean("honourDeviceAllocated", False))


def parse_rails(f: Fields, key: str = "rails") -> Mapping[str, int] | RailScheme | None:
    """`rails`: `pci-order`, or {PF PCI address | netdev | RDMA device: rail 0..MAX_RAIL}."""
    v = f.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        if v != PCI_ORDER:
            f.fail(key, f"expected {PCI_ORDER} or a map of NIC to rail, got {v[:60]!r}")
        return PCI_ORDER
    m = f.object(key)
    out: dict[str, int] = {}
    for name in m.d:
        if not isinstance(name, str) or not name:
            m.fail(str(name), "expected a PF PCI address, netdev or RDMA device name")
        out[name] = m.integer(name, 0, MAX_RAIL)
    return out


# sriov-dp resourceList entry keys Railyard reads; `deviceType` and `excludeTopology` only in
# the values that mean what Railyard does (a netdevice VF, placed by topology).
_POOL_KEYS = ("resourceName", "resourcePrefix", "deviceType", "excludeTopology", "selectors")


def _vf_pools(f: Fields, resources: ResourceNames) -> tuple[VfPool, ...]:
    """`vfPools`: sriov-network-device-plugin's config (`{"resourceList": [...]}`) or its
    list alone. Every pool is named once; a key or selector field Railyard does not apply
    is an error naming it, never ignored."""
    raw = f.get("vfPools")
    if isinstance(raw, dict):
        doc = f.object("vfPools")
        doc.only(("resourceList",), "key of the sriov-network-device-plugin config")
        entries = list(doc.items("resourceList"))
    else:
        entries = list(f.items("vfPools"))
    if not entries:
        f.fail("vfPools", "expected at least one pool")
    out: list[VfPool] = []
    seen: dict[str, str] = {}
    for v, at in entries:
        e = Fields(v, at, ConfigError)
        unknown = sorted(k for k in e.d if k not in _POOL_KEYS)
        if unknown:
            e.fail(str(unknown[0]), "a sriov-network-device-plugin pool key Railyard does not "
                                    f"support (it reads {', '.join(_POOL_KEYS)})")
        name = e.string("resourceName", nonempty=True, what="a resource name")
        prefix = e.string("resourcePrefix", nonempty=True, default=POOL_PREFIX,
                          what="a resource prefix")
        resource = f"{prefix}/{name}"
        why = extended_resource_problem(resource)
        if why is not None:
            e.fail("resourceName", f"{resource!r} is not an extended resource name kubelet "
                                   f"accepts: {why}")
        if "deviceType" in e and e.get("deviceType") != "netDevice":
            e.fail("deviceType", f"Railyard pools netdevice VFs: expected netDevice, got "
                                 f"{e.get('deviceType')!r}")
        if e.boolean("excludeTopology", False):
            e.fail("excludeTopology", "Railyard always places by topology: expected false")
        if resource in seen:
            e.fail("resourceName", f"{resource} is also the pool of {seen[resource]}")
        seen[resource] = at
        sel = e.get("selectors")
        if sel is None:
            selectors: tuple[Selector, ...] = ()
        elif isinstance(sel, list):  # sriov-dp's newer form: a list of selector objects
            selectors = tuple(parse_selector(s, a, resource_list=True)
                              for s, a in e.items("selectors"))
        else:
            selectors = (parse_selector(sel, e.at("selectors"), resource_list=True),)
        out.append(VfPool(resource, selectors))
    return tuple(out)


# Room left in an interface name for the `-<i>` the CNI appends for a pod's later NICs
# (railyard.node.ifnames).
_POD_IFNAME_BYTES = 12


def _pair_map(f: Fields) -> PairMapOptions:
    f.only(("ncclGpuNicAffinity", "podIfname", "podIfnameScheme"))
    ifname = f.string("podIfname", nonempty=True, default=DEFAULT_PAIR_MAP.pod_ifname,
                      what="an interface name")
    if ifname_problem(ifname, _POD_IFNAME_BYTES) is not None:
        f.fail("podIfname", f"expected an interface name of at most {_POD_IFNAME_BYTES} bytes "
                            f"without '/', ':', '%', spaces or control characters, got "
                            f"{ifname!r}")
    return PairMapOptions(
        nccl_gpu_nic_affinity=f.boolean("ncclGpuNicAffinity",
                                        DEFAULT_PAIR_MAP.nccl_gpu_nic_affinity),
        pod_ifname=ifname,
        # The CNI's `ifnameScheme` (railyard.node.ifnames), which the pair file must follow.
        pod_ifname_scheme=f.one_of("podIfnameScheme", IFNAME_SCHEMES)
        if "podIfnameScheme" in f else DEFAULT_PAIR_MAP.pod_ifname_scheme)


def load_config(path: str | os.PathLike[str] | None) -> AgentConfig:
    """Read a JSON or YAML config file; ConfigError naming the file and field."""
    if path is None:
        return AgentConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("", str(e.strerror or e), document=str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        import yaml  # YAML is a superset; try it only when JSON fails

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            # PyYAML's message spans lines with a source excerpt; keep its problem and place.
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError("", f"neither JSON nor YAML: {problem}{where}",
                              document=str(path)) from None
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise e.in_document(str(path)) from None
