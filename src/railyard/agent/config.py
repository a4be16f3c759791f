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
    devinfoDir: /var/run/k8s.cni.cncf.io/devinfo/dp
    cniDevinfoDir: /var/run/k8s.cni.cncf.io/devinfo/cni   # the in-process CNI service's
    healthIntervalS: 1
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.kubelet.selectors import PfName, Selector
from railyard.node.paths import CNI_DEVINFO_DIR, DEVINFO_DIR

# sriov-dp link type names, and the sysfs link_layer values they stand for.
_LINK_TYPES = {"ether": "Ethernet", "ethernet": "Ethernet", "eth": "Ethernet",
               "infiniband": "InfiniBand", "ib": "InfiniBand"}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    resources: ResourceNames = DEFAULT_RESOURCES
    gpu_plugin: bool = True
    vf_plugin: bool = True
    pf_plugin: bool = True
    vf_pool: tuple[Selector, ...] = ()
    pf_pool: tuple[Selector, ...] = ()
    devinfo_dir: str = DEVINFO_DIR
    cni_devinfo_dir: str = CNI_DEVINFO_DIR  # where --cni-socket's service writes them
    health_interval_s: float = 1.0
    verify_delay_s: float = 1.0  # PodResources check after an Allocate


# ----------------------------------------------------------------------- parsing


def _hex_ids(v: Any, where: str) -> frozenset[str]:
    out = set()
    for i, x in enumerate(_strings(v, where)):
        s = x.lower().removeprefix("0x")
        if not s or len(s) > 4 or any(c not in "0123456789abcdef" for c in s):
            raise ConfigError(f"{where}[{i}]: expected a 4-digit hex PCI id, got {x!r}")
        out.add(s.rjust(4, "0"))
    return frozenset(out)


def _strings(v: Any, where: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}: expected a list of strings")
    return v


def _pf_name(text: str, where: str) -> PfName:
    name, sep, rng = text.partition("#")
    if not name:
        raise ConfigError(f"{where}: empty PF name")
    if not sep:
        return PfName(name)
    lo, dash, hi = rng.partition("-")
    try:
        first = int(lo)
        last = int(hi) if dash else first
    except ValueError:
        raise ConfigError(f"{where}: VF range must be N or N-M, got {rng!r}") from None
    if first < 0 or last < first:
        raise ConfigError(f"{where}: VF range {rng!r} is empty or negative")
    return PfName(name, first, last)


def parse_selector(v: Any, where: str) -> Selector:
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: expected an object")
    known = {"vendors", "devices", "drivers", "pfNames", "linkTypes"}
    unknown = sorted(set(v) - known)
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}: unknown selector (known: {', '.join(sorted(known))})")
    links = set()
    for i, t in enumerate(_strings(v.get("linkTypes", []), f"{where}.linkTypes")):
        if t.lower() not in _LINK_TYPES:
            raise ConfigError(f"{where}.linkTypes[{i}]: expected ether or infiniband, got {t!r}")
        links.add(_LINK_TYPES[t.lower()])
    return Selector(
        vendors=_hex_ids(v.get("vendors", []), f"{where}.vendors"),
        devices=_hex_ids(v.get("devices", []), f"{where}.devices"),
        drivers=frozenset(_strings(v.get("drivers", []), f"{where}.drivers")),
        pf_names=tuple(_pf_name(p, f"{where}.pfNames[{i}]")
                       for i, p in enumerate(_strings(v.get("pfNames", []), f"{where}.pfNames"))),
        link_types=frozenset(links),
    )


def _bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{key}: expected true or false")
    return v


def _seconds(d: dict, key: str, default: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 3600:
        raise ConfigError(f"{key}: expected seconds, 0 < s ≤ 3600")
    return float(v)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


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
            _DNS_LABEL.match(label) for label in prefix.split(".")):
        return "the part before '/' must be a lower-case DNS subdomain"
    if not _NAME.match(short) or len(short) > 63:
        return ("the part after '/' must be at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def config_from_dict(d: Any) -> AgentConfig:
    if d is None:
        return AgentConfig()
    if not isinstance(d, dict):
        raise ConfigError("config: expected an object at the top level")
    known = {"resources", "gpuPlugin", "vfPlugin", "pfPlugin", "pools", "devinfoDir",
             "cniDevinfoDir", "healthIntervalS", "verifyDelayS"}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    res = d.get("resources", {})
    if not isinstance(res, dict) or set(res) - {"gpu", "vf", "pf"}:
        raise ConfigError("resources: expected an object with keys gpu, vf, pf")
    names = {}
    for k, v in res.items():
        why = extended_resource_problem(v)
        if why is not None:
            raise ConfigError(f"resources.{k}: {v!r} is not an extended resource name "
                              f"(domain/name) kubelet accepts: {why}")
        names[k] = v
    resources = ResourceNames(**names)
    if len(set(resources.managed)) != 3:
        raise ConfigError("resources: the three resource names must differ")
    pools = d.get("pools", {})
    if not isinstance(pools, dict) or set(pools) - {"vf", "pf"}:
        raise ConfigError("pools: expected an object with keys vf, pf")

    def pool(kind: str) -> tuple[Selector, ...]:
        raw = pools.get(kind, [])
        if not isinstance(raw, list):
            raise ConfigError(f"pools.{kind}: expected a list of selectors")
        return tuple(parse_selector(s, f"pools.{kind}[{i}]") for i, s in enumerate(raw))

    devinfo = d.get("devinfoDir", DEVINFO_DIR)
    if not isinstance(devinfo, str) or not devinfo:
        raise ConfigError("devinfoDir: expected a folder path")
    cni_devinfo = d.get("cniDevinfoDir", CNI_DEVINFO_DIR)
    if not isinstance(cni_devinfo, str) or not cni_devinfo:
        raise ConfigError("cniDevinfoDir: expected a folder path")
    return AgentConfig(
        resources=resources,
        gpu_plugin=_bool(d, "gpuPlugin", True),
        vf_plugin=_bool(d, "vfPlugin", True),
        pf_plugin=_bool(d, "pfPlugin", True),
        vf_pool=pool("vf"),
        pf_pool=pool("pf"),
        devinfo_dir=devinfo,
        cni_devinfo_dir=cni_devinfo,
        health_interval_s=_seconds(d, "healthIntervalS", 1.0),
        verify_delay_s=_seconds(d, "verifyDelayS", 1.0),
    )


def load_config(path: str | os.PathLike[str] | None) -> AgentConfig:
    """Read a JSON or YAML config file; ConfigError naming the file and field."""
    if path is None:
        return AgentConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
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
            raise ConfigError(f"{path}: neither JSON nor YAML: {problem}{where}") from None
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
