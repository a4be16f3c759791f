"""Benchmark: Kubernetes API clients on the hot paths Railyard uses, against a real API server.

Candidates: Railyard's own thin client (`railyard.kube`: aiohttp + msgspec, decoding only the
fields it reads), `kubernetes_asyncio`, `lightkube` (async) and the official `kubernetes`
client (synchronous). Each, in the same run, against the same API server (the test box:
`hack/box up --dir DIR`):

- LIST of N pods (default 1,000), decoded into the client's objects;
- a watch stream of N MODIFIED events (the harness patches every pod, then each client
  watches from the resourceVersion before the patches: the server replays them from its
  watch cache), decoded;
- a bind: PATCH of one pod annotation, then create its `pods/binding` (sequential, one
  latency per pod);
- import time and RSS (a fresh interpreter: import, build a client, LIST the N pods and keep
  them; RSS after import and after the list).

    hack/box up --dir /tmp/box
    python benchmarks/kube_client.py --kubeconfig /tmp/box/admin.kubeconfig
    python benchmarks/kube_client.py --kubeconfig ... --clients thin,lightkube --reps 3

The candidates other than `thin` are not Railyard dependencies: install them to compare
(`pip install kubernetes_asyncio lightkube kubernetes`); a missing one is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from railyard.kube.client import ApiError, Client
from railyard.kube.config import load_kubeconfig
from railyard.kube.objects import Object, Pod, WatchEvent

# Pods are bound to a Node object no kubelet serves: nothing runs them, and the pod garbage
# collector (which deletes pods bound to a node that does not exist) leaves them alone.
NOWHERE = "bench-nowhere"
CLIENTS = ("thin", "kubernetes_asyncio", "lightkube", "kubernetes")


def pod_body(name: str, node: str | None) -> dict[str, Any]:
    """A pod of realistic size (~3 KB as stored): two containers, env, resources, labels."""
    env = [{"name": f"VAR_{i}", "value": f"value-{i}-" + "x" * 20} for i in range(10)]
    resources = {"limits": {"nvidia.com/gpu": "2", "railyard.dev/vf": "2", "cpu": "8",
                            "memory": "64Gi"}}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "trainer", "image": "railyard.test/busybox:box", "env": env,
             "command": ["sleep", "3600"], "resources": resources},
            {"name": "sidecar", "image": "railyard.test/busybox:box",
             "command": ["sleep", "3600"]},
        ],
        "schedulerName": "bench-nobody",  # kube-scheduler leaves it alone
        "terminationGracePeriodSeconds": 0,
        # The node never becomes Ready: do not let its NoExecute taints evict the pods.
        "tolerations": [{"operator": "Exists", "effect": "NoExecute"}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "bench", "team": "rail"},
                         "annotations": {"bench/note": "y" * 200}},
            "spec": spec}


# ---------------------------------------------------------------------------- harness


async def create_pods(c: Client, ns: str, names: list[str], node: str | None) -> None:
    sem = asyncio.Semaphore(32)

    async def one(name: str) -> None:
        async with sem:
            await c.create(f"/api/v1/namespaces/{ns}/pods", pod_body(name, node), Object)

    await asyncio.gather(*(one(n) for n in names))


async def patch_all(c: Client, ns: str, names: list[str], value: str) -> None:
    sem = asyncio.Semaphore(32)

    async def one(name: str) -> None:
        async with sem:
            await c.patch(f"/api/v1/namespaces/{ns}/pods/{name}",
                          {"metadata": {"annotations": {"bench/tick": value}}}, Object)

    await asyncio.gather(*(one(n) for n in names))


# ---------------------------------------------------------------------------- candidates
# Each: async setup(kubeconfig) → handle; list(h, ns) → count; watch(h, ns, rv, n) → count;
# bind(h, ns, pod) → None; close(h).


class Thin:
    def __init__(self, kubeconfig: str) -> None:
        self.c = Client(load_kubeconfig(kubeconfig), qps=1e6, burst=10**6)
        self.event = msgspec.json.Decoder(WatchEvent)
        self.pod = msgspec.json.Decoder(Pod)

    async def list(self, ns: str) -> int:
        items, _ = await self.c.list(f"/api/v1/namespaces/{ns}/pods", Pod, page_size=100000)
        return len(items)

    async def watch(self, ns: str, rv: str, n: int) -> int:
        seen = 0
        params = {"resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
        async for line in self.c.watch_lines(f"/api/v1/namespaces/{ns}/pods", params):
            event = self.event.decode(line)
            if event.type == "MODIFIED":
                self.pod.decode(event.object)
                seen += 1
                if seen == n:
                    break
        return seen

    async def bind(self, ns: str, pod: str) -> None:
        base = f"/api/v1/namespaces/{ns}/pods/{pod}"
        await self.c.patch(base, {"metadata": {"annotations": {"railyard.dev/allocation":
                                                               "{}"}}}, Object)
        await self.c.request("POST", base + "/binding", body={
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NOWHERE}})

    async def close(self) -> None:
        await self.c.close()


class KubernetesAsyncio:
    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig

    async def start(self) -> None:
        from kubernetes_asyncio import client, config, watch
        cfg = client.Configuration()
        await config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.v1 = client.CoreV1Api(self.api)
        self.client, self.watch_mod = client, watch

    async def list(self, ns: str) -> int:
        return len((await self.v1.list_namespaced_pod(ns)).items)

    async def watch(self, ns: str, rv: str, n: int) -> int:
        seen = 0
        w = self.watch_mod.Watch()
        async with w.stream(self.v1.list_namespaced_pod, ns, resource_version=rv,
                            allow_watch_bookmarks=True, timeout_seconds=60) as stream:
            async for event in stream:
                if event["type"] == "MODIFIED":
                    seen += 1
                    if seen == n:
                        break
        return seen

    async def bind(self, ns: str, pod: str) -> None:
        c = self.client
        await self.v1.patch_namespaced_pod(
            pod, ns, {"metadata": {"annotations": {"railyard.dev/allocation": "{}"}}})
        body = c.V1Binding(metadata=c.V1ObjectMeta(name=pod),
                           target=c.V1ObjectReference(api_version="v1", kind="Node",
                                                      name=NOWHERE))
        # _preload_content=False: the generated model rejects the Status the server answers.
        resp = await self.v1.create_namespaced_binding(ns, body, _preload_content=False)
        await resp.read()

    async def close(self) -> None:
        await self.api.close()


class Lightkube:
    def __init__(self, kubeconfig: str) -> None:
        from lightkube import AsyncClient, KubeConfig
        self.c = AsyncClient(KubeConfig.from_file(kubeconfig))

    async def list(self, ns: str) -> int:
        from lightkube.resources.core_v1 import Pod as LkPod
        return len([p async for p in self.c.list(LkPod, namespace=ns)])

    async def watch(self, ns: str, rv: str, n: int) -> int:
        from lightkube.resources.core_v1 import Pod as LkPod
        seen = 0
        # lightkube's watch has no allowWatchBookmarks option.
        async for kind, _obj in self.c.watch(LkPod, namespace=ns, resource_version=rv,
                                             server_timeout=60):
            if kind == "MODIFIED":
                seen += 1
                if seen == n:
                    break
        return seen

    async def bind(self, ns: str, pod: str) -> None:
        from lightkube.models.core_v1 import ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Pod as LkPod
        from lightkube.resources.core_v1 import PodBinding
        from lightkube.types import PatchType
        await self.c.patch(LkPod, pod, {"metadata": {"annotations": {
            "railyard.dev/allocation": "{}"}}}, namespace=ns, patch_type=PatchType.MERGE)
        binding = PodBinding(metadata=ObjectMeta(name=pod), target=ObjectReference(
            apiVersion="v1", kind="Node", name=NOWHERE))
        # The server answers a binding with a Status, which lightkube decodes as a Binding
        # and refuses: the bind itself has happened.
        with contextlib.suppress(msgspec.ValidationError):
            await self.c.create(binding, name=pod, namespace=ns)

    async def close(self) -> None:
        await self.c.close()


class KubernetesSync:
    """The official client is synchronous: in an asyncio service each call would go to a
    thread; measured here as called directly."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config, watch
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.v1 = client.CoreV1Api(self.api)
        self.client, self.watch_mod = client, watch

    async def list(self, ns: str) -> int:
        return len(self.v1.list_namespaced_pod(ns).items)

    async def watch(self, ns: str, rv: str, n: int) -> int:
        seen = 0
        w = self.watch_mod.Watch()
        for event in w.stream(self.v1.list_namespaced_pod, ns, resource_version=rv,
                              allow_watch_bookmarks=True, timeout_seconds=60):
            if event["type"] == "MODIFIED":
                seen += 1
                if seen == n:
                    w.stop()
                    break
        return seen

    async def bind(self, ns: str, pod: str) -> None:
        c = self.client
        self.v1.patch_namespaced_pod(
            pod, ns, {"metadata": {"annotations": {"railyard.dev/allocation": "{}"}}})
        body = c.V1Binding(metadata=c.V1ObjectMeta(name=pod),
                           target=c.V1ObjectReference(api_version="v1", kind="Node",
                                                      name=NOWHERE))
        self.v1.create_namespaced_binding(ns, body, _preload_content=False).read()

    async def close(self) -> None:
        self.api.close()


async def make(name: str, kubeconfig: str) -> Any:
    if name == "thin":
        return Thin(kubeconfig)
    if name == "kubernetes_asyncio":
        h = KubernetesAsyncio(kubeconfig)
        await h.start()
        return h
    if name == "lightkube":
        return Lightkube(kubeconfig)
    return KubernetesSync(kubeconfig)


# ---------------------------------------------------------------------------- import + RSS

PROBE = """
import json, sys, time, asyncio
t0 = time.perf_counter()
name, kubeconfig, ns = sys.argv[1:4]
if name == "thin":
    from railyard.kube.client import ApiError, Client
    from railyard.kube.config import load_kubeconfig
    from railyard.kube.objects import Pod
    c = Client(load_kubeconfig(kubeconfig))
    async def go():
        items, _ = await c.list(f"/api/v1/namespaces/{ns}/pods", Pod, page_size=100000)
        await c.close()
        return items
elif name == "kubernetes_asyncio":
    from kubernetes_asyncio import client, config
    async def go():
        cfg = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        api = client.ApiClient(cfg)
        items = (await client.CoreV1Api(api).list_namespaced_pod(ns)).items
        await api.close()
        return items
elif name == "lightkube":
    from lightkube import AsyncClient, KubeConfig
    from lightkube.resources.core_v1 import Pod
    c = AsyncClient(KubeConfig.from_file(kubeconfig))
    async def go():
        items = [p async for p in c.list(Pod, namespace=ns)]
        await c.close()
        return items
else:
    from kubernetes import client, config
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = client.ApiClient(cfg)
    async def go():
        return client.CoreV1Api(api).list_namespaced_pod(ns).items
t1 = time.perf_counter()
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
r1 = rss()
items = asyncio.run(go())
print(json.dumps({"import_s": t1 - t0, "rss_import": r1, "rss_list": rss(), "n": len(items)}))
"""


def probe(name: str, kubeconfig: str, ns: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE, name, kubeconfig, ns], check=True,
                         capture_output=True, text=True, env=os.environ)
    return json.loads(out.stdout)


def available(name: str) -> bool:
    if name == "thin":
        return True
    try:
        __import__(name)
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------- run


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    t = time.perf_counter()
    result = await fn()
    return time.perf_counter() - t, result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    names = [c for c in args.clients.split(",") if available(c)]
    skipped = [c for c in args.clients.split(",") if c not in names]
    harness = Client(load_kubeconfig(args.kubeconfig), qps=1e6, burst=10**6)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    await harness.create("/api/v1/namespaces", {"metadata": {"name": ns}}, Object)
    with contextlib.suppress(ApiError):  # left by an earlier run
        await harness.create("/api/v1/nodes", {"metadata": {"name": NOWHERE}}, Object)
    pods = [f"p-{i:05d}" for i in range(args.pods)]
    await create_pods(harness, ns, pods, NOWHERE)
    results: dict[str, dict[str, Any]] = {n: {"list_s": [], "watch_s": [], "bind_s": [],
                                               "probe": []} for n in names}
    try:
        for rep in range(args.reps):
            for name in names:
                h = await make(name, args.kubeconfig)
                try:
                    await h.list(ns)  # warm the connection
                    dt, n = await timed(lambda h=h: h.list(ns))
                    assert n == args.pods, (name, n)
                    results[name]["list_s"].append(dt)

                    rv = (await harness.list_page(f"/api/v1/namespaces/{ns}/pods", Object,
                                                  {"limit": "1"})).metadata.resource_version
                    await patch_all(harness, ns, pods, f"{name}-{rep}")
                    dt, n = await timed(lambda h=h, rv=rv: h.watch(ns, rv, args.pods))
                    assert n == args.pods, (name, n)
                    results[name]["watch_s"].append(dt)

                    fresh = [f"b-{name[:4]}-{rep}-{i}".replace("_", "") for i in
                             range(args.binds)]
                    await create_pods(harness, ns, fresh, None)
                    for pod in fresh:
                        dt, _ = await timed(lambda h=h, pod=pod: h.bind(ns, pod))
                        results[name]["bind_s"].append(dt)
                    for pod in fresh:
                        await harness.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}",
                                              params={"gracePeriodSeconds": "0"})
                finally:
                    await h.close()
                results[name]["probe"].append(probe(name, args.kubeconfig, ns))
                print(f"rep {rep} {name} done", file=sys.stderr)
    finally:
        await harness.request("DELETE", f"/api/v1/namespaces/{ns}")
        await harness.request("DELETE", f"/api/v1/nodes/{NOWHERE}")
        await harness.close()
    return {"names": names, "skipped": skipped, "results": results}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for dist in ("aiohttp", "msgspec", "kubernetes_asyncio", "lightkube", "lightkube-models",
                 "httpx2", "kubernetes"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def table(report: dict[str, Any], args: argparse.Namespace) -> str:
    med = statistics.median
    rows = [f"| client | LIST {args.pods} pods | watch {args.pods} events | per event | "
            "bind (PATCH + binding) p50 | p99 | import | RSS after import | "
            f"RSS holding {args.pods} pods |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in report["names"]:
        r = report["results"][name]
        binds = sorted(r["bind_s"])
        p99 = binds[min(len(binds) - 1, int(0.99 * len(binds)))]
        probes = r["probe"]
        rows.append(
            f"| `{name}` | {med(r['list_s']) * 1e3:.0f} ms | {med(r['watch_s']) * 1e3:.0f} ms "
            f"| {med(r['watch_s']) / args.pods * 1e6:.0f} µs "
            f"| {med(binds) * 1e3:.1f} ms | {p99 * 1e3:.1f} ms "
            f"| {med(p['import_s'] for p in probes) * 1e3:.0f} ms "
            f"| {med(p['rss_import'] for p in probes) / 2**20:.0f} MiB "
            f"| {med(p['rss_list'] for p in probes) / 2**20:.0f} MiB |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--binds", type=int, default=100)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", type=Path, help="also write the raw figures here")
    args = p.parse_args()
    if not args.kubeconfig:
        p.error("--kubeconfig (or $KUBECONFIG) is needed: the API server to measure against")
    load = os.getloadavg()[0]
    report = asyncio.run(run(args))
    print(f"- Machine: `{platform.platform()}`, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {load:.1f} at the start")
    print(f"- Versions: {', '.join(f'{k} {v}' for k, v in versions().items())}")
    print(f"- Command: `python benchmarks/kube_client.py --kubeconfig DIR/admin.kubeconfig "
          f"--pods {args.pods} --binds "
          f"{args.binds} --reps {args.reps}`; medians of {args.reps} runs")
    if report["skipped"]:
        print(f"- Not installed, skipped: {', '.join(report['skipped'])}")
    print()
    print(table(report, args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
