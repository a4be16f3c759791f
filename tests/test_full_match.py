"""Every validator in src/railyard matches its whole input: nothing ending in "\\n" gets through.

Python's `$` matches before a final newline and `re.match` anchors only the start, so
`re.compile(r"^[0-9a-f:]+$").match("02:00:00:00:00:01\\n")` succeeds (issue 19, class 4). Two
parts:

- a static sweep of the source: no `.match` anywhere (use `.fullmatch`, or `.search` for a
  pattern of forbidden characters), no `$` in any pattern, and every compiled pattern covered
  by a validator in `VALIDATORS` below — a new pattern fails here until it is added;
- each validator fed its good value with a trailing (or leading) newline, carriage return,
  space, tab, NUL, Unicode line separator, and with a non-ASCII digit: each is refused, with
  an error naming the field where the validator raises one.
"""

from __future__ import annotations

import ast
import functools
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import railyard
from railyard.agent.config import (
    ConfigError,
    _pf_name,
    config_from_dict,
    extended_resource_problem,
)
from railyard.allocation.request import RequestError, parse_quantity
from railyard.cli.scheduler import parse_listen
from railyard.cni.devices import netdev_of
from railyard.cni.grants import StoreGrants
from railyard.cni.spec import (
    CniError,
    PodArgs,
    check_ifname,
    parse_cni_args,
    parse_env,
    parse_netconf,
    version_key,
)
from railyard.discovery.discover import _number_after, is_representor
from railyard.discovery.sysfs import parent_pcie_parts
from railyard.kubelet.pods import PodError, pod_view
from railyard.node.errors import StateError
from railyard.node.pairfiles import PairFiles
from railyard.node.state import StateStore, is_pod_uid
from railyard.records.allocation import RecordError, decode_allocation
from railyard.records.fields import FieldError, Fields
from railyard.records.koordinator import rdma_minor
from railyard.sim.trace import TraceError, _int
from railyard.topology.cpus import parse_cpulist
from railyard.topology.model import is_vfio_driver

SRC = Path(railyard.__file__).resolve().parent
REFUSED = "refused"  # what a yes/no validator's verdict says when it says no


@dataclass(frozen=True)
class Validator:
    """One validator: the patterns it applies, a value it takes, and its verdict on a value
    (None: taken; else the error message, or REFUSED for a yes/no answer)."""

    name: str
    patterns: tuple[str, ...]  # "module.NAME" of each compiled pattern it uses
    good: str
    verdict: Callable[[str], str | None]
    names: str = ""  # a regex the error message must match: the field it names
    # ASCII whitespace around the value is stripped on purpose (and said why in the source):
    # such variants must read as the good value, everything else must be refused.
    trims: bool = False
    # Its digits are numbers (else a digit is one character among others: an interface name
    # may hold "١", as the kernel allows any UTF-8).
    digits: bool = True


def _raises(kind: type[Exception], call: Callable[[str], object]) -> Callable[[str], str | None]:
    def verdict(value: str) -> str | None:
        try:
            call(value)
        except kind as e:
            return str(e)
        return None
    return verdict


def _yes_no(ok: Callable[[str], bool]) -> Callable[[str], str | None]:
    return lambda value: None if ok(value) else REFUSED


def _cni(call: Callable[[str], object]) -> Callable[[str], str | None]:
    def verdict(value: str) -> str | None:
        try:
            call(value)
        except CniError as e:
            return f"code {e.code}: {e.msg}"
        return None
    return verdict


def _env(**override: str) -> dict[str, str]:
    return {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/run/netns/x",
            "CNI_IFNAME": "net1", **override}


def _netconf(**override: object) -> dict[str, object]:
    return {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", **override}


def _allocation(cpus: str) -> None:
    decode_allocation('{"version":1,"node":"n","decidedBy":"scheduler","numaNodes":[0],'
                      f'"cpus":{_json(cpus)},"memoryBytes":{{}},"pairs":[]}}')


def _memory_key(key: str) -> None:
    decode_allocation('{"version":1,"node":"n","decidedBy":"scheduler","numaNodes":[0],'
                      f'"memoryBytes":{{{_json(key)}:1}},"pairs":[]}}')


def _json(s: str) -> str:
    import json
    return json.dumps(s)


@functools.cache
def _grants() -> StoreGrants:
    return StoreGrants(StateStore(tempfile.mkdtemp(prefix="ry-sweep-"), node="n"))


def _store_get(tmp: Path) -> Callable[[str], object]:
    return StateStore(tmp, node="n").get


def _representor_or_uplink(name: str) -> bool:
    return is_representor(name)


def _root_complex(part: str) -> bool:
    return parent_pcie_parts("/sys/devices", f"/sys/devices/{part}/0000:00:01.0") is not None


def _bdf(part: str) -> bool:
    got = parent_pcie_parts("/sys/devices", f"/sys/devices/pci0000:00/{part}")
    return got is not None and got[1] == [part]


def _number(name: str) -> bool:
    return _number_after("virtfn", name) is not None


def _pod_problem(metadata: dict[str, str]) -> str | None:
    try:
        pod_view({"metadata": metadata, "spec": {"containers": [{"name": "c"}]}})
    except PodError as e:
        return str(e)
    return None


def _trace_int(cell: str) -> None:
    _int({"gpus": cell}, "gpus", "trace t, row 2")


VALIDATORS: list[Validator] = [
    # ---- CNI: the runtime's environment and the network config
    Validator("CNI_CONTAINERID", ("railyard.cni.spec._CONTAINER_ID",), "c0ffee",
              _cni(lambda v: parse_env(_env(CNI_CONTAINERID=v))), r"code 4: CNI_CONTAINERID"),
    Validator("CNI_IFNAME", ("railyard.node.ifnames._BAD",), "net1",
              _cni(lambda v: parse_env(_env(CNI_IFNAME=v))), r"code 4: CNI_IFNAME", digits=False),
    Validator("config ifname", (), "net1", _cni(lambda v: check_ifname(v, "ifname")),
              r"code 4: ifname", digits=False),
    Validator("network name", ("railyard.cni.spec._NET_NAME",), "rdma",
              _cni(lambda v: parse_netconf(_netconf(name=v))), r"code 7: name"),
    Validator("plugin type", (), "railyard-cni",
              _cni(lambda v: parse_netconf(_netconf(type=v))), r"code 7: type"),
    Validator("ipam type", ("railyard.cni.spec._PLUGIN_TYPE",), "host-local",
              _cni(lambda v: parse_netconf(_netconf(ipam={"type": v}))), r"code 7: ipam\.type"),
    Validator("mac", ("railyard.cni.spec._MAC",), "02:00:00:00:00:01",
              _cni(lambda v: parse_netconf(_netconf(mac=v))), r"code 7: mac"),
    Validator("runtimeConfig.mac", (), "02:00:00:00:00:01",
              _cni(lambda v: parse_netconf(_netconf(runtimeConfig={"mac": v}))),
              r"code 7: runtimeConfig\.mac"),
    Validator("interfaces[].mac", (), "02:00:00:00:00:01",
              _cni(lambda v: parse_netconf(_netconf(interfaces=[{"mac": v}]))),
              r"code 7: interfaces\[0\]\.mac"),
    Validator("CNI_ARGS K8S_POD_UID", (), "6f1c0a3e-0000-4000-8000-000000000001",
              _cni(lambda v: _grants().grant(PodArgs(uid=v))), r"code 4: CNI_ARGS: K8S_POD_UID"),
    Validator("CNI_ARGS IgnoreUnknown", (), "true",
              _cni(lambda v: parse_cni_args(f"IgnoreUnknown={v}")), r"code 4: CNI_ARGS"),
    Validator("IPAM version", (), "1.0.0", _raises(ValueError, version_key), r"not a version"),
    Validator("granted PCI address", (), "0000:13:00.1",
              _cni(lambda v: netdev_of("/nonexistent", v)), r"code 5: .*not a PCI address"),
    # ---- records: every document's PCI address, cpulists, NUMA keys
    Validator("record PCI address", ("railyard.topology.model.PCI_ADDRESS_RE",), "0000:13:00.1",
              _raises(FieldError, lambda v: Fields({"a": v}, "x").pci_address("a")),
              r"x\.a: not a PCI address"),
    Validator("record cpulist", (), "0-3,8",
              _raises(RecordError, _allocation), r"allocation\.cpus"),
    Validator("memoryBytes key", ("railyard.records.allocation._NUMA_KEY",), "1",
              _raises(RecordError, _memory_key), r"allocation\.memoryBytes: key"),
    Validator("cpulist element", ("railyard.topology.cpus._ELEMENT",), "0-3",
              _raises(ValueError, lambda v: parse_cpulist(f"8,{v},9")),
              r"bad CPU list element"),
    Validator("Koordinator rdma minor", ("railyard.records.koordinator._MLX5",), "mlx5_3",
              _yes_no(lambda v: rdma_minor(v) == 3)),
    # ---- node state, agent config, requests, the CLI
    Validator("pod namespace", ("railyard.records.fields._DNS_LABEL",), "team-a",
              lambda v: _pod_problem({"uid": "u", "name": "p", "namespace": v}),
              r"metadata\.namespace: expected a namespace"),
    Validator("pair file container name", (), "main",
              _raises(StateError, lambda v: PairFiles("/nonexistent").path(
                  "6f1c0a3e-0000-4000-8000-000000000001", v)), r"is not a container name"),
    Validator("pair map podIfname", (), "net1",
              _raises(ConfigError, lambda v: config_from_dict({"pairMap": {"podIfname": v}})),
              r"pairMap\.podIfname", digits=False),
    Validator("pod UID", ("railyard.node.state._UID",), "6f1c0a3e-0000-4000-8000-000000000001",
              _yes_no(is_pod_uid)),
    Validator("extended resource prefix", ("railyard.agent.config._DNS_LABEL",), "nvidia.com",
              lambda v: extended_resource_problem(f"{v}/gpu"), r"the part before"),
    Validator("extended resource name", ("railyard.agent.config._NAME",), "vf_pool",
              lambda v: extended_resource_problem(f"rdma/{v}"), r"the part after"),
    Validator("pfNames VF range", ("railyard.agent.config._VF_RANGE",), "0-3",
              _raises(ConfigError, lambda v: _pf_name(f"ens1f0#{v}", "pfNames[0]")),
              r"pfNames\[0\]: VF range"),
    # Kubernetes strips ASCII whitespace around a quantity too (Quantity.UnmarshalJSON).
    Validator("quantity", ("railyard.allocation.request._QUANTITY",), "64Gi",
              _raises(RequestError, lambda v: parse_quantity(v, "memory")), r"^memory: ",
              trims=True),
    Validator("--listen port", (), "8888",
              _raises(ValueError, lambda v: parse_listen(f"127.0.0.1:{v}")), r"--listen"),
    # ---- discovery: names the kernel writes (sysfs entries, driver and port names)
    Validator("root complex folder", ("railyard.discovery.sysfs.ROOT_COMPLEX_RE",),
              "pci0000:00", _yes_no(_root_complex)),
    Validator("PCI function folder", (), "0000:00:01.0", _yes_no(_bdf)),
    Validator("representor port name", ("railyard.discovery.discover._REPRESENTOR_RE",),
              "pf0vf3", _yes_no(_representor_or_uplink)),
    Validator("sysfs entry number", ("railyard.discovery.discover._DECIMAL_RE",), "virtfn12",
              _yes_no(_number)),
    Validator("VFIO driver", ("railyard.topology.model._VFIO_DRIVER_RE",), "mlx5_vfio_pci",
              _yes_no(is_vfio_driver)),
    # ---- the simulator's traces: a CSV cell's surrounding ASCII whitespace is the CSV's
    Validator("trace number", ("railyard.sim.trace._WHOLE", "railyard.sim.trace._DECIMAL"),
              "8", _raises(TraceError, _trace_int), r"column gpus", trims=True),
]

_ASCII_SPACE = (" ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c")
SUFFIXES = (*_ASCII_SPACE, "\x00", "\u2028", "\u0085", "\u00a0", "\n\x00")
PREFIXES = ("\n", " ", "\x00")


def _variants(good: str, digits: bool) -> list[tuple[str, str, bool]]:
    """(label, value, only ASCII whitespace added) for each hostile form of `good`."""
    out = [(f"suffix {s!r}", good + s, all(c in " \t\n\r\x0b\x0c" for c in s)) for s in SUFFIXES]
    out += [(f"prefix {p!r}", p + good, p == "\n" or p == " ") for p in PREFIXES]
    digit = next((c for c in good if c in "0123456789"), None) if digits else None
    if digit is not None:  # "３" and "٣" are digits to int(), \d and str.isdigit()
        for other in (chr(ord(digit) - ord("0") + 0xFF10), chr(ord(digit) - ord("0") + 0x0660)):
            out.append((f"non-ASCII digit {other!r}", good.replace(digit, other, 1), False))
    return out


def _cases() -> list[tuple[Validator, str, str, bool]]:
    return [(v, label, value, ascii_space) for v in VALIDATORS
            for label, value, ascii_space in _variants(v.good, v.digits)]


@pytest.mark.parametrize("validator", VALIDATORS, ids=lambda v: v.name)
def test_each_validator_takes_its_good_value(validator: Validator) -> None:
    assert validator.verdict(validator.good) is None


@pytest.mark.parametrize("validator, label, value, ascii_space", _cases(),
                         ids=[f"{v.name}: {label}" for v, label, _, _ in _cases()])
def test_a_value_with_a_trailing_newline_or_other_edge_is_refused_naming_the_field(
        validator: Validator, label: str, value: str, ascii_space: bool) -> None:
    verdict = validator.verdict(value)
    if validator.trims and ascii_space:
        assert verdict is None, f"{validator.name}: {value!r} should read as {validator.good!r}"
        return
    assert verdict is not None, f"{validator.name} took {value!r} ({label})"
    if validator.names:
        assert re.search(validator.names, verdict), verdict


def test_a_pod_uid_that_is_not_one_is_a_state_error_naming_the_uid(tmp_path: Path) -> None:
    get = _store_get(tmp_path)
    with pytest.raises(StateError, match="uid: not a usable pod UID"):
        get("6f1c0a3e\n")


# ----------------------------------------------------------------------- the static sweep


def _sources() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue  # protoc's output
        module = "railyard." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        out.append((module.removesuffix(".__init__"), ast.parse(path.read_text(), str(path))))
    return out


def _pattern(call: ast.Call) -> str | None:
    """The literal pattern of `re.<fn>(pattern, ...)`, or None."""
    func = call.func
    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id == "re" and call.args
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return call.args[0].value
    return None


def _has_dollar(pattern: str) -> bool:
    return "$" in re.sub(r"\\.", "", pattern)


def test_no_validator_in_the_source_matches_only_a_prefix() -> None:
    problems = []
    compiled: set[str] = set()
    for module, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "match":
                problems.append(f"{module}:{node.lineno}: .match checks a prefix only; use "
                                ".fullmatch (or .search for forbidden characters)")
            if isinstance(node, ast.Call):
                pattern = _pattern(node)
                if pattern is not None and _has_dollar(pattern):
                    problems.append(f"{module}:{node.lineno}: {pattern!r} has '$', which "
                                    "matches before a final newline; use .fullmatch or \\Z")
        for stmt in tree.body:
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Attribute)
                    and stmt.value.func.attr == "compile" and _pattern(stmt.value) is not None):
                compiled.update(f"{module}.{t.id}" for t in stmt.targets
                                if isinstance(t, ast.Name))
    assert not problems, "\n".join(problems)
    swept = {p for v in VALIDATORS for p in v.patterns}
    assert compiled - swept == set(), (
        "compiled patterns no validator in tests/test_full_match.py sweeps: add one")
    assert swept - compiled == set(), "VALIDATORS names patterns the source no longer has"
