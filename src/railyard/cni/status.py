"""CNI STATUS (1.1.0): ready when the node's state folder is writable and every IPAM plugin
the network names is there and ready; otherwise code 50 (not available)."""

from __future__ import annotations

import os

from railyard.cni import addresses
from railyard.cni.context import NodeContext
from railyard.cni.spec import Call, CniError, Code, NetConf


def status(node: NodeContext, call: Call, conf: NetConf) -> None:
    if not os.access(node.store.root, os.W_OK):
        raise CniError(Code.NOT_AVAILABLE, f"state folder {node.store.root} is not writable")
    for spec in addresses.distinct_ipams(conf):
        try:
            exe = node.ipam.find(spec["type"], call.path)
        except CniError as e:
            raise CniError(Code.NOT_AVAILABLE, e.msg) from None
        node.ipam.gc_or_status(exe, "STATUS", conf.raw, spec, call.path)
    return None
