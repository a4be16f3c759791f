"""What a pod asks for: GPUs, VFs, PFs, CPUs and memory, plus optional placement hints.

Parsed once at the boundary from a v1 Pod (a plain dict, as the API server or
kube-scheduler sends it); inside, the allocator trusts the `Request` value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from railyard.allocation.names import DEFAULT_RESOURCES, REQUEST_ANNOTATION, ResourceNames
from railyard.topology.model import Distance

NumaPolicy = Literal["single", "preferred", "none"]
Pairing = Literal["one-to-one", "shared", "none"]
RailPolicy = Literal["required", "preferred", "none"]
NUMA_POLICIES: tuple[NumaPolicy, ...] = ("single", "preferred", "none")
PAIRINGS: tuple[Pairing, ...] = ("one-to-one", "shared", "none")
RAIL_POLICIES: tuple[RailPolicy, ...] = ("required", "preferred", "none")


class RequestError(ValueError):
    """A malformed pod request or hint; `field` names where, for the user."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Request:
    gpus: int = 0
    vfs: int = 0
    pfs: int = 0
    exclusive_cpus: int = 0  # CPUs kubelet pins (whole-CPU containers of a Guaranteed pod)
    memory_bytes: int = 0
    max_distance: Distance | None = None  # hard limit for every pair
    numa: NumaPolicy = "preferred"
    pairing_hint: Pairing | None = None  # None: the default for the counts (see `pairing`)
    # VFs of pools other than the default (`vfs`): (resource name, count > 0), sorted by name.
    pool_vfs: tuple[tuple[str, int], ...] = ()
    # The pool whose VFs pair with the GPUs (docs/decisions/0085); None: the default pool.
    # Every other pool's VFs are unpaired NICs of the Allocation.
    pair_pool: str | None = None
    # The rail sequence of the pod's job (docs/rails.md): pair i wants rail `rails[i]` (None:
    # any). Not from the pod itself: the extender fills it from the records of the job's
    # pods already bound. `rail_policy` (the `rails` hint) says how hard: `required` makes a
    # mismatch infeasible, `preferred` counts mismatches in the key, `none` ignores them.
    rails: tuple[int | None, ...] = ()
    rail_policy: RailPolicy = "preferred"
    # The `preferDistance` hint (docs/decisions/0091): the worst pair the pod would like.
    # Never a limit: the allocator places the best worst pair the node has, as without it;
    # it steers the node score (`scored_preference`) and is recorded with what was achieved.
    prefer_distance: Distance | None = None
    # The `vfBandwidth` hint (docs/decisions/0093): each VF's share of its PF's line rate, in
    # percent (1–100; 0: none asked). The VFs of one PF never hold more than 100 between
    # them (a whole PF counts 100); VFs that ask none count 0.
    vf_bandwidth: int = 0

    def __post_init__(self) -> None:
        for name in ("gpus", "vfs", "pfs", "exclusive_cpus", "memory_bytes"):
            if getattr(self, name) < 0:
                raise RequestError(name, "must not be negative")
        if not 0 <= self.vf_bandwidth <= 100:
            raise RequestError("vfBandwidth", "a percentage of one PF's line rate, 1–100")
        if self.vf_bandwidth and len(self.vf_counts) != 1:
            raise RequestError("vfBandwidth", "applies to the VFs of one pool: the pod asks "
                               + ("no VFs" if not self.vf_counts else "VFs of several pools"))
        names = [n for n, _ in self.pool_vfs]
        if names != sorted(set(names)) or any(c <= 0 for _, c in self.pool_vfs):
            raise RequestError("pool_vfs", "expected (pool, count > 0) pairs sorted by pool")
        if self.pair_pool is not None and self.pair_pool not in names:
            raise RequestError("pairPool", f"the pod asks no VFs of {_short(self.pair_pool)}")

    @property
    def paired_vfs(self) -> int:
        """VFs of the pool that pairs with the GPUs."""
        if self.pair_pool is None:
            return self.vfs
        return dict(self.pool_vfs)[self.pair_pool]

    @property
    def vf_counts(self) -> tuple[tuple[str | None, int], ...]:
        """VFs asked per pool (None: the default pool), the paired pool first, then the
        others by name; pools asked none are left out."""
        counts: list[tuple[str | None, int]] = [(None, self.vfs)] if self.vfs else []
        counts += [(p, c) for p, c in self.pool_vfs]
        counts.sort(key=lambda pc: (pc[0] != self.pair_pool, pc[0] or ""))
        return tuple((p, c) for p, c in counts)

    @property
    def all_vfs(self) -> int:
        return self.vfs + sum(c for _, c in self.pool_vfs)

    @property
    def nics(self) -> int:
        """NICs that may pair with GPUs: the paired pool's VFs and whole PFs."""
        return self.paired_vfs + self.pfs

    @property
    def pairing(self) -> Pairing:
        """One-to-one when there are at least as many NICs as GPUs, shared when fewer."""
        if self.pairing_hint is not None:
            return self.pairing_hint
        if self.gpus == 0 or self.nics == 0:
            return "none"
        return "one-to-one" if self.nics >= self.gpus else "shared"

    @property
    def wants_devices(self) -> bool:
        return self.gpus > 0 or self.nics > 0 or bool(self.pool_vfs)

    @property
    def shape(self) -> tuple:
        """Hashable identity for memoising: two equal shapes get equal answers."""
        return (*self.search_shape, self.scored_preference)

    @property
    def search_shape(self) -> tuple:
        """`shape` without the preference: what the allocation depends on. A preference
        changes the node score, never the choice on a node, so the search memo is shared
        between pods that prefer and pods that do not."""
        return (self.gpus, self.vfs, self.pfs, self.exclusive_cpus, self.memory_bytes,
                self.max_distance, self.numa, self.pairing, self.pool_vfs, self.pair_pool,
                self.wanted_rails, self.rail_policy if self.wanted_rails else None,
                self.vf_bandwidth)

    @property
    def scored_preference(self) -> Distance | None:
        """The preference where it changes the node score, else None (docs/allocation.md,
        "Node score"): a preference looser than `maxDistance` is that limit; PIX and PXB
        are already where the score's tiers break, and SYS is met everywhere."""
        p = self.prefer_distance
        if p is None:
            return None
        if self.max_distance is not None and p > self.max_distance:
            p = self.max_distance
        return p if Distance.PXB < p < Distance.SYS else None

    @property
    def takes_job_rails(self) -> bool:
        """Whether the pod's job's rail sequence steers it (docs/rails.md): GPUs asked, and
        not `rail_policy: none`."""
        return self.gpus > 0 and self.rail_policy != "none"

    @property
    def wanted_rails(self) -> tuple[int | None, ...]:
        """The rail sequence the allocator weighs: none under `rail_policy: none`, and
        trailing unknowns dropped (they constrain nothing)."""
        if self.rail_policy == "none":
            return ()
        rails = self.rails
        while rails and rails[-1] is None:
            rails = rails[:-1]
        return rails


# ----------------------------------------------------------------------- quantities

_SUFFIX: dict[str, int | Fraction] = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
    "Pi": 1 << 50, "Ei": 1 << 60,
}
# Full-matched, ASCII digits only (\d and Fraction() would also take "３" and "٣").
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:[eE]([+-]?[0-9]+))?([a-zA-Z]{0,2})",
                       re.ASCII)
# Kubernetes keeps quantities in int64 (milli-units for CPU); anything larger is a typo or an
# attack. Bounding the text and the exponent first matters: Fraction("1e99999999") builds
# 10**99999999 and takes minutes, and a 5,000-digit number cannot even be converted.
_MAX_QUANTITY = (1 << 63) - 1
_MAX_QUANTITY_CHARS = 64
_MAX_EXPONENT = 64


def parse_quantity(text: Any, field: str) -> Fraction:
    """A Kubernetes resource quantity ("500m", "64Gi", "2", 4) as an exact fraction."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise RequestError(field, f"expected a quantity string, got {type(text).__name__}")
    if isinstance(text, int) and not -_MAX_QUANTITY <= text <= _MAX_QUANTITY:
        raise RequestError(field, "too large for a Kubernetes quantity")
    # The API server trims white space around a quantity (Quantity.UnmarshalJSON); ASCII's
    # only here, so "2\x00" or "2\u2028" is refused rather than read as 2.
    s = str(text).strip(" \t\n\r\v\f")
    m = _QUANTITY.fullmatch(s) if len(s) <= _MAX_QUANTITY_CHARS else None
    if not m or m.group(3) not in _SUFFIX:
        raise RequestError(field, f"not a Kubernetes quantity: {_short(text)}")
    exponent = int(m.group(2) or 0)
    if abs(exponent) > _MAX_EXPONENT:
        raise RequestError(field, f"exponent out of range: {_short(text)}")
    value = Fraction(m.group(1)) * Fraction(10) ** exponent * _SUFFIX[m.group(3)]
    if value < 0:
        raise RequestError(field, f"must not be negative: {text!r}")
    if value > _MAX_QUANTITY:
        raise RequestError(field, f"too large for a Kubernetes quantity: {text!r}")
    return value


def _short(value: Any) -> str:
    """At most 40 characters of `value`'s repr, for an error message."""
    if isinstance(value, int) and abs(value) >= 10**4000:  # str() stops at 4,300 digits
        return "an integer of over 4,000 digits"
    if isinstance(value, list | dict):
        # repr recurses into a deeply nested value; its kind says enough.
        return f"a {'list' if isinstance(value, list) else 'object'} of {len(value)} items"
    r = repr(value[:40] if isinstance(value, str) else value)
    return r if len(r) <= 40 else r[:37] + "..."


def _count(value: Fraction, field: str) -> int:
    if value.denominator != 1:
        raise RequestError(field, f"device counts must be whole numbers, got {float(value)}")
    return int(value)


# ----------------------------------------------------------------------- from a pod


def _container_resources(container: Any, where: str) -> dict[str, Fraction]:
    """Effective requests of one container: requests, falling back to limits."""
    if not isinstance(container, dict):
        raise RequestError(where, "expected an object")
    res = container.get("resources")
    if res is None:
        res = {}
    if not isinstance(res, dict):
        raise RequestError(f"{where}.resources", "expected an object")
    out: dict[str, Fraction] = {}
    for kind in ("limits", "requests"):  # requests override limits
        section = res.get(kind)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise RequestError(f"{where}.resources.{kind}", "expected an object")
        for name, q in section.items():
            out[name] = parse_quantity(q, f"{where}.resources.{kind}[{name}]")
    return out


def _add(totals: dict[str, Fraction], more: dict[str, Fraction]) -> None:
    for name, q in more.items():
        totals[name] = totals.get(name, Fraction(0)) + q


def _is_guaranteed(containers: list[Any]) -> bool:
    """Kubernetes QoS class Guaranteed (ComputePodQOS), over app *and* init containers: each
    has positive CPU and memory limits (zero limits count as none), and requests, where
    given, equal them (an unset request defaults to the limit)."""
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in limits or not parse_quantity(limits[name], name):
                return False
            if name in requests and parse_quantity(requests[name], name) != parse_quantity(
                    limits[name], name):
                return False
    return bool(containers)


def _pinned_cpus(own: dict[str, Fraction]) -> int:
    """CPUs kubelet's static CPU manager pins for one container of a Guaranteed pod: its own
    CPU request when that is a whole number, else none (staticPolicy.guaranteedCPUs)."""
    cpu = own.get("cpu", Fraction(0))
    return int(cpu) if cpu.denominator == 1 else 0


def request_from_pod(pod: Any, names: ResourceNames = DEFAULT_RESOURCES) -> Request:
    """The pod-level request as kube-scheduler counts it: app containers and sidecars summed,
    at least what any init container needs next to the sidecars started before it."""
    if not isinstance(pod, dict):
        raise RequestError("pod", "expected a Pod object")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise RequestError("spec", "missing or not an object")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise RequestError("spec.containers", "missing or empty")
    inits = spec.get("initContainers") or []
    if not isinstance(inits, list):
        raise RequestError("spec.initContainers", "expected a list")

    totals: dict[str, Fraction] = {}
    pinned_apps = 0  # kubelet's podGuaranteedCPUs, counted alongside (used if Guaranteed)
    for i, c in enumerate(containers):
        own = _container_resources(c, f"spec.containers[{i}]")
        _add(totals, own)
        pinned_apps += _pinned_cpus(own)
    # kube-scheduler's effective requests (component-helpers PodRequests, KEP-753): a sidecar
    # (an init container with restartPolicy Always) runs for the pod's life, so it adds to
    # the app containers; an ordinary init container runs next to the sidecars started
    # before it, and the pod needs at least that much while it runs.
    sidecars: dict[str, Fraction] = {}
    peak: dict[str, Fraction] = {}
    pinned_sidecars = pinned_inits = 0
    for i, c in enumerate(inits):
        own = _container_resources(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            _add(totals, own)
            _add(sidecars, own)
            during = sidecars
            pinned_sidecars += _pinned_cpus(own)
        else:
            during = dict(sidecars)
            _add(during, own)
            pinned_inits = max(pinned_inits, pinned_sidecars + _pinned_cpus(own))
        for name, q in during.items():
            peak[name] = max(peak.get(name, Fraction(0)), q)
    for name, q in peak.items():
        totals[name] = max(totals.get(name, Fraction(0)), q)

    # kubelet's static CPU manager pins CPUs per container, only for a Guaranteed pod and
    # only a container whose own CPU request is whole; init containers' CPUs are reused by
    # the containers after them (staticPolicy.podGuaranteedCPUs).
    # Each quantity is within int64, their sum need not be (Kubernetes keeps the pod's in
    # int64 too); what the core is handed stays a number Kubernetes could have meant.
    for name in (*names.managed, "cpu", "memory"):
        total = totals.get(name, Fraction(0))
        if total > _MAX_QUANTITY:
            raise RequestError(f"resources[{name}]",
                               f"the containers' sum {_short(int(total))} is too large for a "
                               "Kubernetes quantity")
    exclusive = 0
    if _is_guaranteed([*containers, *inits]):
        exclusive = max(pinned_apps + pinned_sidecars, pinned_inits)
    memory = totals.get("memory", Fraction(0))
    meta = pod.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise RequestError("metadata", "expected an object")
    hints = hints_from_annotations(meta.get("annotations"))
    vfs = _count(totals.get(names.vf, Fraction(0)), f"resources[{names.vf}]")
    pool_vfs = tuple((p, n) for p in sorted(names.vf_pools)
                     if (n := _count(totals.get(p, Fraction(0)), f"resources[{p}]")))
    return Request(
        gpus=_count(totals.get(names.gpu, Fraction(0)), f"resources[{names.gpu}]"),
        vfs=vfs,
        pfs=_count(totals.get(names.pf, Fraction(0)), f"resources[{names.pf}]"),
        exclusive_cpus=exclusive,
        memory_bytes=int(memory) if exclusive else 0,
        pool_vfs=pool_vfs,
        pair_pool=pair_pool_of(vfs, pool_vfs, hints.pop("pair_pool", None), names),
        **hints,
    )


def pair_pool_of(vfs: int, pool_vfs: tuple[tuple[str, int], ...], hint: str | None,
                 names: ResourceNames = DEFAULT_RESOURCES) -> str | None:
    """Which pool's VFs pair with the GPUs (docs/decisions/0085): the `pairPool` hint, else
    the default pool when the pod asks for its VFs or for no other pool's, else the one
    other pool it asks for; a pod asking VFs of several other pools and none of the default
    must say which with `pairPool`. None is the default pool."""
    field = f"metadata.annotations[{REQUEST_ANNOTATION}].pairPool"
    asked = [p for p, _ in pool_vfs]
    if hint is not None:
        if hint == names.vf:
            if not vfs and asked:
                raise RequestError(field, f"the pod asks no {names.vf}")
            return None
        if hint not in asked:
            known = ", ".join([names.vf, *asked]) if vfs else ", ".join(asked) or names.vf
            raise RequestError(field, f"the pod asks no VFs of {_short(hint)} "
                                      f"(it asks: {known})")
        return hint
    if vfs or not asked:
        return None
    if len(asked) == 1:
        return asked[0]
    raise RequestError(field, f"the pod asks VFs of {', '.join(asked)} and none of "
                              f"{names.vf}: name the pool that pairs with the GPUs")


def hints_from_annotations(annotations: Any) -> dict[str, Any]:
    """Parse `railyard.dev/request` into Request keyword arguments."""
    if annotations is None:
        return {}
    if not isinstance(annotations, dict):
        raise RequestError("metadata.annotations", "expected an object")
    raw = annotations.get(REQUEST_ANNOTATION)
    if raw is None:
        return {}
    field = f"metadata.annotations[{REQUEST_ANNOTATION}]"
    if not isinstance(raw, str):
        raise RequestError(field, "expected a JSON string")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestError(field, f"not valid JSON: {e.msg} at column {e.colno}") from None
    except ValueError as e:  # an integer too long to convert (Python's 4,300-digit limit)
        raise RequestError(field, f"not valid JSON: {e}") from None
    except RecursionError:  # "[[[[…": the parser recurses per level; hints are one object
        raise RequestError(field, "not valid JSON: nested too deeply") from None
    return parse_hints(data, field)


def parse_hints(data: Any, field: str = "hints") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise RequestError(field, "expected a JSON object")
    # A hint's error quotes at most 40 characters of what it refuses (`_short`): the
    # annotation may be 256 KiB, its error goes to kube-scheduler, the logs and Events.
    unknown = set(data) - {"maxDistance", "numa", "pairing", "pairPool", "preferDistance",
                           "rails", "vfBandwidth"}
    if unknown:
        key = sorted(unknown)[0]
        raise RequestError(f"{field}.{key if len(key) <= 40 else key[:37] + '...'}",
                           "unknown key (known: maxDistance, numa, pairPool, pairing, "
                           "preferDistance, rails, vfBandwidth)")
    out: dict[str, Any] = {}
    for key, name in (("maxDistance", "max_distance"), ("preferDistance", "prefer_distance")):
        if key not in data:
            continue
        v = data[key]
        distances = "|".join(d.name for d in Distance)
        if not isinstance(v, str):
            raise RequestError(f"{field}.{key}", f"expected one of {distances}")
        try:
            out[name] = Distance.parse(v)
        except ValueError:
            raise RequestError(f"{field}.{key}",
                               f"unknown distance class {_short(v)}: expected {distances}"
                               ) from None
    if "numa" in data:
        if data["numa"] not in NUMA_POLICIES:
            raise RequestError(f"{field}.numa", f"expected one of {'|'.join(NUMA_POLICIES)}, "
                                                f"got {_short(data['numa'])}")
        out["numa"] = data["numa"]
    if "pairing" in data:
        if data["pairing"] not in PAIRINGS:
            raise RequestError(f"{field}.pairing", f"expected one of {'|'.join(PAIRINGS)}, "
                                                   f"got {_short(data['pairing'])}")
        out["pairing_hint"] = data["pairing"]
    if "rails" in data:
        if data["rails"] not in RAIL_POLICIES:
            raise RequestError(f"{field}.rails", f"expected one of {'|'.join(RAIL_POLICIES)}, "
                                                 f"got {_short(data['rails'])}")
        out["rail_policy"] = data["rails"]
    if "pairPool" in data:
        v = data["pairPool"]
        if not isinstance(v, str) or v.count("/") != 1 or not all(v.partition("/")[::2]):
            raise RequestError(f"{field}.pairPool",
                               f"expected a VF pool's resource name, got {_short(v)}")
        out["pair_pool"] = v
    if "vfBandwidth" in data:
        v = data["vfBandwidth"]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 100:
            raise RequestError(f"{field}.vfBandwidth", "expected an integer percentage of one "
                                                       f"PF's line rate, 1–100, got {_short(v)}")
        out["vf_bandwidth"] = v
    return out


def parse_request_spec(text: str, hints: str | None = None) -> Request:
    """The CLI's `gpus=2,vfs=2[,pfs=0,cpus=8,memory=64Gi]` with optional hint JSON."""
    keys = {"gpus", "vfs", "pfs", "cpus", "memory"}
    values: dict[str, Any] = {}
    seen: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in keys:
            raise RequestError(key or part, f"expected key=value with key in {sorted(keys)}")
        if key in seen:
            raise RequestError(key, "given twice")
        seen.add(key)
        q = parse_quantity(value.strip(), key)
        if key == "memory":
            values["memory_bytes"] = int(q)
        elif key == "cpus":
            values["exclusive_cpus"] = _count(q, key)
        else:
            values[key] = _count(q, key)
    extra: dict[str, Any] = {}
    if hints:
        try:
            data = json.loads(hints)
        except json.JSONDecodeError as e:
            raise RequestError("hints", f"not valid JSON: {e.msg}") from None
        except ValueError as e:  # an integer too long to convert
            raise RequestError("hints", f"not valid JSON: {e}") from None
        except RecursionError:
            raise RequestError("hints", "not valid JSON: nested too deeply") from None
        extra = parse_hints(data, "hints")
    extra["pair_pool"] = pair_pool_of(values.get("vfs", 0), (), extra.pop("pair_pool", None))
    return Request(**values, **extra)
