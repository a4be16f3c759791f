"""The node's default paths: every folder and socket Railyard uses on a node unless told else.

Constants only, so the CLI can show them in `--help` without importing a store. The CNI shim
keeps its own copy of `CNI_SOCKET` (it is stdlib-only and may run outside any environment
where railyard is installed); tests/node/test_paths.py checks that the two agree.
"""

from __future__ import annotations

STATE_DIR = "/var/lib/railyard"  # the node state store (`--state-dir`)
KUBELET_DIR = "/var/lib/kubelet"  # kubelet's root: device-plugins/, plugins_registry/, …
POD_RESOURCES_SOCKET = f"{KUBELET_DIR}/pod-resources/kubelet.sock"  # PodResources v1
CNI_SOCKET = "/run/railyard/cni.sock"  # the warm CNI service, called by the railyard-cni shim
CNI_BIN_DIR = "/opt/cni/bin"  # where a runtime looks for CNI plugins
# Multus's device-info folders: one for device plugins, one for CNI plugins (its convention).
DEVINFO_DIR = "/var/run/k8s.cni.cncf.io/devinfo/dp"
CNI_DEVINFO_DIR = "/var/run/k8s.cni.cncf.io/devinfo/cni"
