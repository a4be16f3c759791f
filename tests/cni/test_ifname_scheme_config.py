"""The network config's `ifnameScheme`: `sequential` (today's net1, net1-1, …) unless the
config opts in to `gpu-index`; anything else is code 7 naming the field (docs/cni.md)."""

from __future__ import annotations

import pytest

from railyard.cni.spec import CniError, Code, pair_ifnames, parse_netconf

BASE = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni"}


def test_without_the_key_names_stay_sequential() -> None:
    assert parse_netconf(BASE).ifname_scheme == "sequential"
    assert parse_netconf({**BASE, "ifnameScheme": "sequential", "ifname": "eth5"}
                         ).ifname_scheme == "sequential"


def test_gpu_index_is_read() -> None:
    assert parse_netconf({**BASE, "ifnameScheme": "gpu-index"}).ifname_scheme == "gpu-index"


@pytest.mark.parametrize("bad", ["GPU-INDEX", "gpu_index", "", "rdma%d", 0, None, ["gpu-index"]])
def test_a_bad_scheme_is_an_invalid_config_naming_the_field(bad: object) -> None:
    with pytest.raises(CniError) as e:
        parse_netconf({**BASE, "ifnameScheme": bad})
    assert e.value.code == Code.INVALID_CONFIG
    assert e.value.msg.startswith("ifnameScheme")


def test_gpu_index_with_an_ifname_of_its_own_is_refused_naming_ifname() -> None:
    with pytest.raises(CniError) as e:
        parse_netconf({**BASE, "ifnameScheme": "gpu-index", "ifname": "eth5"})
    assert e.value.code == Code.INVALID_CONFIG and e.value.msg.startswith("ifname:")


def test_gpu_index_names_ignore_cni_ifname_and_fit_any_count() -> None:
    assert pair_ifnames("net1", 3, scheme="gpu-index") == ("rdma0", "rdma1", "rdma2")
    assert pair_ifnames("a-very-long-nm", 3, scheme="gpu-index",
                        pair_indexes=(0, None, 2)) == ("rdma0", "rdmau0", "rdma2")
