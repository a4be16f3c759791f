"""The `railyard-cni` executable: forwards one CNI call (env + stdin) to the warm CNI service.

A runtime starts a CNI plugin for every call, so this file imports almost nothing (os, sys,
_socket; json only off the fast path) and starts with `python3 -IS` when installed by
`railyard cni install`: the service, already warm, does the work (Multus "thick" mode's pattern).
It must stay stdlib-only: an installed copy may run under the host's python3, outside any
virtual environment. See docs/cni.md, "How the shim finds its interpreter".

Wire (one call per connection, all lengths 4-byte big-endian):
  request  = b"RYCNI1" + len(env) + env + len(stdin) + stdin,
             env = b"KEY=VALUE\\0…" holding only the CNI_* variables;
  reply    = exit code + len(stdout) + stdout + len(stderr) + stderr.
"""

# The C core of `socket`: the `socket` module itself imports enum and selectors, which doubled
# the shim's start-up on the loaded development VM (28 ms against 2 ms; -X importtime).
import _socket
import os
import sys
import time

MAGIC = b"RYCNI1"
DEFAULT_SOCKET = "/run/railyard/cni.sock"  # = railyard.node.paths.CNI_SOCKET (stdlib only here)
SUPPORTED_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
CONNECT_TIMEOUT_S = 2.0
# ADD of eight VFs with IPAM takes well under a second; a hung service must not hang the runtime.
CALL_TIMEOUT_S = 120.0
CODE_DECODE, CODE_TRY_AGAIN = 6, 11
_MAX_FRAME = 16 << 20
NOT_AN_OBJECT = "network config on stdin is not a JSON object"
NESTED_TOO_DEEPLY = "network config on stdin is nested too deeply to read"


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def encode_request(env: dict, stdin: bytes) -> bytes:
    """The request frame: only CNI_* variables travel (the service takes nothing else from env)."""
    blob = b"".join(
        f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0"
        for k, v in sorted(env.items()) if k.startswith("CNI_")
    )
    return MAGIC + _u32(len(blob)) + blob + _u32(len(stdin)) + stdin


def decode_env(blob: bytes) -> "dict[str, str]":  # quoted: the shim runs on python3 >= 3.8
    env = {}
    for item in blob.split(b"\0"):
        if item:
            k, _, v = item.partition(b"=")
            env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
    return env


def recv_exact(sock: _socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_blob(sock: _socket.socket) -> bytes:
    n = int.from_bytes(recv_exact(sock, 4), "big")
    if n > _MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes is larger than {_MAX_FRAME}")
    return recv_exact(sock, n)


def encode_reply(code: int, stdout: bytes, stderr: bytes) -> bytes:
    return _u32(code) + _u32(len(stdout)) + stdout + _u32(len(stderr)) + stderr


def error_json(code: int, msg: str, details: str = "", version: str = LATEST_VERSION) -> bytes:
    import json  # off the fast path: only errors pay for it

    return json.dumps({"cniVersion": version, "code": code, "msg": msg,
                       "details": details}).encode() + b"\n"


class _JsonContext:
    """What `_json.make_scanner` reads from json.JSONDecoder, and nothing else."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"{name} is not JSON")


def loads(data: bytes) -> object:
    """json.loads through the C scanner alone: importing `json` costs another 10 ms per call
    (it pulls in `re`), and configs naming `agentSocket` are parsed on every call."""
    try:
        import _json

        # The C scanner reads only the attributes _JsonContext has; typeshed asks for a
        # whole JSONDecoder.
        scan = _json.make_scanner(_JsonContext)  # type: ignore[arg-type]
    except (ImportError, AttributeError):
        import json

        return json.loads(data)
    text = data.decode("utf-8").strip(" \t\n\r")
    try:
        value, end = scan(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def _config(stdin: bytes) -> "dict[str, object] | str":  # quoted: python3 >= 3.8
    """The network config, parsed only when a key the shim acts on may be in it; or why it
    cannot be read (the message of a code 6 answer)."""
    if stdin.lstrip()[:1] == b"{" and b"agentSocket" not in stdin \
            and b"standalone" not in stdin:
        return {}
    try:
        conf = loads(stdin)
    except ValueError:  # UnicodeDecodeError is one
        return NOT_AN_OBJECT
    except RecursionError:  # "[[[[…" deeper than the parser's stack: never a traceback
        return NESTED_TOO_DEEPLY
    return conf if isinstance(conf, dict) else NOT_AN_OBJECT


def _connect(sock: _socket.socket, path: str) -> None:
    """A connect with a timeout is non-blocking, and on a unix socket whose accept queue is
    full it fails at once (EAGAIN): the service is busy, not gone, so try again a while."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.002)


def call_service(path: str, env: dict, stdin: bytes) -> "tuple[int, bytes, bytes]":
    """One round trip; raises OSError/ConnectionError when the service cannot be reached."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        _connect(sock, path)
        sock.settimeout(CALL_TIMEOUT_S)
        sock.sendall(encode_request(env, stdin))
        code = int.from_bytes(recv_exact(sock, 4), "big")
        return code, recv_blob(sock), recv_blob(sock)
    finally:
        sock.close()


def _standalone(env: dict, stdin: bytes) -> "tuple[int, bytes, bytes]":
    # Installed with -S for speed: site-packages (where railyard lives) load only here.
    if "site" not in sys.modules:
        import site

        site.main()
    from railyard.cni.standalone import run

    return run(env, stdin)


def main() -> None:
    # A runtime runs a CNI plugin with no arguments (the call is in CNI_* variables and
    # stdin); arguments mean a person at a shell, who gets help instead of a CNI error.
    if len(sys.argv) > 1:
        sys.exit(_command_line(sys.argv[1:]))
    if "CNI_COMMAND" not in os.environ and os.isatty(0):
        sys.stderr.write(f"{_PROG}: a CNI plugin, run by the container runtime with CNI_COMMAND "
                         f"set and the network config on stdin (see {_PROG} --help)\n")
        sys.exit(2)
    stdin = sys.stdin.buffer.read()
    env = dict(os.environ)
    conf = _config(stdin)
    if env.get("CNI_COMMAND") == "VERSION":
        # VERSION needs no agent: answered here, so a runtime can probe a node early.
        code, out, err = 0, _version_reply(stdin), b""
    elif isinstance(conf, str):
        out = error_json(CODE_DECODE, conf)
        code, err = 1, b""
    elif conf.get("standalone") is True:
        code, out, err = _standalone(env, stdin)
    else:
        path = conf.get("agentSocket") or DEFAULT_SOCKET
        if not isinstance(path, str):
            path = DEFAULT_SOCKET
        try:
            code, out, err = call_service(path, env, stdin)
        except (OSError, ConnectionError) as e:
            code, err = 1, b""
            out = error_json(CODE_TRY_AGAIN, "railyard CNI service unreachable", f"{path}: {e}",
                             _asked_version(stdin))
    if err:
        sys.stderr.buffer.write(err)
        sys.stderr.flush()
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    sys.exit(code)


def _asked_version(stdin: bytes) -> str:
    """The config's cniVersion when this plugin speaks it, else the latest (for replies)."""
    try:
        conf = loads(stdin)
    except (ValueError, RecursionError):
        conf = None
    asked = conf.get("cniVersion") if isinstance(conf, dict) else None
    return asked if asked in SUPPORTED_VERSIONS else LATEST_VERSION


def _version_reply(stdin: bytes) -> bytes:
    versions = ", ".join(f'"{v}"' for v in SUPPORTED_VERSIONS)
    return (f'{{"cniVersion": "{_asked_version(stdin)}", "supportedVersions": [{versions}]}}\n'
            .encode())


_PROG = "railyard-cni"

HELP = f"""\
usage: {_PROG} [--help | --version]

Railyard's CNI plugin (CNI {", ".join(SUPPORTED_VERSIONS)}): moves exactly the RDMA NICs
(SR-IOV VFs or whole PFs) kubelet gave a pod into the pod's network namespace, named in GPU
pair order, and runs the configured IPAM plugin for each. A container runtime (containerd,
CRI-O, Multus) runs it with no arguments; this executable is a thin, stdlib-only shim that
forwards the call to the Railyard agent's CNI service, or does the work itself when the
network config says "standalone": true.

The call, as the CNI specification defines it:
  CNI_COMMAND      ADD, DEL, CHECK, STATUS, GC or VERSION (VERSION is answered here)
  CNI_CONTAINERID  the container's ID
  CNI_NETNS        the pod's network namespace (a path)
  CNI_IFNAME       name of the first pair's interface; pair i gets <name>-<i>
  CNI_ARGS         K8S_POD_UID, or K8S_POD_NAMESPACE and K8S_POD_NAME: whose NICs to move
  CNI_PATH         where the IPAM plugins named by the config's "ipam" are found
  stdin            the network config (JSON); "agentSocket" names the service's socket
                   (default {DEFAULT_SOCKET})

Standalone mode also reads RAILYARD_CNI_STATE_DIR (default /var/lib/railyard),
RAILYARD_CNI_NODE_NAME, RAILYARD_CNI_SYSFS_ROOT, RAILYARD_CNI_HOST_NETNS,
RAILYARD_CNI_DEVINFO_DIR and RAILYARD_CNI_POD_RESOURCES.

Result or error JSON on stdout; exit 0 on success, 1 on a CNI error (its code in the JSON).
Install: railyard cni install --bin-dir /opt/cni/bin. Docs: docs/cni.md in the Railyard
source (network config keys, error codes, agent and standalone modes).
"""


def _command_line(args: "list[str]") -> int:  # quoted: the shim runs on python3 >= 3.8
    if args in (["--help"], ["-h"]):
        sys.stdout.write(HELP)
        return 0
    if args == ["--version"]:
        sys.stdout.write(f"{_PROG} {_package_version()} "
                         f"(CNI {', '.join(SUPPORTED_VERSIONS)})\n")
        return 0
    sys.stderr.write(f"{_PROG}: error: unexpected arguments {' '.join(args)!r}: a runtime "
                     f"calls this plugin with none (see {_PROG} --help)\n")
    return 2


def _package_version() -> str:
    """Railyard's version as pip recorded it; the installed copy runs with -S (no
    site-packages), so load them first, as standalone mode does."""
    if "site" not in sys.modules:
        import site

        site.main()
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("railyard")
    except PackageNotFoundError:  # agent mode's host python3 need not have railyard
        return f"(version unknown: railyard is not installed for {sys.executable})"


if __name__ == "__main__":
    main()
