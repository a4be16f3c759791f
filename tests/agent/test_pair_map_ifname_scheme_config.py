"""`pairMap.podIfnameScheme`: the pair file names interfaces as the CNI config's
`ifnameScheme` does (docs/pair-map.md)."""

from __future__ import annotations

import pytest

from railyard.agent.config import ConfigError, config_from_dict


def test_the_scheme_defaults_to_sequential_and_reads_gpu_index() -> None:
    assert config_from_dict({}).pair_map.pod_ifname_scheme == "sequential"
    cfg = config_from_dict({"pairMap": {"podIfnameScheme": "gpu-index"}})
    assert cfg.pair_map.pod_ifname_scheme == "gpu-index"


@pytest.mark.parametrize("bad", ["gpu_index", "", 1, None, "rdma"])
def test_a_bad_scheme_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"pairMap": {"podIfnameScheme": bad}})
    assert str(e.value).startswith("pairMap.podIfnameScheme")
