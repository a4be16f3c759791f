"""The CNI entry point: one call as a runtime makes it, dispatched to its verb.

`Plugin.handle(env, stdin)` answers (exit code, stdout, stderr) and never raises. The service
runs it warm behind the shim; standalone mode runs it in the shim's own process. Each verb is
its own module, a function of the node (context.py), the call and the config: add.py, delete.py,
check.py, gc.py, status.py; VERSION needs no node and is answered here. What they share is in
records.py (an attachment's record and locks), moves.py (its devices out and back) and
addresses.py (its IPAM calls).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from railyard.cni.add import add
from railyard.cni.check import check
from railyard.cni.context import NodeContext, Settings
from railyard.cni.delete import delete
from railyard.cni.gc import gc
from railyard.cni.metrics import CniMetrics
from railyard.cni.records import state_failure
from railyard.cni.spec import (
    LATEST_VERSION,
    SUPPORTED_VERSIONS,
    Call,
    CniError,
    Code,
    NetConf,
    load_config,
    parse_env,
    parse_netconf,
    reply_version,
    version_key,
)
from railyard.cni.status import status
from railyard.node.attachments import AttachmentRecord
from railyard.node.errors import StateError
from railyard.records.logline import decision_line

__all__ = ["VERBS", "Plugin", "Reply", "Settings"]

log = logging.getLogger(__name__)

# A verb's answer: the result document to print, or None for an empty success.
Verb = Callable[[NodeContext, Call, NetConf], dict | None]

VERBS: Mapping[str, Verb] = {
    "ADD": add,
    "DEL": delete,
    "CHECK": check,
    "GC": gc,
    "STATUS": status,
}
# Verbs CNI 1.1.0 added: a config of an older version cannot ask for them.
NEEDS_1_1 = frozenset({"GC", "STATUS"})


LOGGED = frozenset({"ADD", "DEL"})  # the calls that move devices: one line each


@dataclass(slots=True)
class _Seen:
    """What `_handle` learnt of a call, for its log line."""

    call: Call | None = None
    conf: NetConf | None = None
    before: AttachmentRecord | None = None  # a DEL's record, read before it is forgotten


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    stdout: bytes = b""
    stderr: bytes = b""


class Plugin(NodeContext):
    """The CNI verbs over one node: its attachment records, grants, sysfs, netns and IPAM
    plugins (`NodeContext`), and the one entry point a runtime's call comes in by."""

    metrics: CniMetrics | None = None  # set by whoever serves it (`service.build_plugin`)

    def handle(self, env: Mapping[str, str], stdin: bytes) -> Reply:
        t0 = time.perf_counter()
        seen = _Seen()
        reply = self._handle(env, stdin, seen)
        command = env.get("CNI_COMMAND", "")
        if self.metrics is not None and command in (*VERBS, "VERSION"):
            self.metrics.observe(command, reply.code == 0, time.perf_counter() - t0)
        if seen.call is not None and seen.call.command in LOGGED:
            log.info("%s", self._line(seen, reply))
        return reply

    def _line(self, seen: _Seen, reply: Reply) -> str:
        """An ADD's or DEL's one line (docs/observability.md): the pod, the devices moved
        (PCI address, host name > pod name) and the outcome."""
        call, conf = seen.call, seen.conf
        assert call is not None
        rec = seen.before
        if rec is None and conf is not None and call.command == "ADD" and reply.code == 0:
            with contextlib.suppress(Exception):  # a log line never fails a call
                rec = self.store.load(conf.name, call.container_id, call.ifname)
        why = None
        if reply.code != 0:
            with contextlib.suppress(ValueError, AttributeError):
                err = json.loads(reply.stdout)
                why = f"code {err.get('code')}: {err.get('msg')}"
        pod = call.args
        return decision_line(
            call.command.lower(), outcome="ok" if reply.code == 0 else "error",
            pod=f"{pod.namespace}/{pod.name}" if pod.namespace and pod.name else None,
            uid=pod.uid, container=call.container_id[:12] or None, ifname=call.ifname,
            network=conf.name if conf is not None else None,
            moved=",".join(f"{d.pci}:{d.original_name}>{d.ifname}"
                           for d in (rec.devices if rec is not None else ())) or None,
            why=why)

    def _handle(self, env: Mapping[str, str], stdin: bytes, seen: _Seen) -> Reply:
        version = LATEST_VERSION
        try:
            call = parse_env(env)
            if call.command == "VERSION":
                return _version(stdin)
            seen.call = call
            data = load_config(stdin)
            version = reply_version(data)
            conf = parse_netconf(data)
            seen.conf = conf
            if call.command in NEEDS_1_1 and version_key(conf.version) < (1, 1, 0):
                raise CniError(Code.INCOMPATIBLE_VERSION,
                               f"{call.command} needs cniVersion 1.1.0, the config has "
                               f"{conf.version}")
            if call.command == "DEL" and log.isEnabledFor(logging.INFO):
                with contextlib.suppress(Exception):  # what DEL will put back, for its line
                    seen.before = self.store.load(conf.name, call.container_id, call.ifname)
            out = VERBS[call.command](self, call, conf)
            return Reply(0, _json_line(out) if out is not None else b"")
        except CniError as e:
            return Reply(1, _json_line(e.to_json(version)))
        except StateError as e:  # the node's state folder failed us mid-call
            return Reply(1, _json_line(state_failure(e).to_json(version)))
        except Exception as e:  # never a traceback to the runtime; the log keeps it
            log.error("cni: unexpected failure\n%s", traceback.format_exc())
            err = CniError(Code.IO, f"internal error: {type(e).__name__}: {e}")
            return Reply(1, _json_line(err.to_json(version)), traceback.format_exc().encode())


def _version(stdin: bytes) -> Reply:
    """VERSION: the versions spoken, in the config's version when it names one."""
    try:
        version = reply_version(load_config(stdin))
    except CniError:
        version = LATEST_VERSION
    return Reply(0, _json_line({"cniVersion": version,
                                "supportedVersions": list(SUPPORTED_VERSIONS)}))


def _json_line(doc: object) -> bytes:
    return (json.dumps(doc) + "\n").encode()
