"""The node's default paths have one home; the stdlib-only CNI shim's copy must agree with it."""

from __future__ import annotations

from railyard.cni import shim
from railyard.node import paths


def test_the_shim_calls_the_socket_the_service_serves_by_default():
    assert shim.DEFAULT_SOCKET == paths.CNI_SOCKET


def test_the_pod_resources_socket_is_below_the_kubelet_folder():
    assert paths.POD_RESOURCES_SOCKET.startswith(paths.KUBELET_DIR + "/")
