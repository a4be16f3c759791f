"""Which fabric rail each NIC is cabled to, and the rail sequence of a pod's pairs.

A rail-optimised fabric cables NIC i of every node to leaf switch i (rail i), so GPU i on one
node reaches GPU i on another in one hop; NCCL's rings and trees pair local rank i with local
rank i across nodes. Railyard cannot see cabling, so a node's rails come from its agent's
`rails` config: an explicit map (PF PCI address, netdev or RDMA device → rail) or the
`pci-order` scheme (the node's RDMA PFs that do not carry its default route, numbered
0, 1, … in PCI address order). docs/rails.md, docs/decisions/0089.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Final, Literal

from railyard.topology.model import Nic, NodeTopology

PCI_ORDER: Final = "pci-order"
RailScheme = Literal["pci-order"]
# Rails are leaf switches: a few dozen at most; the bound keeps a typo from becoming a key.
MAX_RAIL = 1023


def pci_order_rails(nics: tuple[Nic, ...]) -> dict[str, int]:
    """The `pci-order` scheme: RDMA PFs without the default route, 0, 1, … by address."""
    compute = sorted(n.pci_address for n in nics if not n.default_route)
    return {a: r for r, a in enumerate(compute)}


def assign_rails(topology: NodeTopology,
                 rails: Mapping[str, int] | RailScheme) -> tuple[NodeTopology, list[str]]:
    """`topology` with each NIC's rail set from `rails`, and the map's keys that name no NIC
    of this node (one config serves many nodes; the agent warns about them). A NIC the map
    does not name keeps no rail."""
    if isinstance(rails, str):
        by_pf = pci_order_rails(topology.nics)
        unknown: list[str] = []
    else:
        by_pf = {}
        named = set()
        for n in topology.nics:
            for name in (n.pci_address, n.netdev, n.rdma_device):
                if name is not None and name in rails:
                    by_pf[n.pci_address] = rails[name]
                    named.add(name)
                    break
        unknown = sorted(k for k in rails if k not in named)
    nics = tuple(replace(n, rail=by_pf.get(n.pci_address)) for n in topology.nics)
    return replace(topology, nics=nics), unknown


def rail_of(topology: NodeTopology, pf_pci_address: str) -> int | None:
    """The rail of the PF at this address (a VF's is its PF's); None when unknown."""
    for n in topology.nics:
        if n.pci_address == pf_pci_address:
            return n.rail
    return None
