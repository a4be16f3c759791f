"""The ResourceClaimTemplate a person asks for in one line: N GPU↔NIC pairs, each pair's GPU and
NIC as close as the node allows, tried switch → root complex → NUMA node (decision 0112).

Pure: `claim_template(PairRequest(...))` is a `resource.k8s.io/v1` document (a dict); what the
API server would refuse is refused here first, by `PairRequest.check`, with the limit named.
Names come from `records.dra_names`, the vocabulary of the slices the agent publishes. The
kubelet plugin pairs the k-th GPU result with the k-th NIC result (decision 0109), so every
pair's requests come together, pair by pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from railyard.records.dra_names import (
    KIND_GPU,
    KIND_PF,
    KIND_VF,
    NUMA_NODE,
    PCIE_ROOT,
    PCIE_SWITCH,
    PF,
    device_class,
    qualified,
)
from railyard.records.fields import is_dns_label, is_dns_subdomain

API_VERSION = "resource.k8s.io/v1"

# NVIDIA's GPU DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu): its Helm chart installs a
# DeviceClass of this name selecting `device.driver == 'gpu.nvidia.com' &&
# device.attributes['gpu.nvidia.com'].type == 'gpu'`; its GPU devices carry the standard
# pcieRoot (and numaNode since its #1165), no PCIe switch.
NVIDIA_GPU_CLASS = "gpu.nvidia.com"

# Closeness levels, tightest first, and the attribute a pair's GPU and NIC must share at each.
LEVELS = ("switch", "root", "numa")
LEVEL_ATTRIBUTE = {"switch": qualified(PCIE_SWITCH), "root": PCIE_ROOT, "numa": NUMA_NODE}
GPU_SOURCES = ("railyard", "nvidia")
NIC_KINDS = (KIND_VF, KIND_PF)
# How the pod's VFs spread over PFs: on distinct PFs or not at all (required), on distinct PFs
# where the node can at the pair's level, else sharing one (preferred), no rule (none).
PF_SPREADS = ("required", "preferred", "none")

# The API server's limits on a claim (k8s.io/api@v0.36.3 resource/v1/types.go, enforced by
# pkg/apis/resource/validation in kubernetes v1.36.3).
MAX_REQUESTS = 32  # DeviceRequestsMaxSize: requests per claim
MAX_CONSTRAINTS = 32  # DeviceConstraintsMaxSize: constraints per claim
MAX_CONSTRAINT_REQUESTS = 32  # a constraint's `requests` (validated against DeviceRequestsMaxSize)
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize: subrequests per request
MAX_RESULTS = 32  # AllocationResultsMaxSize: devices in one allocation
MAX_NAME = 253  # metadata.name: a DNS subdomain

class TemplateError(ValueError):
    """A pair request the API server would refuse, or that cannot mean anything; the message
    names the option and the limit."""


@dataclass(frozen=True, slots=True)
class PairRequest:
    """What `railyard dra claim-template` asks for."""

    name: str
    pairs: int
    level: str = "numa"  # the loosest level a pair may fall back to
    gpus: str = "railyard"  # who publishes the GPUs: Railyard's slices or NVIDIA's driver
    nics: str = KIND_VF  # VFs or whole PFs
    pf_spread: str = "preferred"
    namespace: str | None = None

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels each pair tries, tightest first, down to `level`. NVIDIA's GPUs carry no
        switch attribute, so their pairs start at the root complex."""
        first = 0 if self.gpus == "railyard" else 1
        return LEVELS[first:LEVELS.index(self.level) + 1]

    @property
    def spread(self) -> str:
        """The PF rule that applies: none with one NIC, or with whole PFs (each is its own)."""
        return "none" if self.pairs < 2 or self.nics == KIND_PF else self.pf_spread

    def check(self) -> None:
        """Refuse, naming the option, what the API server would refuse or what is meaningless."""
        _choice("--level", self.level, LEVELS)
        _choice("--gpus", self.gpus, GPU_SOURCES)
        _choice("--nics", self.nics, NIC_KINDS)
        _choice("--pf-spread", self.pf_spread, PF_SPREADS)
        if not is_dns_subdomain(self.name, MAX_NAME):
            raise TemplateError(f"--name {self.name!r}: not a DNS subdomain (lower-case letters, "
                                f"digits, '-' and '.', at most {MAX_NAME} characters, starting "
                                "and ending with a letter or digit)")
        if self.namespace is not None and not is_dns_label(self.namespace):
            raise TemplateError(f"--namespace {self.namespace!r}: not a namespace (a DNS label: "
                                "lower-case letters, digits and '-', at most 63 characters)")
        if self.gpus == "nvidia" and self.level == "switch":
            raise TemplateError("--level switch with --gpus nvidia: NVIDIA's GPU devices carry "
                                f"no PCIe switch attribute; the closest they can say is "
                                f"--level root ({PCIE_ROOT})")
        most = max_pairs(self.levels, self.pf_spread, self.nics)
        if not 1 <= self.pairs <= most:
            raise TemplateError(f"--pairs {self.pairs}: between 1 and {most} with these options "
                                f"({_limit_reason(self.levels, self.pf_spread, self.nics)})")


def _choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise TemplateError(f"{option} {value!r}: expected one of {', '.join(choices)}")


def constraints_per_claim(pairs: int, levels: int, spread: str) -> int:
    """One matchAttribute per pair and level, and one distinctAttribute over the NICs."""
    return pairs * levels + (1 if spread != "none" and pairs >= 2 else 0)


def max_pairs(levels: tuple[str, ...], spread: str, nics: str = KIND_VF) -> int:
    """The most pairs a claim can ask within the API server's limits on a claim."""
    spread = "none" if nics == KIND_PF else spread
    best = 1
    for n in range(1, MAX_REQUESTS + 1):
        spread_entries = n * len(levels) if spread == "preferred" else n
        if (2 * n <= MAX_REQUESTS and 2 * n <= MAX_RESULTS
                and constraints_per_claim(n, len(levels), spread) <= MAX_CONSTRAINTS
                and (spread == "none" or spread_entries <= MAX_CONSTRAINT_REQUESTS)
                and len(_subrequests(levels, spread)) <= MAX_SUBREQUESTS):
            best = n
    return best


def _limit_reason(levels: tuple[str, ...], spread: str, nics: str) -> str:
    spread = "none" if nics == KIND_PF else spread
    return (f"2 requests and {len(levels)} constraint(s) a pair, "
            f"{'one more for the PF spread, ' if spread != 'none' else ''}"
            f"within the API's {MAX_REQUESTS} requests and {MAX_CONSTRAINTS} constraints "
            "a claim")


def _subrequests(levels: tuple[str, ...], spread: str) -> list[tuple[str, str, bool]]:
    """(subrequest name, level, on a PF of its own) in the order the allocator tries them:
    closeness first, then the PF spread (a shared PF at the switch beats a PF of its own at
    the root complex, as in the extender's order, docs/allocation.md)."""
    out = []
    for level in levels:
        out.append((level, level, spread != "none"))
        if spread == "preferred":
            out.append((f"{level}-shared-pf", level, False))
    return out


def claim_template(req: PairRequest) -> dict[str, Any]:
    """The ResourceClaimTemplate of `req` (checked first).

    Per pair i: request `nic-i` then `gpu-i` (the NIC first: its `firstAvailable` level
    loop then encloses the GPU's choice, so the allocator tries every GPU beside every NIC at
    the switch before any at the root complex; decision 0112), one `matchAttribute` per level
    naming the GPU and that level's NIC subrequests, and over all NICs one
    `distinctAttribute` on the PF.
    """
    req.check()
    levels, spread = req.levels, req.spread
    subs = _subrequests(levels, spread)
    nic_class = device_class(req.nics)
    gpu_class = device_class(KIND_GPU) if req.gpus == "railyard" else NVIDIA_GPU_CLASS
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    own_pf: list[str] = []
    for i in range(req.pairs):
        nic, gpu = f"nic-{i}", f"gpu-{i}"
        if len(subs) == 1:
            requests.append({"name": nic, "exactly": {"deviceClassName": nic_class}})
        else:
            requests.append({"name": nic, "firstAvailable": [
                {"name": sub, "deviceClassName": nic_class} for sub, _, _ in subs]})
        requests.append({"name": gpu, "exactly": {"deviceClassName": gpu_class}})
        for level in levels:
            if len(subs) == 1:
                names = [nic]
            else:
                names = [f"{nic}/{sub}" for sub, at, _ in subs if at == level]
            constraints.append({"requests": [gpu, *names],
                                "matchAttribute": LEVEL_ATTRIBUTE[level]})
        if len(subs) == 1 or spread == "required":
            own_pf.append(nic)
        else:
            own_pf += [f"{nic}/{sub}" for sub, _, own in subs if own]
    if spread != "none":
        constraints.append({"requests": own_pf, "distinctAttribute": qualified(PF)})
    metadata: dict[str, Any] = {"name": req.name}
    if req.namespace is not None:
        metadata["namespace"] = req.namespace
    return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": metadata,
            "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}}}

