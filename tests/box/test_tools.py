"""The other pinned tools the box builds run: helm (for the chart) and Multus's thin plugin
(for the secondary-network path). No root needed; the build is reused from the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.box import kubebox

pytestmark = [pytest.mark.box]


def _built(family: str) -> Path:
    if shutil.which("go") is None and not kubebox.FAMILIES[family].out_dir().exists():
        pytest.skip(f"{family} is not built and Go is missing to build it (hack/box build)")
    return kubebox.build((family,))[family]


def test_helm_is_the_pinned_v4_and_lints_and_renders_a_chart(tmp_path):
    helm = str(_built("helm") / "helm")
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}

    def run(*args: str) -> str:
        return subprocess.run([helm, *args], env=env, check=True, capture_output=True,
                              text=True, cwd=tmp_path).stdout

    assert run("version", "--short").startswith(kubebox.HELM_VERSION)
    run("create", "sample")
    assert "1 chart(s) linted, 0 chart(s) failed" in run("lint", "sample")
    rendered = run("template", "demo", "sample")
    assert "kind: Deployment" in rendered and "name: demo-sample" in rendered


def test_multus_answers_the_cni_version_command():
    multus = str(_built("multus") / "multus")
    out = subprocess.run([multus], env={"CNI_COMMAND": "VERSION"}, input="{}",
                         capture_output=True, text=True, check=True).stdout
    assert "1.0.0" in json.loads(out)["supportedVersions"]
    version = subprocess.run([multus, "-version"], capture_output=True, text=True).stdout
    assert kubebox.MULTUS_VERSION in version
