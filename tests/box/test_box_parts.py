"""The box's pure parts, without root: which netdevs get stand-ins, their MACs, image archives."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from support.box import kubebox


def _netdev(tree: Path, device: str, name: str, address: str) -> None:
    net = tree / "devices" / device / "net" / name
    net.mkdir(parents=True)
    (net / "address").write_text(address + "\n")


def test_stand_ins_cover_rdma_pfs_and_their_vfs_with_macs_a_veth_can_carry(tmp_path):
    sys = tmp_path / "sys"
    _netdev(sys, "pf0", "enp1s0f0np0", "02:00:00:00:01:00")
    _netdev(sys, "pf1", "ibp2s0", "00:00:10:87:fe:80:00:00:00:00:00:00:a0:88:c2:03:00:00:02:00")
    _netdev(sys, "vf0", "enp1s0f0v0", "00:00:00:00:00:00")
    _netdev(sys, "plain", "eno1", "02:00:00:00:99:00")  # no RDMA device: no stand-in
    (sys / "devices/pf0/virtfn0").symlink_to(sys / "devices/vf0")
    (sys / "class/infiniband").mkdir(parents=True)
    for rdma, device in (("mlx5_0", "pf0"), ("mlx5_1", "pf1")):
        (sys / "devices" / device / "infiniband" / rdma).mkdir(parents=True)
        (sys / "devices" / device / "infiniband" / rdma / "device").symlink_to(
            sys / "devices" / device)
        (sys / "class/infiniband" / rdma).symlink_to(sys / "devices" / device / "infiniband" / rdma)

    links = kubebox.sysfs_netdevs(sys)

    assert sorted(links) == ["enp1s0f0np0", "enp1s0f0v0", "ibp2s0"]
    assert links["enp1s0f0np0"] == "02:00:00:00:01:00"
    for derived in (links["ibp2s0"], links["enp1s0f0v0"]):
        octets = derived.split(":")
        assert len(octets) == 6 and int(octets[0], 16) & 0b10  # locally administered
    assert kubebox.sysfs_netdevs(sys) == links  # deterministic


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
