"""hack/railyard_image.py without root: the archive it writes is an OCI layout that containerd
imports under the name the chart's default values resolve to, with the Dockerfile's user,
entrypoint and environment (decision 0092). The build itself runs in
tests/box/test_chart_pods_box.py."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import yaml

from support.chart import CHART
from support.chart_box import kubebox, railyard_image


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_image_name_is_what_the_charts_default_values_resolve_to():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == ""  # the appVersion, below
    # containerd names `railyard:<tag>` docker.io/library/railyard:<tag> when kubelet asks.
    assert railyard_image.image_name() == (
        f"docker.io/library/{values['image']['repository']}:{chart['appVersion']}")


def test_archive_is_an_oci_layout_naming_the_image_with_the_dockerfiles_config(tmp_path):
    layer = kubebox.layer_tar([("opt/railyard/bin/railyard", b"#!/bin/sh\n", 0o755)])
    archive = tmp_path / "railyard.tar"
    railyard_image.write_archive(archive, "docker.io/library/railyard:9.9.9", layer)
    files = _members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    [descriptor] = json.loads(files["index.json"])["manifests"]
    assert descriptor["annotations"]["io.containerd.image.name"] == (
        "docker.io/library/railyard:9.9.9")

    def blob(digest: str) -> bytes:
        return files[f"blobs/sha256/{digest.split(':')[1]}"]

    manifest = json.loads(blob(descriptor["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["/opt/railyard/bin/railyard"]
    assert any(e.startswith("PATH=/opt/railyard/bin:") for e in config["config"]["Env"])
    [layer_descriptor] = manifest["layers"]
    unpacked = gzip.decompress(blob(layer_descriptor["digest"]))
    assert unpacked == layer
    with tarfile.open(fileobj=io.BytesIO(unpacked)) as tar:
        assert tar.getmember("opt/railyard/bin/railyard").mode == 0o755


def test_base_key_names_the_debian_suite():
    assert railyard_image.base_key().startswith(f"{railyard_image.SUITE}-")
