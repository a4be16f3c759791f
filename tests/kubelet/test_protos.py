"""Our .proto files match kubelet's published API (k8s.io/kubelet/pkg/apis/…) exactly."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from railyard.kubelet.api import deviceplugin_pb2 as dp
from railyard.kubelet.api import pluginregistration_pb2 as reg
from railyard.kubelet.api import podresources_pb2 as pr

S, B, I32, I64, U64, M = FD.TYPE_STRING, FD.TYPE_BOOL, FD.TYPE_INT32, FD.TYPE_INT64, \
    FD.TYPE_UINT64, FD.TYPE_MESSAGE

# message -> [(field name, number, type, repeated)]
DEVICE_PLUGIN = {
    "DevicePluginOptions": [("pre_start_required", 1, B, False),
                            ("get_preferred_allocation_available", 2, B, False)],
    "RegisterRequest": [("version", 1, S, False), ("endpoint", 2, S, False),
                        ("resource_name", 3, S, False), ("options", 4, M, False)],
    "ListAndWatchResponse": [("devices", 1, M, True)],
    "Device": [("ID", 1, S, False), ("health", 2, S, False), ("topology", 3, M, False)],
    "TopologyInfo": [("nodes", 1, M, True)],
    "NUMANode": [("ID", 1, I64, False)],
    "PreferredAllocationRequest": [("container_requests", 1, M, True)],
    "ContainerPreferredAllocationRequest": [("available_deviceIDs", 1, S, True),
                                            ("must_include_deviceIDs", 2, S, True),
                                            ("allocation_size", 3, I32, False)],
    "PreferredAllocationResponse": [("container_responses", 1, M, True)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, S, True)],
    "AllocateRequest": [("container_requests", 1, M, True)],
    "ContainerAllocateRequest": [("devices_ids", 1, S, True)],
    "AllocateResponse": [("container_responses", 1, M, True)],
    "ContainerAllocateResponse": [("envs", 1, M, True), ("mounts", 2, M, True),
                                  ("devices", 3, M, True), ("annotations", 4, M, True),
                                  ("cdi_devices", 5, M, True)],
    "Mount": [("container_path", 1, S, False), ("host_path", 2, S, False),
              ("read_only", 3, B, False)],
    "DeviceSpec": [("container_path", 1, S, False), ("host_path", 2, S, False),
                   ("permissions", 3, S, False)],
    "CDIDevice": [("name", 1, S, False)],
    "PreStartContainerRequest": [("devices_ids", 1, S, True)],
    "Empty": [], "PreStartContainerResponse": [],
}
REGISTRATION = {
    "PluginInfo": [("type", 1, S, False), ("name", 2, S, False), ("endpoint", 3, S, False),
                   ("supported_versions", 4, S, True)],
    "RegistrationStatus": [("plugin_registered", 1, B, False), ("error", 2, S, False)],
    "InfoRequest": [], "RegistrationStatusResponse": [],
}
POD_RESOURCES = {
    "ListPodResourcesResponse": [("pod_resources", 1, M, True)],
    "GetPodResourcesRequest": [("pod_name", 1, S, False), ("pod_namespace", 2, S, False)],
    "GetPodResourcesResponse": [("pod_resources", 1, M, False)],
    "AllocatableResourcesResponse": [("devices", 1, M, True), ("cpu_ids", 2, I64, True),
                                     ("memory", 3, M, True)],
    "PodResources": [("name", 1, S, False), ("namespace", 2, S, False),
                     ("containers", 3, M, True), ("cpu_ids", 4, I64, True),
                     ("memory", 5, M, True)],
    "ContainerResources": [("name", 1, S, False), ("devices", 2, M, True),
                           ("cpu_ids", 3, I64, True), ("memory", 4, M, True),
                           ("dynamic_resources", 5, M, True)],
    "ContainerDevices": [("resource_name", 1, S, False), ("device_ids", 2, S, True),
                         ("topology", 3, M, False)],
    "ContainerMemory": [("memory_type", 1, S, False), ("size", 2, U64, False),
                        ("topology", 3, M, False)],
    "DynamicResource": [("claim_name", 2, S, False), ("claim_namespace", 3, S, False),
                        ("claim_resources", 4, M, True)],
    "ClaimResource": [("cdi_devices", 1, M, True), ("driver_name", 2, S, False),
                      ("pool_name", 3, S, False), ("device_name", 4, S, False),
                      ("share_id", 5, S, False)],
    "NUMANode": [("ID", 1, I64, False)],
    "ListPodResourcesRequest": [], "AllocatableResourcesRequest": [],
}


def _fields(msg) -> list[tuple]:
    return [(f.name, f.number, f.type, f.is_repeated) for f in msg.DESCRIPTOR.fields]


@pytest.mark.parametrize("module,package,table", [
    (dp, "v1beta1", DEVICE_PLUGIN), (reg, "pluginregistration", REGISTRATION),
    (pr, "v1", POD_RESOURCES)])
def test_messages_match_the_wire_tables(module, package, table):
    assert module.DESCRIPTOR.package == package
    for name, fields in table.items():
        assert _fields(getattr(module, name)) == fields, name


def test_service_paths_are_kubelets():
    def methods(module, service):
        return {m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
                for m in module.DESCRIPTOR.services_by_name[service].methods}

    assert methods(dp, "Registration") == {"Register": ("RegisterRequest", "Empty", False)}
    assert methods(dp, "DevicePlugin") == {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest",
                                   "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    }
    assert methods(reg, "Registration") == {
        "GetInfo": ("InfoRequest", "PluginInfo", False),
        "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse", False),
    }
    assert set(methods(pr, "PodResourcesLister")) == {"List", "GetAllocatableResources", "Get"}
    assert dp.DESCRIPTOR.services_by_name["DevicePlugin"].full_name == "v1beta1.DevicePlugin"


def test_share_id_is_optional_so_absence_is_visible():
    c = pr.ClaimResource()
    assert not c.HasField("share_id")
