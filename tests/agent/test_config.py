"""The agent config file: sriov-dp style pool selectors and resource names."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.agent.config import ConfigError, config_from_dict, load_config
from railyard.kubelet.selectors import DeviceFacts, offered

VF = DeviceFacts("0000:18:00.3", "15b3", "101e", "mlx5_core", "ibp24s0", 2, "InfiniBand")


def selectors(raw):
    return config_from_dict({"pools": {"vf": raw}}).vf_pool


def test_no_selectors_offer_everything():
    assert offered((), VF)


@pytest.mark.parametrize("raw,want", [
    ([{"vendors": ["15b3"]}], True),
    ([{"vendors": ["0x15B3"], "devices": ["101e"]}], True),
    ([{"vendors": ["8086"]}], False),
    ([{"vendors": ["8086"]}, {"drivers": ["mlx5_core"]}], True),  # any selector
    ([{"vendors": ["15b3"], "drivers": ["vfio-pci"]}], False),  # every field
    ([{"pfNames": ["ibp24s0"]}], True),
    ([{"pfNames": ["ibp24s0#0-1"]}], False),
    ([{"pfNames": ["ibp24s0#2"]}], True),
    ([{"pfNames": ["ibp64s0", "ibp24s0#1-3"]}], True),
    ([{"linkTypes": ["infiniband"]}], True),
    ([{"linkTypes": ["ether"]}], False),
])
def test_selector_matching(raw, want):
    assert offered(selectors(raw), VF) is want


@pytest.mark.parametrize("raw,field", [
    ({"pools": {"vf": [{"vendor": ["15b3"]}]}}, "pools.vf[0].vendor"),
    ({"pools": {"vf": [{"vendors": ["xyz"]}]}}, "pools.vf[0].vendors[0]"),
    ({"pools": {"vf": [{"pfNames": ["ib0#3-1"]}]}}, "pools.vf[0].pfNames[0]"),
    ({"pools": {"vf": [{"linkTypes": ["token-ring"]}]}}, "pools.vf[0].linkTypes[0]"),
    ({"pools": {"gpu": []}}, "pools"),
    ({"resources": {"vf": "no-slash"}}, "resources.vf"),
    ({"resources": {"vf": "a/b", "pf": "a/b"}}, "resources"),
    ({"gpuPlugin": "yes"}, "gpuPlugin"),
    ({"healthIntervalS": 0}, "healthIntervalS"),
    ({"nope": 1}, "nope"),
])
def test_bad_config_names_the_field(raw, field):
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    assert str(e.value).startswith(field)


@pytest.mark.parametrize("bad", [
    "example.com/rdma/vf", "kubernetes.io/vf", "node.kubernetes.io/vf", "Example.COM/vf",
    "a b/vf", "requests.example.com/vf", "example.com/-vf", "example.com/" + "v" * 64,
    "-example.com/vf", "example..com/vf", "/vf", "example.com/"])
def test_resource_names_kubelet_refuses_are_config_errors(bad):
    """kubelet.md: Register fails for a name that is not an extended resource name
    (IsExtendedResourceName); the agent would then run without serving the resource."""
    with pytest.raises(ConfigError, match=r"^resources\.vf: .* not an extended resource name"):
        config_from_dict({"resources": {"vf": bad}})


@pytest.mark.parametrize("good", [
    "railyard.dev/vf", "mellanox.com/vf", "example.com/RDMA_vf.1", "a/b",
    "x-y.example/" + "v" * 63])
def test_resource_names_kubelet_accepts_are_taken(good):
    assert config_from_dict({"resources": {"vf": good}}).resources.vf == good


def test_yaml_file_with_renamed_resources(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("resources: {gpu: amd.com/gpu}\ngpuPlugin: false\n"
                 "pools:\n  pf: [{linkTypes: [ether]}]\n")
    cfg = load_config(f)
    assert cfg.resources.gpu == "amd.com/gpu" and cfg.resources.vf == "railyard.dev/vf"
    assert not cfg.gpu_plugin and cfg.pf_pool[0].link_types == frozenset({"Ethernet"})


def test_missing_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.json"):
        load_config(tmp_path / "nope.json")


def test_unparseable_file_is_one_line_naming_file_and_place(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("{bad\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(str(f)) and "line 2" in msg


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(
        st.sampled_from(["pools", "vf", "pf", "vendors", "pfNames", "linkTypes", "resources",
                         "gpu", "gpuPlugin", "healthIntervalS", "devinfoDir"]), c, max_size=3),
    max_leaves=15)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_json_is_a_config_or_a_config_error(data):
    with contextlib.suppress(ConfigError):
        config_from_dict(data)
