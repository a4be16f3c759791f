"""`vfPools`: several VF pools in sriov-network-device-plugin's resourceList form
(docs/decisions/0085), so an operator's config.json moves over as it is; what Railyard does
not apply is a config error naming it, never silently ignored."""

from __future__ import annotations

import pytest

from railyard.agent.config import ConfigError, VfPool, config_from_dict
from railyard.allocation.types import Allocation, NicRef
from railyard.discovery.profiles import build_topology, profile
from railyard.kubelet.inventory import PoolOverlap, assign_pools
from railyard.kubelet.resolver import ids_of, kind_of, kinds_of
from railyard.kubelet.selectors import PfName, Selector

SRIOV_DP = {"resourceList": [
    {"resourceName": "vf", "selectors": {"vendors": ["15b3"], "isRdma": True}},
    {"resourceName": "rail_east", "resourcePrefix": "example.com", "deviceType": "netDevice",
     "excludeTopology": False,
     "selectors": {"pfNames": ["ibp24s0#0-3"], "drivers": ["mlx5_core"],
                   "linkTypes": ["infiniband"]}},
]}


def test_a_sriov_dp_config_becomes_one_pool_per_entry_and_names_the_other_pools():
    cfg = config_from_dict({"vfPools": SRIOV_DP})
    assert [p.resource for p in cfg.pools] == ["railyard.dev/vf", "example.com/rail_east"]
    assert cfg.resources.vf_pools == ("example.com/rail_east",)
    assert cfg.resources.managed == ("nvidia.com/gpu", "railyard.dev/vf",
                                     "example.com/rail_east", "railyard.dev/pf")
    east = cfg.pools[1].selectors[0]
    assert east.pf_names == (PfName("ibp24s0", 0, 3),) and east.link_types == {"InfiniBand"}


def test_the_list_alone_and_a_list_of_selector_objects_are_read_too():
    cfg = config_from_dict({"vfPools": [{"resourceName": "vf-b", "selectors": [
        {"vendors": ["15b3"]}, {"pfNames": ["ib1"]}]}]})
    assert cfg.pools == (VfPool("railyard.dev/vf-b", (Selector(vendors=frozenset({"15b3"})),
                                                      Selector(pf_names=(PfName("ib1"),)))),)


def test_without_vf_pools_the_default_pool_takes_pools_vf():
    cfg = config_from_dict({"pools": {"vf": [{"vendors": ["15b3"]}]}})
    assert cfg.pools == (VfPool("railyard.dev/vf", cfg.vf_pool),)
    assert cfg.resources.vf_pools == ()


@pytest.mark.parametrize("raw,field,words", [
    ({"resourceList": [{"resourceName": "a", "selectors": {"rootDevices": ["0000:01:00.0"]}}]},
     "vfPools.resourceList[0].selectors.rootDevices", "does not support"),
    ({"resourceList": [{"resourceName": "a", "selectors": [{"pciAddresses": ["x"]}]}]},
     "vfPools.resourceList[0].selectors[0].pciAddresses", "does not support"),
    ({"resourceList": [{"resourceName": "a", "selectors": {"isRdma": False}}]},
     "vfPools.resourceList[0].selectors.isRdma", "RDMA VFs only"),
    ({"resourceList": [{"resourceName": "a", "deviceType": "accelerator"}]},
     "vfPools.resourceList[0].deviceType", "netDevice"),
    ({"resourceList": [{"resourceName": "a", "excludeTopology": True}]},
     "vfPools.resourceList[0].excludeTopology", "topology"),
    ({"resourceList": [{"resourceName": "a", "additionalInfo": {}}]},
     "vfPools.resourceList[0].additionalInfo", "does not support"),
    ({"resourceList": [{"resourceName": "a"}, {"resourceName": "a"}]},
     "vfPools.resourceList[1].resourceName", "also the pool"),
    ({"resourceList": [{"resourceName": "bad name"}]},
     "vfPools.resourceList[0].resourceName", "kubelet"),
    ({"resourceList": []}, "vfPools", "at least one"),
    ({"resourceList": [{"resourceName": "pf"}]}, "vfPools", "differ"),
    ({"periodicUpdateInterval": 1, "resourceList": []}, "vfPools.periodicUpdateInterval",
     "unknown"),
])
def test_what_railyard_does_not_apply_is_an_error_naming_it(raw, field, words):
    with pytest.raises(ConfigError) as e:
        config_from_dict({"vfPools": raw})
    assert str(e.value).startswith(field) and words in str(e.value)


def test_vf_pools_and_pools_vf_together_is_an_error():
    with pytest.raises(ConfigError, match=r"^vfPools: give VF selectors once"):
        config_from_dict({"vfPools": SRIOV_DP, "pools": {"vf": []}})


TOPO = build_topology(profile("generic"), vfs_per_pf=4)
PF0, PF1 = (n.netdev for n in TOPO.nics)


def test_assign_pools_puts_each_vf_in_its_pool_and_the_default_pool_as_none():
    t = assign_pools(TOPO, [("railyard.dev/vf", (Selector(pf_names=(PfName(PF0),)),)),
                            ("x.io/b", (Selector(pf_names=(PfName(PF1),)),))],
                     "railyard.dev/vf")
    assert {v.pool for v in t.nics[0].vfs} == {None}
    assert {v.pool for v in t.nics[1].vfs} == {"x.io/b"}


def test_assign_pools_refuses_a_vf_in_two_pools_naming_both_and_their_selectors():
    with pytest.raises(PoolOverlap) as e:
        assign_pools(TOPO, [("a.io/a", (Selector(pf_names=(PfName(PF0),)),)),
                            ("b.io/b", (Selector(vendors=frozenset({"ffff"})),
                                        Selector(pf_names=(PfName(PF0, 1, 2),))))],
                     "railyard.dev/vf")
    vf = next(v for v in TOPO.nics[0].vfs if v.vf_index == 1)
    assert str(e.value).startswith(f"VF {vf.pci_address} is in two pools: selector 0 of "
                                   "a.io/a and selector 1 of b.io/b")


def test_kinds_and_ids_follow_the_pools():
    names = config_from_dict({"vfPools": SRIOV_DP}).resources
    east = "example.com/rail_east"
    assert kinds_of(names) == ("gpu", "vf", east, "pf")
    assert kind_of(names, east) == east
    with pytest.raises(KeyError):
        kind_of(names, "example.com/unknown")
    pf = TOPO.nics[0]
    a = Allocation("n", (), None, (), nics=(
        NicRef.of_vf(pf, pf.vfs[0]),
        NicRef("vf", pf.vfs[1].pci_address, pf.pci_address, 1, None, None, east)))
    assert ids_of(a, "vf") == (pf.vfs[0].pci_address,)
    assert ids_of(a, east) == (pf.vfs[1].pci_address,)


def test_a_vf_in_two_pools_stops_railyard_agent_with_one_line_and_exit_code_2(tmp_path):
    import json
    import subprocess
    import sys

    from support.agent import make_tree, write_pods

    tree = make_tree(tmp_path / "root")
    write_pods(tmp_path / "p.json", [])
    (tmp_path / "c.json").write_text(json.dumps({"vfPools": [
        {"resourceName": "vf"}, {"resourceName": "vf-b", "selectors": {"pfNames": [PF1]}}]}))
    r = subprocess.run([sys.executable, "-m", "railyard.cli.main", "agent", "--node-name",
                        "node-a", "--pods-file", str(tmp_path / "p.json"), "--config",
                        str(tmp_path / "c.json"), "--sysfs-root", str(tree), "--state-dir",
                        str(tmp_path / "s"), "--kubelet-dir", str(tmp_path / "k")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("railyard: error: vfPools: VF ") and "Traceback" not in r.stderr
    assert "railyard.dev/vf and selector 0 of railyard.dev/vf-b" in last
