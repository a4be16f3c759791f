"""The pure CNI rules: CNI_ARGS, interface names, version choice, result shapes, wire frames."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.cni import rdma
from railyard.cni.shim import decode_env, encode_reply, encode_request, recv_blob, recv_exact
from railyard.cni.spec import (
    MAX_MSG_CHARS,
    MAX_NAME_CHARS,
    CniError,
    IpamResult,
    PodArgs,
    ResultInterface,
    build_result,
    newest_common,
    pair_ifnames,
    parse_cni_args,
    parse_env,
    parse_ipam_result,
    parse_netconf,
)

POD = {"K8S_POD_NAMESPACE": "team-a", "K8S_POD_NAME": "trainer-0",
       "K8S_POD_INFRA_CONTAINER_ID": "abc123", "K8S_POD_UID": "6f1c-uid"}
values = st.text(alphabet=st.characters(blacklist_characters=";", blacklist_categories=["Cs"]),
                 min_size=1, max_size=12)


@given(order=st.permutations([*list(POD.items()), ("IgnoreUnknown", "1"), ("FOO", "bar")]),
       repeats=st.lists(st.sampled_from(sorted(POD)), max_size=4),
       ignore=st.sampled_from(["1", "true", "True", "TRUE"]))
def test_cni_args_mean_the_same_in_any_order_with_repeats(order, repeats, ignore):
    pairs = [(k, ignore if k == "IgnoreUnknown" else v) for k, v in order]
    pairs += [(k, POD[k]) for k in repeats] + [("IgnoreUnknown", "1")]
    got = parse_cni_args(";".join(f"{k}={v}" for k, v in pairs))
    assert got == PodArgs("6f1c-uid", "team-a", "trainer-0", "abc123")


@given(key=st.sampled_from(sorted(POD)), a=values, b=values)
def test_a_key_repeated_with_two_values_is_refused(key, a, b):
    text = f"IgnoreUnknown=1;{key}={a};{key}={b}"
    if a == b:
        assert parse_cni_args(text)
    else:
        with pytest.raises(CniError) as e:
            parse_cni_args(text)
        assert e.value.code == 4 and key in e.value.msg


@given(st.text(max_size=60))
def test_cni_args_parser_never_fails_other_than_with_code_4(text):
    try:
        parse_cni_args(text)
    except CniError as e:
        assert e.code == 4


def test_unknown_keys_need_ignore_unknown():
    with pytest.raises(CniError, match="FOO"):
        parse_cni_args("K8S_POD_UID=u;FOO=1")
    with pytest.raises(CniError, match="FOO"):
        parse_cni_args("IgnoreUnknown=0;FOO=1")
    assert parse_cni_args("IgnoreUnknown=1;FOO=1;K8S_POD_UID=u").uid == "u"


@pytest.mark.parametrize("ifname, count, names", [
    ("net1", 1, ("net1",)),
    ("net1", 3, ("net1", "net1-1", "net1-2")),
    ("rdma", 8, ("rdma", *tuple(f"rdma-{i}" for i in range(1, 8)))),
])
def test_pair_order_names(ifname, count, names):
    assert pair_ifnames(ifname, count) == names


def test_pair_names_that_would_exceed_15_bytes_are_refused():
    assert pair_ifnames("abcdefghijklm", 8)[-1] == "abcdefghijklm-7"
    with pytest.raises(CniError) as e:
        pair_ifnames("abcdefghijklmn", 2)
    assert e.value.code == 4


@pytest.mark.parametrize("ours, theirs, floor, want", [
    ("1.1.0", ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"], "0.1.0", "1.0.0"),
    ("0.4.0", ["0.3.1", "0.4.0", "1.0.0"], "0.1.0", "0.4.0"),
    ("1.1.0", ["1.1.0", "1.0.0"], "0.1.0", "1.1.0"),
    ("1.0.0", ["0.1.0", "0.2.0"], "0.4.0", None),
    ("1.0.0", ["garbage", "0.3.1"], "0.1.0", "0.3.1"),
])
def test_ipam_version_is_the_newest_both_speak(ours, theirs, floor, want):
    assert newest_common(ours, theirs, floor) == want


IFACE = ResultInterface("net1", "02:00:00:00:00:01", "/run/netns/p", 9000, "0000:18:00.1")
IPAM = IpamResult((("10.0.0.2/24", "10.0.0.1"), ("fd00::2/64", None)),
                  ({"dst": "10.1.0.0/16"},), {"nameservers": ["10.0.0.53"]})


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0", "1.1.0"])
def test_result_shapes_follow_the_version(version):
    out = build_result(version, None, [IFACE], [IPAM])
    assert out["cniVersion"] == version
    iface = out["interfaces"][0]
    assert ("pciID" in iface) == ("mtu" in iface) == (version == "1.1.0")
    versions = [ip.get("version") for ip in out["ips"]]
    assert versions == (["4", "6"] if version == "0.4.0" else [None, None])
    assert out["ips"][0] == {"address": "10.0.0.2/24", "interface": 0, "gateway": "10.0.0.1",
                             **({"version": "4"} if version == "0.4.0" else {})}
    assert out["routes"] == [{"dst": "10.1.0.0/16"}] and out["dns"] == IPAM.dns


def test_result_keeps_every_prev_result_key_and_indexes_after_it():
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.9.0.9/24", "interface": 0}], "dns": {"search": ["x"]},
            "custom": {"kept": True}}
    out = build_result("1.0.0", prev, [IFACE, IFACE], [IPAM, None])
    assert out["custom"] == {"kept": True} and out["dns"] == {"search": ["x"]}
    assert [i["name"] for i in out["interfaces"]] == ["eth0", "net1", "net1"]
    assert [ip["interface"] for ip in out["ips"]] == [0, 1, 1]


@pytest.mark.parametrize("bad, word", [
    ({"ips": [{"address": "nope"}]}, "ips[0]"),
    ({"ips": [{"gateway": "10.0.0.1"}]}, "ips[0].address"),
    ({"routes": [{"gw": "10.0.0.1"}]}, "routes[0].dst"),
    ([], "object"),
])
def test_ipam_results_are_validated(bad, word):
    with pytest.raises(CniError) as e:
        parse_ipam_result(bad, "static")
    assert e.value.code == 6 and word in e.value.msg and "static" in e.value.msg


env_keys = st.from_regex(r"CNI_[A-Z]{1,8}", fullmatch=True)


@given(env=st.dictionaries(env_keys, st.text(max_size=30).filter(lambda v: "\0" not in v),
                           max_size=6),
       other=st.dictionaries(st.from_regex(r"[A-Z]{1,6}", fullmatch=True), st.text(max_size=5),
                             max_size=3),
       stdin=st.binary(max_size=2000), code=st.integers(0, 255),
       out=st.binary(max_size=300), err=st.binary(max_size=300))
def test_wire_frames_round_trip_and_carry_only_cni_variables(env, other, stdin, code, out, err):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode_request({**other, **env}, stdin))
        assert recv_exact(b, 6) == b"RYCNI1"
        got = decode_env(recv_blob(b))
        assert got == {k: v for k, v in {**other, **env}.items() if k.startswith("CNI_")}
        assert recv_blob(b) == stdin
        b.sendall(encode_reply(code, out, err))
        assert int.from_bytes(recv_exact(a, 4), "big") == code
        assert recv_blob(a) == out and recv_blob(a) == err


def test_rdma_netlink_messages_round_trip():
    msg = rdma.message(rdma.RDMA_NLDEV_CMD_SET, rdma.NLM_F_REQUEST | rdma.NLM_F_ACK,
                       rdma.attr(rdma.ATTR_DEV_INDEX, struct.pack("=I", 7))
                       + rdma.attr(rdma.ATTR_DEV_NAME, b"mlx5_3\0"))
    ((mtype, attrs),) = rdma.parse_messages(msg)
    assert mtype == (5 << 10) + 2 == 5122
    assert struct.unpack("=I", attrs[rdma.ATTR_DEV_INDEX])[0] == 7
    assert attrs[rdma.ATTR_DEV_NAME].rstrip(b"\0") == b"mlx5_3"
    assert len(msg) % 4 == 0


def test_rdma_mode_is_shared_where_the_kernel_has_no_rdma_subsystem():
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, rdma.NETLINK_RDMA).close()
    except OSError:
        assert rdma.RdmaNetlink().mode() == "shared"
    else:
        assert rdma.RdmaNetlink().mode() in ("shared", "exclusive")


json_docs = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


def _strict(text: bytes):
    import json

    def no_constants(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=no_constants)


@given(doc=json_docs, indent=st.sampled_from([None, 1]))
def test_shim_json_reader_reads_what_json_writes(doc, indent):
    import json

    from railyard.cni.shim import loads

    text = json.dumps(doc, indent=indent).encode()
    assert loads(b" \n" + text + b"\n") == json.loads(text)


@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_shim_json_reader_rejects_what_json_rejects(data):
    from railyard.cni.shim import loads

    try:
        want = _strict(data)
    except (ValueError, UnicodeDecodeError):
        with pytest.raises(ValueError):
            loads(data)
    else:
        assert loads(data) == want


@pytest.mark.parametrize("raw", [
    {"CNI_COMMAND": "ADD" * 2500},
    {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c" * 3000 + "/"},
    {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "x" * 9000},
], ids=["command", "container-id", "netns"])
def test_an_error_quoting_a_huge_value_is_clipped(raw):
    # Issue 19 (the fuzz sweep): a 7,500-character CNI_COMMAND came back whole in the error,
    # which the runtime logs and may copy into the pod's Events.
    env = {"CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin", **raw}
    with pytest.raises(CniError) as e:
        parse_env(env)
    assert len(e.value.msg) <= MAX_MSG_CHARS and "more characters)" in e.value.msg
    assert e.value.code == 4


def test_an_error_that_fits_is_kept_whole():
    e = CniError(4, "m" * 1024, "d" * 4096)
    assert (e.msg, e.details) == ("m" * 1024, "d" * 4096)


def test_a_container_id_or_network_name_too_long_for_a_file_name_is_code_4_or_7():
    # The fuzz sweep: a 1,000-character network name reached the state folder as a file name
    # and came back as code 5 (ENAMETOOLONG), an internal error.
    env = {"CNI_COMMAND": "DEL", "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin"}
    assert parse_env({**env, "CNI_CONTAINERID": "c" * MAX_NAME_CHARS}).container_id
    with pytest.raises(CniError) as e:
        parse_env({**env, "CNI_CONTAINERID": "c" * (MAX_NAME_CHARS + 1)})
    assert e.value.code == 4 and "200 or fewer" in e.value.msg
    conf = {"cniVersion": "1.0.0", "type": "railyard-cni"}
    assert parse_netconf({**conf, "name": "n" * MAX_NAME_CHARS}).name == "n" * MAX_NAME_CHARS
    with pytest.raises(CniError) as e:
        parse_netconf({**conf, "name": "n" * (MAX_NAME_CHARS + 1)})
    assert e.value.code == 7 and "200 or fewer" in e.value.msg


@pytest.mark.parametrize("where", ["name", "ipam-type"])
def test_a_config_value_nested_deep_is_named_not_repr_d(where):
    # The fuzz sweep (random draws): `got {name!r}` of a list nested 10,000 deep raised
    # RecursionError instead of the config error.
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    conf = {"cniVersion": "1.0.0", "type": "railyard-cni", "name": "net"}
    if where == "name":
        conf["name"] = deep
    else:
        conf["ipam"] = {"type": deep}
    with pytest.raises(CniError) as e:
        parse_netconf(conf)
    assert e.value.code == 7 and "got a list" in e.value.msg
