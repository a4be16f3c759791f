"""The box's pure parts, without root: its stand-ins and their MACs, the node tree it is
given, its PATH, image archives."""

from __future__ import annotations

import json
import tarfile

import pytest

from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import PROFILES, profile
from railyard.records.topology import topology_to_json
from support.box import kubebox


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_stand_ins_are_exactly_the_pf_and_vf_netdevs_discovery_reports(tmp_path, name):
    """The box reads `railyard discover`'s document, never sysfs itself: on every fixture
    profile its stand-ins are the PF and VF netdevs discovery found, no more, no fewer."""
    write_fixture(profile(name), tmp_path, 2)
    topology = discover(tmp_path).topology
    expected = {n.netdev for n in topology.nics} | {v.netdev for n in topology.nics
                                                   for v in n.vfs}
    assert None not in expected
    assert len(expected) == sum(1 + len(n.vfs) for n in topology.nics) > len(topology.nics)

    links = kubebox.netdev_stand_ins(topology_to_json(topology))

    assert set(links) == expected
    for mac in links.values():
        octets = mac.split(":")
        assert len(octets) == 6 and int(octets[0], 16) & 0b11 == 0b10  # local, unicast
    assert len(set(links.values())) == len(links)
    assert kubebox.netdev_stand_ins(topology_to_json(topology)) == links  # deterministic


def test_a_given_node_sysfs_is_the_tree_root_or_its_sys_folder(tmp_path):
    write_fixture(profile("generic"), tmp_path / "node", 1)
    for given in (tmp_path / "node", tmp_path / "node" / "sys"):
        box = kubebox.Box(tmp_path / "box", node_sysfs=given)
        assert box.node_sysfs == tmp_path / "node" / "sys"
    with pytest.raises(kubebox.BoxError, match=r"--node-sysfs .*: not a sysfs tree: expected"):
        kubebox.Box(tmp_path / "box", node_sysfs=tmp_path)


def test_the_box_path_offers_every_component_built(tmp_path, monkeypatch):
    """helm, kwok and Multus are on the PATH `hack/box up` prints once built, even when this
    box did not ask for them (docs/testing.md lists them as box components)."""
    monkeypatch.setenv("RAILYARD_BOX_CACHE", str(tmp_path / "cache"))
    for name in ("kube", "containerd", "helm", "multus"):  # kwok: not built here
        out = kubebox.FAMILIES[name].out_dir()
        (out / "bin").mkdir(parents=True)
        (out / "bin" / f"{name}-tool").write_text("")
        (out / "complete").write_text("")
    assert set(kubebox.built()) == {"kube", "containerd", "helm", "multus"}
    (tmp_path / "box").mkdir()
    box = kubebox.Box(tmp_path / "box")
    box.bins = {"kube": kubebox.FAMILIES["kube"].out_dir() / "bin"}
    box._link_binaries()
    assert sorted(p.name for p in box.layout.bin_dir.iterdir()) == [
        "containerd-tool", "helm-tool", "kube-tool", "multus-tool"]


def test_an_image_archive_names_its_image_and_holds_its_layer(tmp_path):
    archive = tmp_path / "image.tar"
    layer = kubebox.layer_tar([("bin/tool", b"#!/bin/sh\n", 0o755)])
    kubebox.write_image_archive(archive, "railyard.test/tool:box", layer, ["/bin/tool"])
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{manifest_digest}"))
        config = json.load(tar.extractfile(
            f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
    annotations = index["manifests"][0]["annotations"]
    assert annotations["io.containerd.image.name"] == "railyard.test/tool:box"
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    assert len(manifest["layers"]) == 1
