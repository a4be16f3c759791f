"""The one codec of the Allocation record (pod annotation `railyard.dev/allocation`).

Every component reads and writes the decision through these functions. Decoding validates
everything and names the offending field, because the input is a pod annotation anyone
with write access to the pod could have edited.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.topology.cpus import parse_cpulist
from railyard.topology.model import PCI_ADDRESS_RE, Distance

VERSION = 1
# A NUMA node id as `memoryBytes` keys name it: canonical ASCII decimal, so that no two keys
# name one node ("0" and "00") and int() never meets "²" or a 5,000-digit string.
_NUMA_KEY = re.compile(r"0|[1-9][0-9]{0,5}", re.ASCII)


class RecordError(ValueError):
    """A record that cannot be decoded; the message names the field."""


# ----------------------------------------------------------------------- encode


def format_decided_at(moment: datetime) -> str:
    """`decidedAt` as every writer stamps it: RFC 3339 in UTC, to the second.

    The caller supplies the moment (the core has no clock); one format keeps records from
    the scheduler and the node comparable.
    """
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")



def gpu_to_json(g: GpuRef) -> dict[str, Any]:
    return {"index": g.index, "pciAddress": g.pci_address, "uuid": g.uuid}


def nic_to_json(n: NicRef) -> dict[str, Any]:
    return {
        "kind": n.kind, "pciAddress": n.pci_address, "pfPciAddress": n.pf_pci_address,
        "vfIndex": n.vf_index, "rdmaDevice": n.rdma_device, "netdev": n.netdev,
    }


def allocation_to_json(a: Allocation) -> dict[str, Any]:
    return {
        "version": a.version,
        "node": a.node,
        "decidedBy": a.decided_by,
        "decidedAt": a.decided_at,
        "numaNodes": list(a.numa_nodes),
        "cpus": a.cpus,
        "memoryBytes": {str(numa): b for numa, b in a.memory_bytes},
        "pairs": [
            {"gpu": gpu_to_json(p.gpu), "nic": nic_to_json(p.nic), "distance": p.distance.name}
            for p in a.pairs
        ],
        "nics": [nic_to_json(n) for n in a.nics],
        "gpus": [gpu_to_json(g) for g in a.gpus],
    }


def encode_allocation(a: Allocation) -> str:
    """Compact JSON for the pod annotation."""
    return json.dumps(allocation_to_json(a), separators=(",", ":"))


# ----------------------------------------------------------------------- decode


def _get(d: dict, key: str, where: str, types: type | tuple[type, ...], *,
         nullable: bool = False, required: bool = True) -> Any:
    if key not in d:
        if required:
            raise RecordError(f"{where}.{key}: missing")
        return None
    v = d[key]
    if v is None and nullable:
        return None
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise RecordError(f"{where}.{key}: expected {_tname(types)}, got a boolean")
    if not isinstance(v, types):
        raise RecordError(f"{where}.{key}: expected {_tname(types)}, got {type(v).__name__}")
    return v


def _tname(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    names = {int: "integer", str: "string", list: "list", dict: "object"}
    return " or ".join(names.get(t, t.__name__) for t in ts)


def _pci(d: dict, key: str, where: str) -> str:
    v = _get(d, key, where, str)
    if not PCI_ADDRESS_RE.match(v):
        raise RecordError(f"{where}.{key}: not a PCI address (dddd:bb:dd.f, domain of 4 to 8 "
                          f"hex digits): {v[:40]!r}")
    return v


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise RecordError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def gpu_from_json(v: Any, where: str) -> GpuRef:
    d = _obj(v, where)
    index = _get(d, "index", where, int)
    if index < 0:
        raise RecordError(f"{where}.index: must not be negative")
    return GpuRef(index, _pci(d, "pciAddress", where),
                  _get(d, "uuid", where, str, nullable=True, required=False))


def nic_from_json(v: Any, where: str) -> NicRef:
    d = _obj(v, where)
    kind = _get(d, "kind", where, str)
    if kind not in ("vf", "pf"):
        raise RecordError(f"{where}.kind: expected 'vf' or 'pf', got {kind!r}")
    addr, pf = _pci(d, "pciAddress", where), _pci(d, "pfPciAddress", where)
    vf_index = _get(d, "vfIndex", where, int, nullable=True, required=False)
    if kind == "pf" and (pf != addr or vf_index is not None):
        raise RecordError(f"{where}: a whole PF has pfPciAddress == pciAddress and no vfIndex")
    if kind == "vf" and (vf_index is None or vf_index < 0 or pf == addr):
        raise RecordError(f"{where}: a VF needs a vfIndex ≥ 0 and a PF address of its own")
    return NicRef(kind, addr, pf, vf_index,
                  _get(d, "rdmaDevice", where, str, nullable=True, required=False),
                  _get(d, "netdev", where, str, nullable=True, required=False))


def allocation_from_json(v: Any, where: str = "allocation") -> Allocation:
    d = _obj(v, where)
    version = _get(d, "version", where, int)
    if version != VERSION:
        raise RecordError(f"{where}.version: unsupported version {version} (this reads {VERSION})")
    decided_by = _get(d, "decidedBy", where, str)
    if decided_by not in ("scheduler", "node"):
        raise RecordError(f"{where}.decidedBy: expected 'scheduler' or 'node', got {decided_by!r}")
    numa = _get(d, "numaNodes", where, list)
    for i, n in enumerate(numa):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RecordError(f"{where}.numaNodes[{i}]: expected a NUMA node id")
    cpus = _get(d, "cpus", where, str, nullable=True, required=False)
    if cpus:
        try:  # refuses ids beyond MAX_CPU before expanding a range, and non-ASCII digits
            parse_cpulist(cpus)
        except ValueError as e:
            raise RecordError(f"{where}.cpus: {e}") from None
    mem_raw = _get(d, "memoryBytes", where, dict, required=False) or {}
    memory: list[tuple[int, int]] = []
    for k, b in mem_raw.items():
        if not _NUMA_KEY.fullmatch(k):
            raise RecordError(f"{where}.memoryBytes: key {k[:40]!r} is not a NUMA node id "
                              "(a decimal number without leading zeros)")
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise RecordError(f"{where}.memoryBytes[{k}]: expected bytes as an integer")
        memory.append((int(k), b))
    pairs = []
    for i, p in enumerate(_get(d, "pairs", where, list)):
        pw = f"{where}.pairs[{i}]"
        pd = _obj(p, pw)
        dist = _get(pd, "distance", pw, str)
        try:
            distance = Distance.parse(dist)
        except ValueError as e:
            raise RecordError(f"{pw}.distance: {e}") from None
        pairs.append(Pair(gpu_from_json(pd.get("gpu"), f"{pw}.gpu"),
                          nic_from_json(pd.get("nic"), f"{pw}.nic"), distance))
    nics = [nic_from_json(n, f"{where}.nics[{i}]")
            for i, n in enumerate(_get(d, "nics", where, list, required=False) or [])]
    gpus = [gpu_from_json(g, f"{where}.gpus[{i}]")
            for i, g in enumerate(_get(d, "gpus", where, list, required=False) or [])]
    _same_nic_same_fields(pairs, nics, where)
    return Allocation(
        node=_get(d, "node", where, str),
        numa_nodes=tuple(numa),
        cpus=cpus,
        memory_bytes=tuple(sorted(memory)),
        pairs=tuple(pairs),
        nics=tuple(nics),
        gpus=tuple(gpus),
        decided_by=decided_by,  # type: ignore[arg-type]
        decided_at=_get(d, "decidedAt", where, str, nullable=True, required=False),
        version=version,
    )


def _same_nic_same_fields(pairs: list[Pair], nics: list[NicRef], where: str) -> None:
    """A NIC named twice (shared pairing) must be described the same way both times.

    `Allocation.all_nics` keeps the first mention of an address, so a second one with
    another PF, kind or VF index would be silently dropped by every reader.
    """
    first: dict[str, tuple[NicRef, str]] = {}
    named = [(p.nic, f"{where}.pairs[{i}].nic") for i, p in enumerate(pairs)]
    named += [(n, f"{where}.nics[{i}]") for i, n in enumerate(nics)]
    for nic, at in named:
        seen = first.setdefault(nic.pci_address, (nic, at))
        if seen[0] != nic:
            raise RecordError(f"{at}: {nic.pci_address} is also {seen[1]}, "
                              "with other fields")


def decode_allocation(text: str | bytes, where: str = "allocation") -> Allocation:
    """Parse the annotation string; RecordError (naming the field) on anything malformed."""
    try:
        data = json.loads(text)
    except ValueError as e:  # also bad UTF-8 and integers past Python's 4,300-digit limit
        raise RecordError(f"{where}: not valid JSON: {e}") from None
    except RecursionError:  # "[[[[…" nested deeper than the parser's stack
        raise RecordError(f"{where}: not valid JSON: nested too deeply") from None
    return allocation_from_json(data, where)
