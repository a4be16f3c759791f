"""Our dra.proto matches kubelet's DRA plugin API v1 (k8s.io/kubelet@v0.36.3,
pkg/apis/dra/v1) field for field, and its gRPC paths are the ones kubelet calls."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor as FD

from railyard.kubelet.api import dra_pb2 as dra

S, M = FD.TYPE_STRING, FD.TYPE_MESSAGE

# message -> [(field name, number, type, repeated)]; maps are repeated entry messages.
DRA_V1 = {
    "Claim": [("namespace", 1, S, False), ("uid", 2, S, False), ("name", 3, S, False)],
    "NodePrepareResourcesRequest": [("claims", 1, M, True)],
    "NodePrepareResourcesResponse": [("claims", 1, M, True)],
    "NodePrepareResourceResponse": [("devices", 1, M, True), ("error", 2, S, False)],
    "Device": [("request_names", 1, S, True), ("pool_name", 2, S, False),
               ("device_name", 3, S, False), ("cdi_device_ids", 4, S, True),
               ("share_id", 5, S, False)],
    "NodeUnprepareResourcesRequest": [("claims", 1, M, True)],
    "NodeUnprepareResourcesResponse": [("claims", 1, M, True)],
    "NodeUnprepareResourceResponse": [("error", 1, S, False)],
}


def test_dra_messages_match_kubelets_v1_api():
    assert dra.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    for name, fields in DRA_V1.items():
        got = [(f.name, f.number, f.type, f.is_repeated)
               for f in getattr(dra, name).DESCRIPTOR.fields]
        assert got == fields, name


def test_response_maps_are_keyed_by_claim_uid_strings():
    resp = dra.NodePrepareResourcesResponse()
    resp.claims["7f1c"].error = "x"
    assert dict(resp.claims)["7f1c"].error == "x"
    assert dra.NodeUnprepareResourcesResponse.DESCRIPTOR.fields[0].message_type.GetOptions() \
        .map_entry


def test_dra_service_path_is_the_one_kubelet_dials():
    service = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
        "NodeUnprepareResources": ("NodeUnprepareResourcesRequest",
                                   "NodeUnprepareResourcesResponse"),
    }


def test_share_id_is_optional_so_absence_is_visible():
    d = dra.Device(pool_name="p", device_name="d")
    assert not d.HasField("share_id")
    d.share_id = ""
    assert d.HasField("share_id")


def test_dra_health_stream_matches_kubelets_v1alpha1_api():
    from railyard.kubelet.api import dra_health_pb2 as health

    I64, E = FD.TYPE_INT64, FD.TYPE_ENUM
    assert health.DESCRIPTOR.package == "v1alpha1"
    table = {
        "DeviceIdentifier": [("pool_name", 1, S, False), ("device_name", 2, S, False)],
        "DeviceHealth": [("device", 1, M, False), ("health", 2, E, False),
                         ("last_updated_time", 3, I64, False),
                         ("health_check_timeout_seconds", 4, I64, False),
                         ("message", 5, S, False)],
        "NodeWatchResourcesResponse": [("devices", 1, M, True)],
        "NodeWatchResourcesRequest": [],
    }
    for name, fields in table.items():
        got = [(f.name, f.number, f.type, f.is_repeated)
               for f in getattr(health, name).DESCRIPTOR.fields]
        assert got == fields, name
    assert (health.UNKNOWN, health.HEALTHY, health.UNHEALTHY) == (0, 1, 2)
    (method,) = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods
    assert (method.full_name, method.server_streaming) == \
        ("v1alpha1.DRAResourceHealth.NodeWatchResources", True)
