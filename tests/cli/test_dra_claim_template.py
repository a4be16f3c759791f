"""`railyard dra claim-template` as a person runs it: the builder's document, in YAML or JSON,
and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from railyard.records.dra_claims import PairRequest, claim_template

SRC = Path(__file__).resolve().parents[2] / "src"


def railyard(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "railyard.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_printed_yaml_is_the_builders_template():
    r = railyard("dra", "claim-template", "--pairs", "2", "--name", "train", "-n", "ml",
                 "--level", "root", "--nics", "pf")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout) == claim_template(
        PairRequest("train", 2, level="root", nics="pf", namespace="ml"))


def test_json_output_and_nvidia_gpus():
    r = railyard("dra", "claim-template", "--pairs", "3", "--name", "t", "--gpus", "nvidia",
                 "--output", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == claim_template(PairRequest("t", 3, gpus="nvidia"))


def test_a_refused_request_is_one_line_naming_the_limit_and_exit_2():
    r = railyard("dra", "claim-template", "--pairs", "11", "--name", "t")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "railyard: error: --pairs 11: between 1 and 10 with these options (2 requests and 3 "
        "constraint(s) a pair, one more for the PF spread, within the API's 32 requests and "
        "32 constraints a claim)"]


def test_help_shows_an_example():
    r = railyard("dra", "claim-template", "--help")
    assert r.returncode == 0
    assert "railyard dra claim-template --pairs 2 --name" in " ".join(r.stdout.split())


def test_device_classes_prints_the_three_classes_the_templates_name():
    r = railyard("dra", "device-classes")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert doc["kind"] == "List"
    assert [c["metadata"]["name"] for c in doc["items"]] == [
        "railyard-gpu", "railyard-vf", "railyard-pf"]
    classes = {r["exactly"]["deviceClassName"] for r in claim_template(
        PairRequest("t", 1, level="switch"))["spec"]["spec"]["devices"]["requests"]}
    assert classes <= {c["metadata"]["name"] for c in doc["items"]}
