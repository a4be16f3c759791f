"""IPAM by delegation: run `<CNI_PATH>/<ipam.type>` as a runtime would, at a version it speaks.

Each interface gets its own IPAM call with its own CNI_IFNAME (host-local and whereabouts key
their leases by container ID and interface). The version sent is the newest the plugin's
`VERSION` lists that is not newer than the network config's; that list is cached per plugin
file (path, size, mtime). ADD, DEL and CHECK are forwarded; GC and STATUS only to plugins that
list 1.1.0 (Debian's reference plugins, 1.1.1, stop at 1.0.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from railyard.cni.spec import CniError, Code, IpamResult, newest_common, parse_ipam_result

EXEC_TIMEOUT_S = 60.0
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Keys only Railyard reads: an IPAM plugin has no use for them.
_OURS = ("prevResult", "interfaces", "standalone", "stateDir", "agentSocket", "ifname")


@dataclass(frozen=True, slots=True)
class IpamCall:
    """The environment of one delegated call (the attachment's, with this interface's name)."""

    container_id: str
    netns: str
    ifname: str
    args: str
    path: tuple[str, ...]


class Ipam:
    """Finds, version-negotiates and runs IPAM plugins; safe to share between threads."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, int, int], tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def find(self, plugin: str, path: tuple[str, ...]) -> str:
        for folder in path:
            exe = os.path.join(folder, plugin)
            if os.path.isfile(exe) and os.access(exe, os.X_OK):
                return exe
        raise CniError(Code.INVALID_CONFIG,
                       f"ipam.type: plugin {plugin!r} not found in CNI_PATH "
                       f"({':'.join(path) or 'empty'})")

    def versions(self, exe: str) -> tuple[str, ...]:
        st = os.stat(exe)
        key = (exe, st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._versions.get(key)
        if cached is not None:
            return cached
        code, out = self._run(exe, "VERSION", {}, {"cniVersion": "1.1.0"})
        try:
            found = tuple(json.loads(out).get("supportedVersions") or ())
        except (ValueError, AttributeError):
            found = ()
        if code != 0 or not found:
            # A plugin that cannot say is assumed to speak the versions before VERSION existed.
            found = ("0.1.0", "0.2.0")
        with self._lock:
            self._versions[key] = found
        return found

    def version_for(self, exe: str, ours: str, floor: str = "0.3.0") -> str | None:
        """The newest version both speak, never below 0.3.0: older results (`ip4`/`ip6`)
        have no `ips` list, and reading one as 0.3 would be an ADD without addresses."""
        return newest_common(ours, self.versions(exe), floor)

    def _run(self, exe: str, command: str, env: Mapping[str, str],
             conf: Mapping[str, Any]) -> tuple[int, bytes]:
        full = {"PATH": _PATH, "CNI_COMMAND": command, **env}
        try:
            p = subprocess.run([exe], input=json.dumps(conf).encode(), env=full,
                               capture_output=True, timeout=EXEC_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise CniError(Code.IPAM_FAILED,
                           f"IPAM plugin {exe} did not answer {command} within "
                           f"{EXEC_TIMEOUT_S:g} s") from None
        except OSError as e:
            raise CniError(Code.IO, f"IPAM plugin {exe}: {e.strerror}") from None
        return p.returncode, p.stdout

    def _conf(self, base: Mapping[str, Any], ipam: Mapping[str, Any], version: str,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        conf = {k: v for k, v in base.items() if k not in _OURS}
        conf["cniVersion"] = version
        conf["ipam"] = dict(ipam)
        if extra:
            conf.update(extra)
        return conf

    def _env(self, call: IpamCall) -> dict[str, str]:
        return {"CNI_CONTAINERID": call.container_id, "CNI_NETNS": call.netns,
                "CNI_IFNAME": call.ifname, "CNI_ARGS": call.args,
                "CNI_PATH": ":".join(call.path)}

    def _fail(self, exe: str, command: str, call: IpamCall, code: int, out: bytes) -> CniError:
        plugin = os.path.basename(exe)
        try:
            err = json.loads(out)
            ecode = int(err.get("code") or Code.IPAM_FAILED)
            msg = str(err.get("msg") or "")
            details = str(err.get("details") or "")
        except (ValueError, AttributeError, TypeError):
            ecode, msg, details = Code.IPAM_FAILED, out.decode(errors="replace").strip(), ""
        return CniError(ecode, f"IPAM {plugin} {command} for {call.ifname}: "
                        f"{msg or f'exit status {code}'}", details)

    def add(self, exe: str, version: str, base: Mapping[str, Any], ipam: Mapping[str, Any],
            call: IpamCall) -> tuple[IpamResult, dict]:
        code, out = self._run(exe, "ADD", self._env(call), self._conf(base, ipam, version))
        if code != 0:
            raise self._fail(exe, "ADD", call, code, out)
        try:
            raw = json.loads(out)
        except ValueError:
            raise CniError(Code.DECODE, f"IPAM {os.path.basename(exe)} ADD for {call.ifname}: "
                           "result is not JSON") from None
        return parse_ipam_result(raw, os.path.basename(exe)), raw

    def delete(self, exe: str, version: str, base: Mapping[str, Any], ipam: Mapping[str, Any],
               call: IpamCall) -> None:
        code, out = self._run(exe, "DEL", self._env(call), self._conf(base, ipam, version))
        if code != 0:
            raise self._fail(exe, "DEL", call, code, out)

    def check(self, exe: str, version: str, base: Mapping[str, Any], ipam: Mapping[str, Any],
              call: IpamCall, prev: Mapping[str, Any] | None) -> None:
        extra = {"prevResult": dict(prev)} if prev else None
        code, out = self._run(exe, "CHECK", self._env(call),
                              self._conf(base, ipam, version, extra))
        if code != 0:
            raise self._fail(exe, "CHECK", call, code, out)

    def gc_or_status(self, exe: str, command: str, base: Mapping[str, Any],
                     ipam: Mapping[str, Any], path: tuple[str, ...],
                     extra: Mapping[str, Any] | None = None) -> bool:
        """Forward GC or STATUS when the plugin speaks 1.1.0; False when it does not."""
        if "1.1.0" not in self.versions(exe):
            return False
        call = IpamCall("", "", "", "", path)
        env = {"CNI_PATH": ":".join(call.path)}
        code, out = self._run(exe, command, env, self._conf(base, ipam, "1.1.0", extra))
        if code != 0:
            raise self._fail(exe, command, call, code, out)
        return True
