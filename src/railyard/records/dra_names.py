"""Railyard's DRA driver name, its devices' names and the attribute and DeviceClass names of
its ResourceSlices: the one vocabulary every component that meets a slice or a claim derives
them from (decision 0109). Pure."""

from __future__ import annotations

DRIVER = "railyard.dev"  # the driver name in our ResourceSlices and in claims' results

# Standard attributes (KEP-4381, KEP-6072): fully qualified, the same for every driver.
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"  # string, "pci<domain>:<bus>"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"  # string, "0000:3b:00.2"
NUMA_NODE = "resource.kubernetes.io/numaNode"  # int

# Railyard's own attributes, in the driver's domain: a slice writes them unqualified
# (`kind`), a CEL selector reads `device.attributes["railyard.dev"].kind`, a constraint
# names them qualified (`railyard.dev/pcieSwitch`).
KIND = "kind"  # string, one of KINDS
PCIE_SWITCH = "pcieSwitch"  # string: the PCIe switch the device's DMA enters (absent: none)
PF = "pf"  # string: the device name of the PF a VF belongs to (a PF: its own)
RAIL = "rail"  # int: the NIC's rail (absent: unknown)
RDMA_DEVICE = "rdmaDevice"  # string: "mlx5_3"

KIND_GPU, KIND_VF, KIND_PF = "gpu", "vf", "pf"
KINDS = (KIND_GPU, KIND_VF, KIND_PF)


def qualified(attribute: str) -> str:
    """A Railyard attribute as a constraint names it: `pcieSwitch` → `railyard.dev/pcieSwitch`."""
    return f"{DRIVER}/{attribute}"


def device_class(kind: str) -> str:
    """The DeviceClass selecting our devices of one kind: `railyard-gpu`, `railyard-vf`,
    `railyard-pf`."""
    if kind not in KINDS:
        raise ValueError(f"unknown device kind {kind!r}: expected one of {', '.join(KINDS)}")
    return f"railyard-{kind}"


def device_name(pci_address: str) -> str:
    """A slice device's name for a PCI function: a DNS label (`0000:3b:00.2` →
    `pci-0000-3b-00-2`)."""
    return "pci-" + pci_address.lower().replace(":", "-").replace(".", "-")


# A VF's or PF's distance class to one GPU, `distanceGpu<index>` (int, the `Distance` value:
# PIX = 0 … SYS = 4), by the GPU's CUDA index; absent where the slice had no room for it.
DISTANCE_GPU_PREFIX = "distanceGpu"


def distance_to_gpu(index: int) -> str:
    """The attribute of a NIC's distance class to GPU `index`: `distanceGpu3`."""
    return f"{DISTANCE_GPU_PREFIX}{index}"


# The taint our slices put on a device the agent's health scan finds unhealthy (KEP-5055
# device taints; effect NoSchedule: no new claim gets it, a running pod keeps it).
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
