"""Fuzz sweep, what a runtime and a network config's author send the CNI plugin: a precise
error, no state change, bounded cost.

Covered (each fed mutations of a valid call and raw bytes):
- `cni.spec.parse_env` (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS,
  CNI_PATH; values as the shim hands them over, bytes that are not UTF-8 included) → the
  call or `CniError` code 4 naming the variable;
- `cni.spec.load_config` (stdin) → an object or `CniError` code 6, and `parse_netconf` →
  `NetConf` or `CniError` code 1 (cniVersion) or 7 naming the key;
- `cni.spec.parse_ipam_result` (what a delegated IPAM plugin prints) → a result or
  `CniError` code 6 naming the field;
- the plugin's one entry, `Plugin.handle(env, stdin)`, over a node state folder that grants
  the pod VFs its sysfs does not have: always the spec's answer (an error as JSON with a code
  of the spec's or Railyard's, never an internal error or a traceback), and a refused call
  leaves the state folder as it was, with no attachment record;
- the shim (`cni.shim`): its stdin reader `_config`, the frame's `decode_env`, and `main`
  run in-process with a service that is not there (and standalone mode's node settings
  pointing at nothing): it always prints CNI JSON and exits 0 or 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from fuzz_strategies import (
    FUZZ,
    ODD_TEXT,
    call,
    documents,
    materialise,
    mutated,
    names_a_field,
    raw_bytes,
    to_json,
)
from hypothesis import event, given
from hypothesis import strategies as st

from railyard.allocation.types import Allocation, GpuRef, Pair
from railyard.cni import shim
from railyard.cni.grants import StoreGrants
from railyard.cni.plugin import Plugin, Settings
from railyard.cni.spec import (
    CniError,
    Code,
    load_config,
    parse_env,
    parse_ipam_result,
    parse_netconf,
)
from railyard.node.state import PodKey, StateStore
from railyard.topology.model import Distance
from support.cni import IS_ROOT, NODE, TOPOLOGY, netns_add, netns_del, vf_ref

UID = "6f1c0a3e-0000-4000-8000-000000000001"
CODES = {int(c) for c in Code}
CONFIG = {
    "cniVersion": "1.1.0", "name": "rdma", "type": "railyard-cni", "mtu": 9000,
    "mac": "02:00:00:00:00:01",
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.47.0.0/24"}]]},
    "interfaces": [{"mtu": 9000, "mac": "02:00:00:00:00:02", "ipam": {"type": "static"}}],
    "runtimeConfig": {"mac": "02:00:00:00:00:03"},
    "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
                   "ips": [{"address": "10.0.0.2/24", "interface": 0}],
                   "routes": [{"dst": "0.0.0.0/0"}]},
    "cni.dev/valid-attachments": [{"containerID": "c0ffee", "ifname": "net1"}],
}
IPAM_RESULT = {"cniVersion": "1.1.0", "ips": [{"address": "10.47.0.2/24", "gateway": "10.47.0.1"}],
               "routes": [{"dst": "0.0.0.0/0", "gw": "10.47.0.1"}], "dns": {"nameservers": []}}
COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")


def _damaged(v: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(ODD_TEXT),
                     st.sampled_from(("\n", " ", "\x00", "\udcff", ";", "=", "/", "é"))
                     .map(lambda s: v + s),
                     st.text(max_size=20), st.just(v * 50))


@st.composite
def environments(draw: st.DrawFn, netns: str) -> dict[str, str]:
    """A runtime's CNI_* variables for the granted pod, none to three of them damaged or
    replaced (text the shim passes on from bytes that are not UTF-8 included) or left out."""
    # ADD most often: the one verb that moves devices and writes records.
    env = {"CNI_COMMAND": draw(st.sampled_from(("ADD", "ADD", *COMMANDS))),
           "CNI_CONTAINERID": "c0ffee",
           "CNI_NETNS": netns, "CNI_IFNAME": "net1",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;"
                       f"K8S_POD_UID={UID}",
           "CNI_PATH": "/nonexistent/cni/bin"}
    for _ in range(draw(st.sampled_from((0, 0, 1, 2, 3)))):
        key = draw(st.sampled_from(sorted(env)))
        if draw(st.integers(0, 3)) == 0:
            del env[key]
        else:
            env[key] = draw(_damaged(env[key]))
    return env


def _says_env(e: BaseException) -> bool:
    return isinstance(e, CniError) and e.code == Code.INVALID_ENV and e.msg.startswith("CNI_")


@FUZZ
@given(environments("/run/netns/pod"))
def test_the_environment_is_a_call_or_code_4_naming_the_variable(env):
    # The runtime's own values may be quoted back to it, whole (as Python writes them).
    call(lambda: parse_env(env), CniError, says=_says_env,
         echoes=sum(len(ascii(v)) for v in env.values()))


def _says_config(e: BaseException) -> bool:
    assert isinstance(e, CniError)
    if e.code == Code.INCOMPATIBLE_VERSION:
        return e.msg.startswith("cniVersion")
    return e.code == Code.INVALID_CONFIG and names_a_field(e)


@FUZZ
@given(raw_bytes(CONFIG))
def test_stdin_is_a_config_or_code_6_then_a_netconf_or_code_1_or_7(stdin):
    out = call(lambda: load_config(stdin), CniError,
               says=lambda e: isinstance(e, CniError) and e.code == Code.DECODE)
    if not out.refused:
        # The config's values may be quoted back to the runtime that sent it, whole.
        call(lambda: parse_netconf(out.value), CniError, says=_says_config,
             echoes=len(ascii(stdin)))


@FUZZ
@given(mutated(CONFIG).filter(lambda d: isinstance(d, dict)))  # load_config gives an object
def test_a_decoded_config_is_a_netconf_or_code_1_or_7_naming_the_key(doc):
    data = materialise(doc)
    call(lambda: parse_netconf(data), CniError, says=_says_config,
         echoes=len(ascii(to_json(doc))))


@FUZZ
@given(documents(IPAM_RESULT))
def test_an_ipam_plugins_result_is_a_result_or_code_6_naming_the_field(doc):
    data = materialise(doc)
    # The plugin's values may be quoted to the runtime, whole.
    call(lambda: parse_ipam_result(data, "host-local"), CniError,
         says=lambda e: isinstance(e, CniError) and e.code == Code.DECODE
         and e.msg.startswith("IPAM plugin host-local result"),
         echoes=len(ascii(to_json(doc))))


# ----------------------------------------------------------------------- the plugin


@pytest.fixture(scope="module")
def pod_netns() -> Iterator[str]:
    """A network namespace that is not the plugin's own: ADD gets past the namespace checks
    to the grant and the devices. Without root, the plugin's own (ADD refuses it early)."""
    if not IS_ROOT:
        yield "/proc/self/ns/net"
        return
    name = netns_add()
    try:
        yield f"/run/netns/{name}"
    finally:
        netns_del(name)


@pytest.fixture(scope="module")
def node(pod_netns: str) -> Iterator[tuple[Plugin, Path, str]]:
    """The plugin over a state folder granting pod p two VFs that its (empty) sysfs does not
    have: ADD goes as far as looking for them and must fail leaving nothing behind."""
    with tempfile.TemporaryDirectory(prefix="ry-fuzz-cni-") as d:
        root = Path(d)
        store = StateStore(root / "state", node=NODE)
        nics = (vf_ref(0, 0), vf_ref(1, 0))
        pairs = tuple(Pair(GpuRef.of(g), n, Distance.PIX)
                      for g, n in zip(TOPOLOGY.gpus, nics, strict=False))
        store.put(PodKey(UID, "default", "p"), Allocation(
            node=NODE, numa_nodes=(0,), cpus=None, memory_bytes=(), pairs=pairs,
            decided_at="2026-01-01T00:00:00Z"))
        plugin = Plugin(str(root / "state"), StoreGrants(store, NODE), _NoRdma(),
                        settings=Settings(sysfs_root=str(root / "sysfs"),
                                          device_info_dir=str(root / "devinfo"),
                                          lock_timeout_s=1.0))
        try:
            yield plugin, root / "state", pod_netns
        finally:
            plugin.close()


class _NoRdma:
    """RDMA netlink that is never reached: nothing here may move a device."""

    def mode(self) -> str:
        return "shared"

    def place(self, device: str, netns: object) -> None:
        raise AssertionError("a fuzzed call reached RDMA netlink")

    holds = move = place


def _files(folder: Path) -> dict[str, bytes]:
    """The state folder's files and contents, its lock files aside (empty, made on first use
    of a device's lock and kept for the next)."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".lock"}


def _attachments(folder: Path) -> list[Path]:
    return list((folder / "cni").rglob("attachments/**/*.json"))


config_stdin = st.one_of(
    documents(CONFIG).map(lambda d: to_json(d).encode("utf-8", "surrogatepass")),
    raw_bytes(CONFIG))


@FUZZ
@given(env=environments("/run/netns/pod"), stdin=config_stdin)
def test_the_plugin_answers_in_spec_and_a_refused_call_leaves_no_trace(node, env, stdin):
    plugin, state, netns = node
    if env.get("CNI_NETNS") == "/run/netns/pod":
        env = {**env, "CNI_NETNS": netns}
    before = _files(state)
    out = call(lambda: plugin.handle(env, stdin), ())
    reply = out.value
    assert reply.stderr == b"", reply.stderr[-500:]  # only an internal error writes there
    assert reply.code in (0, 1)
    if reply.code == 0:
        event(f"{env.get('CNI_COMMAND')!a}: ok")
    if reply.code == 1:
        error = json.loads(reply.stdout)
        event(f"{env.get('CNI_COMMAND')!a}: code {error['code']}")
        assert error["code"] in CODES and error["code"] != Code.IO, error
        # It may quote the runtime's own values back to it, whole (as Python writes them).
        echoes = sum(len(ascii(v)) for v in env.values()) + len(ascii(stdin))
        assert error["msg"] and len(error["msg"]) <= 2000 + 4 * echoes, error
        assert _files(state) == before
    assert _attachments(state) == []


# ----------------------------------------------------------------------- the shim


@FUZZ
@given(raw_bytes({**CONFIG, "agentSocket": "/nonexistent/cni.sock"}))
def test_the_shims_stdin_reader_answers_a_config_or_why_not(stdin):
    out = call(lambda: shim._config(stdin), ())
    assert isinstance(out.value, dict) or out.value in (shim.NOT_AN_OBJECT,
                                                       shim.NESTED_TOO_DEEPLY)
    call(lambda: shim._asked_version(stdin), ())


@FUZZ
@given(st.binary(max_size=200))
def test_the_shims_frame_environment_always_decodes(blob):
    env = call(lambda: shim.decode_env(blob), ()).value
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


def _environ_can_hold(value: str) -> bool:
    """What a process environment can carry: bytes without NUL (os.environ's encoding)."""
    try:
        return b"\0" not in os.fsencode(value)
    except UnicodeEncodeError:
        return False


@contextlib.contextmanager
def _as_the_runtime(env: dict[str, str], stdin: bytes, folder: Path) -> Iterator[io.BytesIO]:
    """sys.stdin/stdout and os.environ as a runtime sets them for the shim."""
    out = io.BytesIO()
    fake_in = mock.Mock(buffer=io.BytesIO(stdin))
    fake_out = mock.Mock(buffer=out)
    node_env = {"RAILYARD_CNI_STATE_DIR": str(folder / "state"),
                "RAILYARD_CNI_HOST_NETNS": str(folder / "no-such-netns"),
                "RAILYARD_CNI_POD_RESOURCES": "", "RAILYARD_CNI_SYSFS_ROOT": str(folder),
                "RAILYARD_CNI_DEVINFO_DIR": str(folder / "devinfo")}
    with mock.patch.object(sys, "argv", ["railyard-cni"]), \
            mock.patch.object(sys, "stdin", fake_in), mock.patch.object(sys, "stdout", fake_out), \
            mock.patch.dict(os.environ, {**node_env, **env}, clear=True), \
            mock.patch.object(shim, "DEFAULT_SOCKET", str(folder / "no-service.sock")):
        yield out


@pytest.fixture(scope="module")
def shim_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ry-fuzz-shim-") as d:
        yield Path(d)


def _shim_stdin(folder: Path) -> st.SearchStrategy[bytes]:
    agent = {**CONFIG, "agentSocket": str(folder / "no-service.sock")}
    standalone = {**CONFIG, "standalone": True}
    return st.one_of(raw_bytes(agent), raw_bytes(standalone), raw_bytes(CONFIG))


@FUZZ
@given(data=st.data())
def test_the_shim_always_prints_cni_json_and_exits_0_or_1(shim_folder, data):
    env = {k: v for k, v in data.draw(environments("/run/netns/pod")).items()
           if _environ_can_hold(v)}
    stdin = data.draw(_shim_stdin(shim_folder))
    with _as_the_runtime(env, stdin, shim_folder) as out:
        exit_ = call(shim.main, SystemExit, time_s=2.0).error
    assert exit_ is not None and exit_.code in (0, 1)
    answer = json.loads(out.getvalue())
    if exit_.code == 1:
        assert answer["code"] in CODES and answer["msg"], answer
    else:
        assert env.get("CNI_COMMAND") == "VERSION" or "cniVersion" in answer, answer
    assert not (shim_folder / "state").exists() or _attachments(shim_folder / "state") == []

