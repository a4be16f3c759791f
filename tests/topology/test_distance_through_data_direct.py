"""A NIC with a Data Direct function: a GPU's class to it is the nearer of the PF's and the
Data Direct function's (decision 0086), never a new class."""

from __future__ import annotations

from railyard.topology.model import Distance, PciePath, distances_for

GPU = PciePath("pci0008:00", ("0008:00:01.0", "0008:01:00.0", "0008:02:01.0", "0008:04:00.0",
                              "0008:05:00.0"))
DD = PciePath("pci0008:00", ("0008:00:01.0", "0008:01:00.0", "0008:02:00.0"))
PF = PciePath("pci0001:00", ("0001:00:01.0", "0001:01:00.0", "0001:02:00.0"))
FAR = PciePath("pci0018:00", ("0018:00:01.0",))


def test_the_data_direct_path_replaces_a_farther_pf_path() -> None:
    without = distances_for({"g": (GPU, 0)}, {"n": (PF, 0)})
    with_dd = distances_for({"g": (GPU, 0)}, {"n": (PF, 0)}, {"n": (DD, 0)})
    assert without["g"]["n"] is Distance.NODE
    assert with_dd["g"]["n"] is Distance.PXB


def test_a_data_direct_function_farther_than_the_pf_changes_nothing() -> None:
    table = distances_for({"g": (GPU, 0)}, {"n": (DD, 0)}, {"n": (FAR, 1)})
    assert table["g"]["n"] is Distance.PXB


def test_other_nics_keep_their_own_class() -> None:
    table = distances_for({"g": (GPU, 0)}, {"n": (PF, 0), "m": (FAR, 1)}, {"n": (DD, 0)})
    assert table["g"] == {"n": Distance.PXB, "m": Distance.SYS}
