"""deploy/grafana/railyard.json queries only metrics the code registers, and shows them all:
the names cannot drift apart (docs/observability.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from railyard.cni.metrics import CniMetrics
from railyard.kubelet.metrics import AgentMetrics
from railyard.scheduler.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "railyard.json"
NAME = re.compile(r"\brailyard_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("_sum", "_count", "")}


def _queries(doc: Any) -> Iterator[str]:
    """Every PromQL text of the dashboard: panels' `expr`, variables' `query`/`definition`."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _queries(item)


def _registered() -> dict[str, str]:
    """Each exposed series name → the metric family it belongs to, over every component."""
    agent = AgentMetrics("n")
    agent.devices(lambda: None)
    registries: list[CollectorRegistry] = [Metrics().registry, agent.registry,
                                           CniMetrics("n").registry]
    names = {}
    for registry in registries:
        for family in registry.collect():
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = family.name
    return names


def test_every_metric_the_dashboard_queries_is_registered_by_the_code():
    doc = json.loads(DASHBOARD.read_text())
    queried = {m for q in _queries(doc) for m in NAME.findall(q)}
    registered = _registered()
    assert queried, "the dashboard queries nothing"
    assert not queried - registered.keys(), sorted(queried - registered.keys())


def test_every_metric_the_code_registers_is_on_the_dashboard():
    doc = json.loads(DASHBOARD.read_text())
    queried = {m for q in _queries(doc) for m in NAME.findall(q)}
    registered = _registered()
    shown = {registered[m] for m in queried if m in registered}
    assert shown == set(registered.values()), sorted(set(registered.values()) - shown)


def test_the_dashboard_is_importable_json_with_unique_panel_ids():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "railyard" and doc["title"] == "Railyard"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
