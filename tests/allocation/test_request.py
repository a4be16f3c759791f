"""Requests parsed from pods: sums over containers, hints, and errors that name the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.allocation.names import REQUEST_ANNOTATION
from railyard.allocation.request import (
    Request,
    RequestError,
    parse_quantity,
    parse_request_spec,
    request_from_pod,
)
from railyard.topology.model import Distance


def pod(*containers: dict, annotations: dict | None = None, inits: list | None = None) -> dict:
    spec: dict = {"containers": [{"name": f"c{i}", "resources": r}
                                 for i, r in enumerate(containers)]}
    if inits:
        spec["initContainers"] = [{"name": "init", "resources": r} for r in inits]
    return {"metadata": {"name": "p", "annotations": annotations or {}}, "spec": spec}


def test_device_counts_sum_over_containers():
    p = pod({"limits": {"nvidia.com/gpu": "2", "railyard.dev/vf": "1"}},
            {"limits": {"nvidia.com/gpu": "2", "railyard.dev/vf": "3"}})
    r = request_from_pod(p)
    assert (r.gpus, r.vfs, r.pfs) == (4, 4, 0)


def test_init_container_raises_the_floor_but_does_not_add():
    p = pod({"limits": {"nvidia.com/gpu": "1"}}, inits=[{"limits": {"nvidia.com/gpu": "4"}}])
    assert request_from_pod(p).gpus == 4


def sidecar(limits: dict) -> dict:
    return {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": limits}}


def test_sidecar_devices_are_counted_on_top_of_the_app_containers():
    # Kubernetes >= 1.29 (SidecarContainers): an init container with restartPolicy Always
    # runs for the pod's life; kube-scheduler sums its requests with the app containers',
    # and kubelet's device manager keeps its devices for the pod's life.
    p = pod({"limits": {"nvidia.com/gpu": "1", "railyard.dev/vf": "1"}})
    p["spec"]["initContainers"] = [sidecar({"nvidia.com/gpu": "1", "railyard.dev/vf": "1"})]
    r = request_from_pod(p)
    assert (r.gpus, r.vfs) == (2, 2)


def test_an_init_container_runs_next_to_the_sidecars_started_before_it():
    # kube-scheduler's effective request: max(app + sidecars, each ordinary init container
    # plus the sidecars before it). Here 1 + 3 = 4 GPUs while "late" runs; the sidecar
    # after it does not count against it.
    p = pod({"limits": {"nvidia.com/gpu": "1"}})
    p["spec"]["initContainers"] = [
        sidecar({"nvidia.com/gpu": "1"}),
        {"name": "late", "resources": {"limits": {"nvidia.com/gpu": "3"}}},
        sidecar({"railyard.dev/vf": "2"}),
    ]
    r = request_from_pod(p)
    assert (r.gpus, r.vfs) == (4, 2)
    p["spec"]["initContainers"][1]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert request_from_pod(p).gpus == 2  # app + sidecar now exceed the init container


def test_guaranteed_pod_with_integer_cpus_wants_exclusive_cpus_and_memory():
    res = {"limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}}
    r = request_from_pod(pod(res))
    assert r.exclusive_cpus == 8
    assert r.memory_bytes == 64 << 30


def test_burstable_pod_shares_the_cpu_pool():
    res = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "1Gi"}}
    assert request_from_pod(pod(res)).exclusive_cpus == 0


def test_fractional_cpu_is_never_exclusive():
    res = {"limits": {"cpu": "1500m", "memory": "1Gi"}}
    assert request_from_pod(pod(res)).exclusive_cpus == 0


def limits(cpu: str, memory: str = "1Gi", **more: str) -> dict:
    return {"limits": {"cpu": cpu, "memory": memory, **more}}


def test_fractional_containers_summing_to_an_integer_get_no_exclusive_cpus():
    """kubelet's static CPU manager pins CPUs per container, and only for a container whose
    own CPU request is whole (staticPolicy.guaranteedCPUs). 1500m + 500m: nothing is pinned
    although the pod total is 2, so no exclusive CPUs and no memory are reserved."""
    r = request_from_pod(pod(limits("1500m", **{"nvidia.com/gpu": "1"}), limits("500m")))
    assert r.exclusive_cpus == 0
    assert r.memory_bytes == 0


def test_an_integer_container_next_to_a_fractional_one_still_pins_its_cpus():
    """The same rule the other way round: a 2-CPU container next to a 500m one gets 2 pinned
    CPUs from kubelet, although the pod total 2.5 is not whole."""
    r = request_from_pod(pod(limits("2", **{"nvidia.com/gpu": "1"}), limits("500m")))
    assert r.exclusive_cpus == 2
    assert r.memory_bytes == 2 << 30


def test_an_init_container_without_limits_makes_the_pod_burstable():
    """Kubernetes QoS (ComputePodQOS) looks at init containers too: one without CPU and
    memory limits makes the pod Burstable, and kubelet pins nothing."""
    p = pod(limits("4", **{"nvidia.com/gpu": "1"}),
            inits=[{"requests": {"cpu": "100m", "memory": "64Mi"}}])
    assert request_from_pod(p).exclusive_cpus == 0


def test_a_zero_cpu_limit_counts_as_no_limit():
    """ComputePodQOS counts only positive limits: a container limited to 0 CPUs is not
    Guaranteed, so nothing is pinned for the pod."""
    assert request_from_pod(pod(limits("4"), limits("0"))).exclusive_cpus == 0


def test_pinned_cpus_are_the_larger_of_an_init_container_and_the_long_running_ones():
    """kubelet reuses an init container's pinned CPUs for the containers after it
    (podGuaranteedCPUs): max(init + sidecars started before it, apps + sidecars)."""
    big_init = pod(limits("2"), inits=[limits("6")])
    assert request_from_pod(big_init).exclusive_cpus == 6
    small_init = pod(limits("2"), limits("3"), inits=[limits("4")])
    assert request_from_pod(small_init).exclusive_cpus == 5
    with_sidecar = {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "app", "resources": limits("2")}],
        "initContainers": [{"name": "side", "resources": limits("1"), "restartPolicy": "Always"},
                           {"name": "init", "resources": limits("4")}]}}
    assert request_from_pod(with_sidecar).exclusive_cpus == 5  # sidecar 1 + init 4 > 2 + 1


def test_default_pairing_follows_the_counts():
    assert Request(gpus=2, vfs=2).pairing == "one-to-one"
    assert Request(gpus=2, vfs=4).pairing == "one-to-one"
    assert Request(gpus=4, vfs=2).pairing == "shared"
    assert Request(gpus=4).pairing == "none"
    assert Request(vfs=2).pairing == "none"


def test_hints_come_from_the_annotation():
    ann = {REQUEST_ANNOTATION: json.dumps({"maxDistance": "pxb", "numa": "single",
                                           "pairing": "shared"})}
    r = request_from_pod(pod({"limits": {"nvidia.com/gpu": "2"}}, annotations=ann))
    assert r.max_distance is Distance.PXB
    assert r.numa == "single"
    assert r.pairing == "shared"


@pytest.mark.parametrize(
    ("annotation", "field"),
    [
        ("{not json", "railyard.dev/request"),
        ('{"maxDistance": "FAR"}', "maxDistance"),
        ('{"maxDistance": 3}', "maxDistance"),
        ('{"numa": "both"}', "numa"),
        ('{"pairing": "1:1"}', "pairing"),
        ('{"colour": "red"}', "colour"),
        ("[1, 2]", "railyard.dev/request"),
    ],
)
def test_malformed_annotation_is_rejected_naming_the_field(annotation, field):
    with pytest.raises(RequestError) as e:
        request_from_pod(pod({"limits": {"nvidia.com/gpu": "1"}},
                             annotations={REQUEST_ANNOTATION: annotation}))
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("bad_pod", "field"),
    [
        ({"spec": {}}, "spec.containers"),
        ({"metadata": {}}, "spec"),
        ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}},
         "nvidia.com/gpu"),
        ({"spec": {"containers": [{"resources": {"limits": {"railyard.dev/vf": "two"}}}]}},
         "railyard.dev/vf"),
        ({"spec": {"containers": [{"resources": {"limits": []}}]}}, "limits"),
        ("not a pod", "pod"),
    ],
)
def test_malformed_pod_is_rejected_naming_the_field(bad_pod, field):
    with pytest.raises(RequestError) as e:
        request_from_pod(bad_pod)
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2), ("64Gi", 64 << 30), ("1G", 10**9), ("1e3", 1000), (4, 4)],
)
def test_quantities_parse_like_kubernetes(text, value):
    assert parse_quantity(text, "q") == value


@given(st.text(max_size=8))
def test_quantity_parser_never_crashes_on_junk(text):
    try:
        parse_quantity(text, "q")
    except RequestError as e:
        assert e.field == "q"


@given(st.integers(0, 8), st.integers(0, 16), st.integers(0, 4))
def test_cli_request_spec_round_trips_counts(gpus, vfs, pfs):
    r = parse_request_spec(f"gpus={gpus},vfs={vfs},pfs={pfs}")
    assert (r.gpus, r.vfs, r.pfs) == (gpus, vfs, pfs)


def test_cli_request_spec_rejects_unknown_keys():
    with pytest.raises(RequestError, match="gpu"):
        parse_request_spec("gpu=2")


@pytest.mark.parametrize("text", ["1e99999999", "1e-99999999", "0e99999999", "1" * 5000])
def test_a_quantity_too_large_to_be_real_is_refused_at_once(text):
    # Fraction("1e99999999") alone takes minutes; a filter call must not.
    with pytest.raises(RequestError, match=r"nvidia\.com/gpu"):
        parse_quantity(text, "nvidia.com/gpu")


def test_a_device_count_beyond_kubernetes_int64_is_refused():
    assert parse_quantity(str((1 << 63) - 1), "x") == (1 << 63) - 1
    with pytest.raises(RequestError, match="too large"):
        parse_quantity("10E", "x")  # 10 * 10**18 > 2**63 - 1


def test_hints_holding_an_over_long_integer_are_a_request_error():
    annotation = '{"numa": ' + "1" * 5000 + "}"
    with pytest.raises(RequestError, match=r"railyard\.dev/request"):
        request_from_pod(pod({"limits": {"nvidia.com/gpu": "1"}},
                             annotations={REQUEST_ANNOTATION: annotation}))


def test_cli_request_spec_refuses_a_key_given_twice():
    with pytest.raises(RequestError, match="gpus: given twice"):
        parse_request_spec("gpus=2,vfs=2,gpus=3")


def test_deeply_nested_hints_are_a_request_error_not_a_recursion_error():
    # Python's json raises RecursionError past ~1,000 levels, not a decode error.
    with pytest.raises(RequestError, match=r"railyard\.dev/request\]: not valid JSON: nested"):
        request_from_pod(pod({"limits": {"nvidia.com/gpu": "1"}},
                             annotations={REQUEST_ANNOTATION: "[" * 5000}))
    with pytest.raises(RequestError, match="hints: not valid JSON: nested too deeply"):
        parse_request_spec("gpus=1", "[" * 5000)


INT64_MAX = (1 << 63) - 1


@pytest.mark.parametrize("resource, field", [
    ("nvidia.com/gpu", r"resources\[nvidia\.com/gpu\]"),
    ("railyard.dev/vf", r"resources\[railyard\.dev/vf\]"),
    ("memory", r"resources\[memory\]"),
    ("cpu", r"resources\[cpu\]"),
])
def test_containers_whose_quantities_sum_past_int64_are_refused_naming_the_resource(resource,
                                                                                     field):
    # Issue 19, class 7: each container's quantity was bounded, their sum was not. Kubernetes
    # keeps a pod's requests in int64 as well.
    each = {"limits": {"cpu": "1", "memory": "1Gi", resource: str(INT64_MAX)}}
    with pytest.raises(RequestError, match=f"{field}: the containers' sum .* is too large"):
        request_from_pod(pod(each, each))


def test_a_sidecar_adding_past_int64_is_refused_too():
    big = {"limits": {"nvidia.com/gpu": str(INT64_MAX)}}
    p = pod(big, inits=[big])
    p["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    with pytest.raises(RequestError, match=r"resources\[nvidia\.com/gpu\]: the containers' sum"):
        request_from_pod(p)


def test_quantities_summing_to_exactly_int64_are_taken():
    half = {"limits": {"nvidia.com/gpu": str(INT64_MAX // 2)}}
    rest = {"limits": {"nvidia.com/gpu": str(INT64_MAX - INT64_MAX // 2)}}
    assert request_from_pod(pod(half, rest)).gpus == INT64_MAX


@pytest.mark.parametrize("metadata", [True, 7, "p", ["name"]])
def test_metadata_that_is_not_an_object_is_a_request_error_naming_it(metadata):
    # Found by the fuzz sweep (tests/fuzz): `(pod.get("metadata") or {}).get(...)` raised
    # AttributeError for a truthy non-object.
    p = pod({"limits": {"nvidia.com/gpu": "1"}})
    p["metadata"] = metadata
    with pytest.raises(RequestError, match=r"^metadata: expected an object"):
        request_from_pod(p)


@pytest.mark.parametrize("hints", [
    {"1" * 5_000: "x"},
    {"numa": "s" * 100_000},
    {"pairing": ["x" * 100_000]},
    {"maxDistance": "P" * 100_000},
])
def test_a_hint_error_names_the_field_without_echoing_a_huge_value(hints):
    # Found by the fuzz sweep: the message echoed an unknown key or a bad value whole, so a
    # 256 KiB annotation became a 256 KiB error in kube-scheduler's reply, the logs and Events.
    p = pod({"limits": {"nvidia.com/gpu": "1"}},
            annotations={REQUEST_ANNOTATION: json.dumps(hints)})
    with pytest.raises(RequestError) as e:
        request_from_pod(p)
    assert e.value.field.startswith(f"metadata.annotations[{REQUEST_ANNOTATION}]")
    assert len(str(e.value)) < 300
