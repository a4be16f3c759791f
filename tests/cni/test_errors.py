"""Malformed stdin and environment get the spec's error codes, as JSON, never a traceback.

These run without root: the service here has an empty state store, so it grants nothing and
never moves a link, whatever it is asked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railyard.cni.plugin import Plugin, Settings
from railyard.cni.service import RunningService, build_plugin, start
from railyard.cni.spec import CniError
from support.cni import RecordingRdma, run_shim


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    root = tmp_path_factory.mktemp("bare")
    plugin = build_plugin(str(root / "state"), sysfs_root=str(root / "sysfs"),
                          device_info_dir=str(root / "devinfo"), rdma=RecordingRdma("shared"),
                          pod_resources_socket=None)
    running = start(plugin, str(root / "cni.sock"))
    yield running
    running.stop()


@pytest.fixture
def good(bare: RunningService) -> dict:
    return {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
            "agentSocket": bare.socket_path}


GOOD_ENV = {"container_id": "c0ffee", "netns": "/proc/self/ns/net", "ifname": "net1",
            "args": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=u1"}


def call(shim, conf, command="ADD", **env):
    return run_shim(shim, command, conf, **{**GOOD_ENV, **env})


@pytest.mark.parametrize("stdin", [b"not json {", b"[1, 2, 3]", b'{"agentSocket": ', b""])
def test_undecodable_stdin_is_code_6(shim, stdin):
    r = run_shim(shim, "ADD", stdin, **GOOD_ENV)
    assert r.code == 1 and r.error == 6


@pytest.mark.parametrize("change, code, word", [
    ({"cniVersion": None}, 1, "cniVersion"),
    ({"cniVersion": "0.3.1"}, 1, "0.3.1"),
    ({"cniVersion": "2.0.0"}, 1, "2.0.0"),
    ({"name": None}, 7, "name"),
    ({"name": "a/b"}, 7, "name"),
    ({"ipam": {"type": "../../bin/sh"}}, 7, "ipam.type"),
    ({"ipam": []}, 7, "ipam"),
    ({"mtu": "big"}, 7, "mtu"),
    ({"mtu": 20}, 7, "mtu"),
    ({"mac": "01:00:00:00:00:01"}, 7, "multicast"),
    ({"interfaces": {"mtu": 9000}}, 7, "interfaces"),
    ({"interfaces": [{"mac": "zz"}]}, 7, "interfaces[0].mac"),
    ({"prevResult": []}, 7, "prevResult"),
    ({"runtimeConfig": {"mac": 5}}, 7, "runtimeConfig.mac"),
    ({"standalone": "yes"}, 7, "standalone"),
])
def test_invalid_config_names_the_key(shim, good, change, code, word):
    conf = {k: v for k, v in {**good, **change}.items() if v is not None}
    r = call(shim, conf)
    assert r.code == 1 and r.error == code
    assert word in r.out["msg"] + r.out.get("details", "")


def test_standalone_takes_its_state_folder_from_the_environment_never_the_config(tmp_path):
    from railyard.cni.standalone import node_state_dir

    own = tmp_path / "state"
    own.mkdir()
    env = {"RAILYARD_CNI_STATE_DIR": str(own)}
    assert node_state_dir(None, env) == str(own)
    assert node_state_dir(f"{own}/", env) == str(own)  # the same folder, spelt differently
    (tmp_path / "link").symlink_to(own)
    assert node_state_dir(str(tmp_path / "link"), env) == str(own)
    with pytest.raises(CniError) as e:
        node_state_dir(str(tmp_path / "forged"), env)
    assert e.value.code == 7 and "RAILYARD_CNI_STATE_DIR" in e.value.msg
    assert node_state_dir(None, {}) == "/var/lib/railyard"  # the agent's default


@pytest.mark.parametrize("env, word", [
    ({"container_id": ""}, "CNI_CONTAINERID"),
    ({"container_id": "bad/id"}, "CNI_CONTAINERID"),
    ({"ifname": ""}, "CNI_IFNAME"),
    ({"ifname": "a-very-long-ifname"}, "CNI_IFNAME"),
    ({"ifname": "a/b"}, "CNI_IFNAME"),
    ({"ifname": ".."}, "CNI_IFNAME"),
    ({"netns": ""}, "CNI_NETNS"),
    ({"netns": "relative/ns"}, "CNI_NETNS"),
    ({"args": "garbage"}, "CNI_ARGS"),
    ({"args": "K8S_POD_UID=u1;FOO=bar"}, "FOO"),
    ({"args": "IgnoreUnknown=maybe;K8S_POD_UID=u1"}, "IgnoreUnknown"),
    ({"args": "IgnoreUnknown=1;K8S_POD_UID=u1;K8S_POD_UID=u2"}, "K8S_POD_UID"),
    ({"args": "IgnoreUnknown=1"}, "K8S_POD_UID"),
])
def test_invalid_environment_is_code_4_naming_the_variable(shim, good, env, word):
    r = call(shim, good, **env)
    assert r.code == 1 and r.error == 4, r.out
    assert word in r.out["msg"]


def test_unknown_command_is_code_4(shim, good):
    assert call(shim, good, command="FROB").error == 4


def test_missing_netns_is_code_3(shim, good):
    r = call(shim, good, netns="/run/netns/does-not-exist")
    assert r.error == 3 and "does-not-exist" in r.out["msg"]


def test_ignore_unknown_accepts_true_and_unknown_keys_in_any_order(shim, good):
    args = "FOO=1;K8S_POD_UID=u1;IgnoreUnknown=true;K8S_POD_NAME=p;K8S_POD_NAMESPACE=default"
    # CHECK reads CNI_ARGS as ADD does; ADD would refuse GOOD_ENV's netns, the service's own
    # (test_wrong_namespace.py), and these tests run without root, so without another one.
    r = call(shim, good, command="CHECK", args=args)
    assert r.code == 0 and r.out is None  # unknown pod, nothing recorded: nothing to check


def test_gc_and_status_need_a_1_1_config(shim, good):
    for command in ("GC", "STATUS"):
        r = call(shim, good, command=command)
        assert r.error == 1 and "1.1.0" in r.out["msg"]


def test_errors_answer_in_the_configs_version(shim, good):
    for version in ("0.4.0", "1.0.0", "1.1.0"):
        r = call(shim, {**good, "cniVersion": version, "mtu": "x"})
        assert r.out["cniVersion"] == version
        assert set(r.out) == {"cniVersion", "code", "msg", "details"}


def test_del_with_nothing_recorded_succeeds_without_netns_or_path(shim, good):
    r = call(shim, good, command="DEL", netns="", args="")
    assert r.code == 0 and r.out is None


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    root = tmp_path_factory.mktemp("prop")
    from railyard.cni.grants import StoreGrants
    from railyard.node.state import StateStore

    p = Plugin(str(root / "state"), StoreGrants(StateStore(root / "state"), "node-a"),
               RecordingRdma("shared"), settings=Settings(sysfs_root=str(root / "sysfs")))
    yield p
    p.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
config_like = st.fixed_dictionaries(
    {}, optional={"cniVersion": st.sampled_from(["0.4.0", "1.0.0", "1.1.0", "9"]) | json_values,
                  "name": st.sampled_from(["rdma", ""]) | json_values,
                  "type": json_values, "ipam": json_values, "mtu": json_values,
                  "mac": json_values, "interfaces": json_values, "prevResult": json_values,
                  "runtimeConfig": json_values, "cni.dev/valid-attachments": json_values})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conf=config_like | json_values,
       command=st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "X"]),
       args=st.text(max_size=40), ifname=st.text(max_size=18))
def test_any_input_gets_a_spec_answer_never_a_traceback(plugin: Plugin, conf, command, args,
                                                        ifname):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": ifname, "CNI_ARGS": args, "CNI_PATH": "/nonexistent"}
    reply = plugin.handle(env, json.dumps(conf).encode())
    assert reply.stderr == b""  # stderr only ever carries an internal error's traceback
    if reply.code:
        err = json.loads(reply.stdout)
        assert isinstance(err["code"], int) and 1 <= err["code"] < 200 and err["msg"]
    elif reply.stdout:
        json.loads(reply.stdout)


def test_shim_answers_version_without_a_service(tmp_path: Path, shim):
    r = run_shim(shim, "VERSION", {"cniVersion": "0.4.0"})
    assert r.out["cniVersion"] == "0.4.0" and "1.1.0" in r.out["supportedVersions"]


def test_standalone_with_a_missing_host_netns_answers_code_5_not_a_traceback(shim, tmp_path):
    conf = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "standalone": True,
            "stateDir": str(tmp_path / "state")}
    r = run_shim(shim, "ADD", conf, **GOOD_ENV,
                 extra_env={"RAILYARD_CNI_HOST_NETNS": str(tmp_path / "no-such-netns"),
                            "RAILYARD_CNI_POD_RESOURCES": "",
                            "RAILYARD_CNI_STATE_DIR": str(tmp_path / "state")})
    assert r.code == 1 and r.error == 5
    assert "RAILYARD_CNI_HOST_NETNS" in r.out["msg"]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("pci", ["0000:00:01.0\n", "../../../etc", "0000:00:01.0/../..",
                                 "0000:00:01.8"])
def test_a_recorded_pci_address_that_is_not_one_never_reaches_the_file_system(pci, tmp_path):
    from railyard.cni.devices import netdev_of

    with pytest.raises(CniError, match="is not a PCI address"):
        netdev_of(str(tmp_path), pci)


DEEP = 100_000  # past the JSON parser's recursion limit (about 1,000 levels)


@pytest.mark.parametrize("stdin", [
    b'{"cniVersion": "1.0.0", "agentSocket": "/x", "a": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    b'{"cniVersion": "1.0.0", "standalone": true, "a": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    b"[" * DEEP + b'"agentSocket"' + b"]" * DEEP,
], ids=["agent-socket", "standalone", "bare-list"])
def test_a_config_nested_too_deeply_is_code_6_from_the_shim_not_a_traceback(shim, stdin):
    # Issue 19, class 7: the shim parses configs that name agentSocket or standalone itself,
    # and its parser's RecursionError escaped as a traceback with no CNI error on stdout.
    r = call(shim, stdin)
    assert r.code == 1 and r.error == 6, (r.out, r.stderr[-300:])
    assert "nested too deeply" in r.out["msg"]
    assert "Traceback" not in r.stderr


def test_version_with_a_config_nested_too_deeply_still_answers(shim):
    r = call(shim, b'{"agentSocket": ' + b"[" * DEEP + b"]" * DEEP + b"}", command="VERSION")
    assert r.code == 0 and "1.1.0" in r.out["supportedVersions"], r.stderr[-300:]


@pytest.mark.parametrize("depth", [DEEP, 900], ids=["past-the-parser", "past-our-limit"])
def test_the_service_answers_a_deeply_nested_config_with_code_6(plugin: Plugin, depth):
    # 900 levels parse, but near the parser's limit a config overflows the stack later (ADD
    # dumps it into the attachment record, frames deeper), so the service refuses any
    # config deeper than MAX_CONFIG_DEPTH at the door.
    stdin = (b'{"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "ipam": '
             b'{"type": "host-local", "x": ' + b"[" * depth + b"]" * depth + b"}}")
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "net1", "CNI_ARGS": "K8S_POD_UID=u1", "CNI_PATH": "/nonexistent"}
    reply = plugin.handle(env, stdin)
    assert reply.code == 1 and reply.stderr == b""
    err = json.loads(reply.stdout)
    assert err["code"] == 6 and "nested" in err["msg"], err


def test_a_cni_ifname_that_is_not_utf8_is_code_4_naming_it(shim, good):
    # Issue 19, class 7: it was an internal error (code 5) from encoding the name.
    r = call(shim, good, ifname="net\udcff")  # the runtime's bytes b"net\xff"
    assert r.code == 1 and r.error == 4, r.out
    assert r.out["msg"].startswith("CNI_IFNAME") and "not valid UTF-8" in r.out["msg"]
