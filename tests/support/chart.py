"""The Helm chart (deploy/chart/railyard) as the tests see it: the pinned helm the box builds,
and the objects a rendering holds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.box import kubebox

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/chart/railyard"
MANIFESTS = REPO / "deploy/manifests/railyard.yaml"
NAMESPACE = "railyard-system"
RELEASE = "railyard"  # the namespace and release deploy/manifests/ is rendered for


def helm_binary() -> str:
    """The pinned helm v4 (hack/box build helm); skips where it is not built and Go is missing."""
    family = kubebox.FAMILIES["helm"]
    if shutil.which("go") is None and not (family.out_dir() / "complete").exists():
        pytest.skip("helm is not built and Go is missing to build it (hack/box build helm)")
    return str(kubebox.build(("helm",))["helm"] / "helm")


def helm_env(home: Path) -> dict[str, str]:
    """helm's caches and config in `home`, not the user's."""
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}


def helm(home: Path, *args: str, kubeconfig: Path | None = None) -> str:
    """Run helm from the repository root; a failure shows helm's own words."""
    env = helm_env(home)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    done = subprocess.run([helm_binary(), *args], env=env, capture_output=True, text=True,
                          cwd=REPO)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML stream, empty documents left out."""
    return [d for d in yaml.safe_load_all(text) if d]
