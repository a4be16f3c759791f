"""The one codec of the Allocation record (pod annotation `railyard.dev/allocation`).

Every component reads and writes the decision through these functions. Decoding validates
everything and names the offending field (`records.fields`), because the input is a pod
annotation anyone with write access to the pod could have edited.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from railyard.allocation.types import Affinity, Allocation, GpuRef, NicRef, Pair
from railyard.records.fields import FieldError, Fields, kind_of
from railyard.topology.model import Distance
from railyard.topology.rails import MAX_RAIL

VERSION = 1
# Kubernetes refuses a pod whose annotations together exceed 256 KiB
# (TotalAnnotationSizeLimitB); a record larger than that never came from the API server, and
# refusing it before parsing bounds what one costs every reader.
MAX_RECORD_BYTES = 256 << 10
# A NUMA node id as `memoryBytes` keys name it: canonical ASCII decimal, so that no two keys
# name one node ("0" and "00") and int() never meets "²" or a 5,000-digit string.
_NUMA_KEY = re.compile(r"0|[1-9][0-9]{0,5}", re.ASCII)


class RecordError(FieldError):
    """A record that cannot be decoded (or encoded for a node): `path` names the field."""


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
    out: dict[str, Any] = {
        "kind": n.kind, "pciAddress": n.pci_address, "pfPciAddress": n.pf_pci_address,
        "vfIndex": n.vf_index, "rdmaDevice": n.rdma_device, "netdev": n.netdev,
    }
    if n.pool is not None:  # absent: the default pool, as every record before pools says
        out["pool"] = n.pool
    if n.bandwidth is not None:  # absent: no share asked, as every record before 0093 says
        out["bandwidth"] = n.bandwidth
    return out


def allocation_to_json(a: Allocation) -> dict[str, Any]:
    return {
        "version": a.version,
        "node": a.node,
        "decidedBy": a.decided_by,
        "decidedAt": a.decided_at,
        "numaNodes": list(a.numa_nodes),
        "cpus": a.cpus,
        "memoryBytes": {str(numa): b for numa, b in a.memory_bytes},
        "pairs": [pair_to_json(p) for p in a.pairs],
        "nics": [nic_to_json(n) for n in a.nics],
        "gpus": [gpu_to_json(g) for g in a.gpus],
        # Last, and only when set: a record without it reads as every record before
        # preferences did, and readers before it ignore a key they do not know (0091).
        **({} if a.affinity is None else {"affinity": affinity_to_json(a.affinity)}),
    }


def affinity_to_json(a: Affinity) -> dict[str, Any]:
    return {"preferred": a.preferred.name, "achieved": a.achieved.name}


def pair_to_json(p: Pair) -> dict[str, Any]:
    out: dict[str, Any] = {"gpu": gpu_to_json(p.gpu), "nic": nic_to_json(p.nic),
                           "distance": p.distance.name}
    if p.rail is not None:  # absent: rail not known, as every record before rails says
        out["rail"] = p.rail
    return out


def encode_allocation(a: Allocation) -> str:
    """Compact JSON for the pod annotation."""
    return json.dumps(allocation_to_json(a), separators=(",", ":"))


# ----------------------------------------------------------------------- decode


def gpu_from_json(v: Any, where: str) -> GpuRef:
    f = Fields(v, where, RecordError)
    return GpuRef(f.integer("index"), f.pci_address("pciAddress"), f.string_or_null("uuid"))


def nic_from_json(v: Any, where: str) -> NicRef:
    f = Fields(v, where, RecordError)
    kind = f.one_of("kind", ("vf", "pf"))
    addr, pf = f.pci_address("pciAddress"), f.pci_address("pfPciAddress")
    vf_index = f.integer_or_null("vfIndex")
    if kind == "pf" and (pf != addr or vf_index is not None):
        f.fail("", "a whole PF has pfPciAddress == pciAddress and no vfIndex")
    if kind == "vf" and (vf_index is None or pf == addr):
        f.fail("", "a VF needs a vfIndex ≥ 0 and a PF address of its own")
    pool = f.string_or_null("pool") if "pool" in f else None
    if pool is not None and (kind == "pf" or pool.count("/") != 1
                             or not all(pool.partition("/")[::2])):
        f.fail("pool", "only a VF has a pool, named by its resource name (domain/name)")
    bandwidth = f.integer("bandwidth", 1, 100) if "bandwidth" in f else None
    if bandwidth is not None and kind == "pf":
        f.fail("bandwidth", "only a VF has a bandwidth share (a whole PF counts 100)")
    return NicRef(kind, addr, pf, vf_index,  # type: ignore[arg-type]
                  f.string_or_null("rdmaDevice"), f.string_or_null("netdev"), pool, bandwidth)


def allocation_from_json(v: Any, where: str = "allocation") -> Allocation:
    f = Fields(v, where, RecordError)
    version = f.integer("version", minimum=None)
    if version != VERSION:
        f.fail("version", f"unsupported version {version} (this reads {VERSION})")
    decided_by = f.one_of("decidedBy", ("scheduler", "node"))
    numa = f.array("numaNodes")
    for i, n in enumerate(numa):
        if type(n) is not int or n < 0:
            f.fail(f"numaNodes[{i}]", "expected a NUMA node id (an integer ≥ 0), got "
                                      f"{n if type(n) is int else kind_of(n)}")
    cpus = f.string_or_null("cpus")
    if cpus:
        f.cpulist("cpus")
    memory: list[tuple[int, int]] = []
    for k, b in f.object("memoryBytes", optional=True).d.items():
        if type(k) is not str or not _NUMA_KEY.fullmatch(k):
            f.fail("memoryBytes", f"key {str(k)[:40]!r} is not a NUMA node id "
                                  "(a decimal number without leading zeros)")
        if type(b) is not int or b < 0:
            f.fail(f"memoryBytes[{k}]", "expected bytes as an integer ≥ 0, got "
                                           f"{b if type(b) is int else kind_of(b)}")
        memory.append((int(k), b))
    pairs = []
    for p in f.objects("pairs"):
        try:
            distance = Distance.parse(p.string("distance"))
        except ValueError as e:
            p.fail("distance", str(e))
        pairs.append(Pair(gpu_from_json(p.get("gpu"), p.at("gpu")),
                          nic_from_json(p.get("nic"), p.at("nic")), distance,
                          None if p.get("rail") is None else p.integer("rail", 0, MAX_RAIL)))
    nics = [nic_from_json(n, at) for n, at in f.items("nics", optional=True)]
    gpus = [gpu_from_json(g, at) for g, at in f.items("gpus", optional=True)]
    _same_nic_same_fields(pairs, nics, where)
    # What the extender achieved when it decided. Not checked against the pairs: a node
    # that re-pairs a record (decidedBy: node) keeps the rest of it, and an advisory field
    # must never make the node's truth unreadable; `railyard explain` shows both.
    affinity = (None if f.get("affinity") is None
                else affinity_from_json(f.get("affinity"), f.at("affinity")))
    return Allocation(
        node=f.string("node"),
        numa_nodes=tuple(numa),
        cpus=cpus,
        memory_bytes=tuple(sorted(memory)),
        pairs=tuple(pairs),
        nics=tuple(nics),
        gpus=tuple(gpus),
        decided_by=decided_by,  # type: ignore[arg-type]
        decided_at=f.string_or_null("decidedAt"),
        version=version,
        affinity=affinity,
    )


def affinity_from_json(v: Any, where: str) -> Affinity:
    """`affinity: {preferred, achieved}`. Keys it does not know are ignored, as the record's
    are: a later writer may say more (docs/decisions/0091)."""
    f = Fields(v, where, RecordError)
    levels = [d.name for d in Distance]
    preferred = f.one_of("preferred", levels)
    achieved = f.one_of("achieved", levels)
    return Affinity(Distance[preferred], Distance[achieved])


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
            raise RecordError(at, f"{nic.pci_address} is also {seen[1]}, with other fields")


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object naming a key twice is refused: json keeps the last value, and the admission
    policy (deploy/chart: templates/admission-policy.yaml) reads the first `decidedBy`."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:40]!r} appears twice in one object")
        out[key] = value
    return out


def decode_allocation(text: str | bytes, where: str = "allocation") -> Allocation:
    """Parse the annotation string; RecordError (naming the field) on anything malformed.

    Its cost is bounded before any work: at most MAX_RECORD_BYTES (characters, for a str),
    and nothing in it expands (cpulists are checked range by range).
    """
    if len(text) > MAX_RECORD_BYTES:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise RecordError(where, f"{len(text)} {unit}, larger than the {MAX_RECORD_BYTES} "
                                 "bytes Kubernetes allows for all of a pod's annotations")
    try:
        data = json.loads(text, object_pairs_hook=_one_value_per_key)
    except ValueError as e:  # also bad UTF-8 and integers past Python's 4,300-digit limit
        raise RecordError(where, f"not valid JSON: {e}") from None
    except RecursionError:  # "[[[[…" nested deeper than the parser's stack
        raise RecordError(where, "not valid JSON: nested too deeply") from None
    return allocation_from_json(data, where)
