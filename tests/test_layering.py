"""The import graph of src/railyard against the layer order in docs/architecture.md.

Every import counts: top-level, inside functions, `if TYPE_CHECKING:` blocks, relative ones.
A package may import its own modules and anything in a lower layer; between adapters only
the edges declared in ALLOWED (each with its reason in docs/architecture.md); `agent` only
from `cli`; and no cycle between packages at all.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import railyard

SRC = Path(railyard.__file__).resolve().parent

# Lowest first; a package may import from its own layer's packages only where ALLOWED says.
LAYERS: list[set[str]] = [
    {"topology"},
    {"allocation", "records", "discovery"},
    {"node"},
    {"kube", "scheduler", "kubelet", "cni", "sim"},
    {"agent"},
    {"cli"},
    {"__main__"},  # `python -m railyard`: the command, as `railyard` is
]
# Edges within one layer, and the reason each is there (docs/architecture.md says more).
ALLOWED = {
    ("records", "allocation"): "the codec encodes the allocator's value types",
    ("sim", "scheduler"): "the simulator runs the extender's own ClusterState",
    ("cni", "kubelet"): "the CNI confirms grants through kubelet's PodResources client",
    ("scheduler", "kube"): "the extender watches NodeTopologies and pods and binds on the API",
    ("kubelet", "kube"): "in cluster mode: the node's pods, its decisions written back",
}
# Within an allowed adapter edge, the modules that may be imported (None: any).
ALLOWED_MODULES = {
    ("cni", "kubelet"): {"railyard.kubelet.api", "railyard.kubelet.api.podresources_pb2",
                         "railyard.kubelet.api.podresources_pb2_grpc",
                         "railyard.kubelet.podresources"},
    ("sim", "scheduler"): {"railyard.scheduler.state"},
    ("kubelet", "kube"): {"railyard.kube.client", "railyard.kube.objects",
                          "railyard.kube.reflector"},
}


def package_of(module: str) -> str | None:
    """`railyard.cni.plugin` → `cni`; `railyard` itself → None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "railyard" else None


def layer_of(package: str) -> int:
    for i, names in enumerate(LAYERS):
        if package in names:
            return i
    raise AssertionError(f"package railyard.{package} is in no layer of tests/test_layering.py "
                         "(and docs/architecture.md): give it one")


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every railyard module `path` imports, wherever the import statement stands."""
    me = module_name(path)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            # `from railyard.kubelet import podresources` imports a module, too.
            out.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in out if m == "railyard" or m.startswith("railyard.")}


def edges() -> list[tuple[str, str, str, str]]:
    """(importing package, imported package, importing module, imported module)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        me = module_name(path)
        src = package_of(me)
        for target in sorted(imports_of(path)):
            dst = package_of(target)
            if src is None or dst is None or src == dst:
                continue
            out.append((src, dst, me, target))
    return out


def known_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (SRC / rel).with_suffix(".py").exists() or (SRC / rel / "__init__.py").exists()


def test_every_import_points_down_the_layer_order():
    wrong = []
    for src, dst, me, target in edges():
        if layer_of(dst) < layer_of(src):
            continue
        if (src, dst) in ALLOWED:
            allowed = ALLOWED_MODULES.get((src, dst))
            if allowed is None or target in allowed or not known_module(target):
                continue
        wrong.append(f"{me} imports {target} ({src} → {dst})")
    assert not wrong, "imports against docs/architecture.md's layer order:\n" + "\n".join(wrong)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in edges():
        graph.setdefault(src, set()).add(dst)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(p for p in graph if p in reach(p))
    assert not cycles, f"packages on an import cycle: {', '.join(cycles)}"


def test_only_the_cli_imports_the_agent():
    users = sorted({me for src, dst, me, _ in edges() if dst == "agent" and src != "cli"})
    assert not users, f"the agent is wiring, imported by cli/ alone; also by: {users}"


def test_the_import_reader_sees_relative_and_function_level_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "railyard" / "cni"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import spec\n")
    (pkg / "x.py").write_text(
        "def f():\n    from ..agent import agent\n    from .spec import Code\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "railyard")
    assert imports_of(pkg / "__init__.py") >= {"railyard.cni.spec"}
    assert imports_of(pkg / "x.py") >= {"railyard.agent", "railyard.agent.agent",
                                        "railyard.cni.spec", "railyard.cni.spec.Code"}


def test_no_module_outside_the_simulator_imports_the_sim_extra():
    """An agent or extender install has no numpy, scipy or matplotlib (decision 0079): every
    module but `railyard.sim.*` must import without them."""
    from railyard.cli.simulate import SIM_EXTRA
    from support.without import run_without

    modules = sorted(
        module_name(p) for p in SRC.rglob("*.py")
        if all((d / "__init__.py").exists() for d in p.parents if d.is_relative_to(SRC))
        and not module_name(p).startswith("railyard.sim")
    )
    assert "railyard.cli.main" in modules and "railyard.scheduler.state" in modules
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    importlib.import_module(m)\n"
            "print(len(sys.argv) - 1)\n")
    r = run_without(SIM_EXTRA, code, modules)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(len(modules))
    # The blocker really blocks: the simulator's report cannot import under it.
    r = run_without(SIM_EXTRA, "import railyard.sim.report")
    assert r.returncode == 1 and "ModuleNotFoundError" in r.stderr


def test_the_sim_extra_is_what_the_simulator_treats_as_missing():
    import tomllib

    from railyard.cli.simulate import SIM_EXTRA

    with (SRC.parents[1] / "pyproject.toml").open("rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["sim"]
    names = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in extra}
    assert names == SIM_EXTRA
