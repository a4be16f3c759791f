"""The agent config's `pairMap`: the opt-in NCCL_GPU_NIC_AFFINITY and the pod interface name
the pair file's netdev names derive from (docs/pair-map.md)."""

from __future__ import annotations

import pytest

from railyard.agent.config import ConfigError, config_from_dict
from railyard.kubelet.pairmap import PairMapOptions


def test_pair_map_defaults_leave_the_affinity_off_and_name_interfaces_net1():
    assert config_from_dict({}).pair_map == PairMapOptions(False, "net1")


def test_pair_map_options_are_read():
    cfg = config_from_dict({"pairMap": {"ncclGpuNicAffinity": True, "podIfname": "rdma"}})
    assert cfg.pair_map == PairMapOptions(nccl_gpu_nic_affinity=True, pod_ifname="rdma")


@pytest.mark.parametrize("bad", [
    {"ncclGpuNicAffinity": "yes"},
    {"podIfname": ""},
    {"podIfname": "a/b"},
    {"podIfname": "net 1"},
    {"podIfname": "thirteen-char"},  # no room left for `-<i>` within 15 bytes
    {"affinity": True},
])
def test_a_bad_pair_map_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError) as e:
        config_from_dict({"pairMap": bad})
    assert str(e.value).startswith("pairMap")
