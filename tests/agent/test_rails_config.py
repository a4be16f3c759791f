"""The agent's `rails` config (docs/rails.md): a map of NIC name to rail, or `pci-order`;
anything else is refused naming the field."""

from __future__ import annotations

import pytest

from railyard.agent.config import ConfigError, config_from_dict


def test_rails_map_and_scheme_parse():
    assert config_from_dict({}).rails is None
    assert config_from_dict({"rails": "pci-order"}).rails == "pci-order"
    assert config_from_dict({"rails": {"0000:18:00.0": 0, "ibp64s0": 7}}).rails == {
        "0000:18:00.0": 0, "ibp64s0": 7}


@pytest.mark.parametrize("bad, where", [
    ("by-guess", "rails"), ({"mlx5_0": -1}, "rails.mlx5_0"), ({"mlx5_0": "1"}, "rails.mlx5_0"),
    ({"mlx5_0": 5000}, "rails.mlx5_0"), ([1, 2], "rails"),
])
def test_bad_rails_are_refused_naming_the_field(bad, where):
    with pytest.raises(ConfigError) as e:
        config_from_dict({"rails": bad})
    assert e.value.path == where
