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
