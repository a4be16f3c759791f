"""What every CNI verb works on: one node's attachment records, grants, RDMA, IPAM plugins and
host namespace, with the node-side settings. `Plugin` (plugin.py) is this plus the entry point;
the verbs (add.py, delete.py, check.py, gc.py, status.py) take it as their first argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from railyard.cni.grants import Grants, PodDevices
from railyard.cni.ipam import Ipam
from railyard.cni.netns import Netns
from railyard.cni.rdma import RdmaNetns
from railyard.cni.spec import PodArgs
from railyard.node.attachments import AttachmentStore
from railyard.node.paths import CNI_DEVINFO_DIR

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settings:
    """Node-side settings. Never read from a network config: whoever writes one (a namespace
    user, through a NetworkAttachmentDefinition) must not choose where devices are looked up."""

    sysfs_root: str = "/"
    host_netns: str | None = None  # None: the service's own namespace
    device_info_dir: str = CNI_DEVINFO_DIR
    lock_timeout_s: float = 30.0  # a device's lock
    # An attachment's lock: a DEL or GC waits this long for an ADD of the same attachment
    # (which may hold it through its grant lookup, its device locks and IPAM), then answers
    # "try again" (code 11). Below the shim's 120 s call timeout.
    attachment_lock_timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class PodInterface:
    """One interface an ADD gave the pod: its device (PCI address), its name in the pod, its
    MAC and the addresses IPAM gave it (CIDR form, as the CNI result lists them)."""

    pci: str
    name: str
    mac: str
    ips: tuple[str, ...] = ()


# Told after each ADD that moved devices, on the ADD's thread, before it answers: the pod as
# the node's record names it and its interfaces in pair order. Must not block (the agent
# hands it to its loop: a DRA claim's status, decision 0113); what it raises is logged only.
InterfacesAdded = Callable[[PodArgs, tuple[PodInterface, ...]], object]


class NodeContext:
    """One node as the verbs see it. Thread-safe: each call runs on its caller's thread; calls
    of the same attachment serialise on its lock (records.hold), then calls touching the same
    device on that device's lock (records.lock), always in that order."""

    def __init__(self, state_dir: str, grants: Grants, rdma: RdmaNetns, *,
                 settings: Settings | None = None, pod_devices: PodDevices | None = None,
                 ipam: Ipam | None = None) -> None:
        self.settings = settings or Settings()
        self.store = AttachmentStore(state_dir)
        self.grants = grants
        self.rdma = rdma
        self.pod_devices = pod_devices
        self.ipam = ipam or Ipam()
        # Asked once at start: the kernel's mode changes only while no other netns exists.
        self.rdma_mode = rdma.mode()
        self.host = (Netns.open(self.settings.host_netns) if self.settings.host_netns
                     else Netns.current())
        # Namespaces no ADD may target: the host's (where granted devices live) and the
        # service's own, known by identity so that no path spelling (/run/netns/…, a bind
        # mount, /proc/<pid>/ns/net, /proc/self/ns/net) names them past the check.
        with Netns.current() as own:
            self.own_namespaces = frozenset({self.host.identity(), own.identity()})
        # IPAM calls run here, concurrently with each other and with the devices' moves.
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="railyard-ipam")
        self.on_added: InterfacesAdded | None = None

    def added(self, pod: PodArgs, interfaces: tuple[PodInterface, ...]) -> None:
        """Tell `on_added`; a failure there never fails the ADD (the pod has its devices)."""
        if self.on_added is None:
            return
        try:
            self.on_added(pod, interfaces)
        except Exception:
            log.exception("cni: telling of pod %s's interfaces failed", pod.uid)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.host.close()
