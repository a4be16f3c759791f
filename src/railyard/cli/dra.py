"""`railyard dra claim-template`: the ResourceClaimTemplate of N GPU↔NIC pairs, printed for
`kubectl apply -f -` (records.dra_claims builds it; decision 0112). Imports stay inside."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from railyard.cli.app import app, fail

dra_app = typer.Typer(help="Railyard as a DRA driver: what a cluster in DRA mode applies.",
                      no_args_is_help=True)
app.add_typer(dra_app, name="dra")


class Level(StrEnum):
    switch = "switch"
    root = "root"
    numa = "numa"


class Gpus(StrEnum):
    railyard = "railyard"
    nvidia = "nvidia"


class Nics(StrEnum):
    vf = "vf"
    pf = "pf"


class PfSpread(StrEnum):
    required = "required"
    preferred = "preferred"
    none = "none"


class Output(StrEnum):
    yaml = "yaml"
    json = "json"


@dra_app.command("claim-template", epilog=(
    "Example: railyard dra claim-template --pairs 2 --name train-pairs | kubectl apply -n ml "
    "-f -   and in the pod: resourceClaims: [{name: pairs, resourceClaimTemplateName: "
    "train-pairs}] with resources.claims: [{name: pairs}] in its container."))
def claim_template(
    pairs: Annotated[int, typer.Option(
        "--pairs", metavar="N", help="GPU↔NIC pairs; GPU k is paired with NIC k.")],
    name: Annotated[str, typer.Option(
        "--name", metavar="NAME", help="The template's name (a DNS subdomain).")],
    level: Annotated[Level, typer.Option(
        "--level", help="The loosest closeness a pair may fall back to, tried tightest "
                        "first: switch (one PCIe switch, Railyard's GPUs only), root (one "
                        "root complex), numa (one NUMA node).")] = Level.numa,
    gpus: Annotated[Gpus, typer.Option(
        "--gpus", help="Who publishes the GPUs: railyard (DeviceClass railyard-gpu) or "
                       "nvidia (NVIDIA's GPU DRA driver, DeviceClass gpu.nvidia.com: "
                       "pairs start at the root complex).")] = Gpus.railyard,
    nics: Annotated[Nics, typer.Option(
        "--nics", help="SR-IOV VFs or whole PFs.")] = Nics.vf,
    pf_spread: Annotated[PfSpread, typer.Option(
        "--pf-spread", help="VFs on distinct PFs: required, preferred (where the node has "
                            "them at the pair's closeness, else a shared PF) or none.")
    ] = PfSpread.preferred,
    namespace: Annotated[str | None, typer.Option(
        "--namespace", "-n", metavar="NS", help="Set metadata.namespace.")] = None,
    output: Annotated[Output, typer.Option(
        "--output", "-o", help="yaml or json.")] = Output.yaml,
) -> None:
    """Print a ResourceClaimTemplate of N GPU↔NIC pairs, each as close as the node allows."""
    from railyard.records.dra_claims import PairRequest, TemplateError
    from railyard.records.dra_claims import claim_template as build

    try:
        doc = build(PairRequest(name, pairs, level.value, gpus.value, nics.value,
                                pf_spread.value, namespace))
    except TemplateError as e:
        fail(str(e))
    _print(doc, output)


def _print(doc: object, output: Output) -> None:
    if output is Output.json:
        import json

        print(json.dumps(doc, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False), end="")


@dra_app.command("device-classes")
def device_classes(
    output: Annotated[Output, typer.Option(
        "--output", "-o", help="yaml or json.")] = Output.yaml,
) -> None:
    """Print the DeviceClasses railyard-gpu, railyard-vf and railyard-pf the claim templates
    name (the chart installs them; `| kubectl apply -f -` without it)."""
    from railyard.records.dra_slices import device_classes as build

    _print({"apiVersion": "v1", "kind": "List", "items": build()}, output)
