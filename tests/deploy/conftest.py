"""Fixtures for the Kubernetes manifest tests: the contract (deploy/contract.yaml) and the
manifests under deploy/k8s, loaded straight from their YAML files (no kustomize needed)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"

# Custom resources: kubernetes-validate has no schema for them (test_deploy_crds.py).
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("serving.kserve.io/v1beta1", "InferenceService"),
}

# Kustomize's own files, not Kubernetes objects.
KUSTOMIZE_FILES = {"kustomization.yaml", "kustomizeconfig.yaml"}


@dataclass(frozen=True)
class Contract:
    """deploy/contract.yaml, typed. Every value a manifest must agree with comes from here."""

    model_name: str
    mar_file: str
    model_store: str
    ts_config_path: str
    ts_ports: dict[str, int]
    ts_bind: dict[str, str]
    ping_path: str
    metrics_path: str
    ts_stop_s: int
    sidecar_console_script: str
    sidecar_module: str
    entrypoint_module: str
    sidecar_port: int
    sidecar_paths: dict[str, str]
    subcommands: tuple[str, ...]
    flags: tuple[str, ...]
    drain_margin_s: int
    stop_method: str
    entrypoint_flags: tuple[str, ...]
    prestop_command: tuple[str, ...]
    cache_volume: str
    cache_dir: str
    inductor_cache_dir: str
    cache_key_file: str
    key_module: str
    key_memory_limit_min: str
    cache_dir_env: str
    drain_flag_file: str
    fleet_key_secret: str
    fleet_public_key: str
    resume_secret: str
    resume_secret_file: str
    resume_env: dict[str, str]
    aws_notice_s: int
    cold_start_budget_s: int
    metric_names: dict[str, str]
    model_label: str
    k8s_version: str
    app_label: str
    app_name: str
    capacity_label: str

    @property
    def drain_deadline_s(self) -> int:
        # The sidecar finishes its drain this long after a notice (notice minus margin).
        return self.aws_notice_s - self.drain_margin_s


def load_contract(path: Path = DEPLOY / "contract.yaml") -> Contract:
    raw = yaml.safe_load(path.read_text())
    ts, sc, metrics, k8s = raw["torchserve"], raw["sidecar"], raw["metrics"], raw["kubernetes"]
    return Contract(
        model_name=ts["model_name"],
        mar_file=ts["mar_file"],
        model_store=ts["model_store"],
        ts_config_path=ts["config_path"],
        ts_ports=dict(ts["ports"]),
        ts_bind=dict(ts["bind"]),
        ping_path=ts["ping_path"],
        metrics_path=ts["metrics_path"],
        ts_stop_s=int(ts["stop_s"]),
        sidecar_console_script=sc["console_script"],
        sidecar_module=sc["module"],
        entrypoint_module=sc["entrypoint_module"],
        sidecar_port=int(sc["port"]),
        sidecar_paths=dict(sc["paths"]),
        subcommands=tuple(sc["subcommands"]),
        flags=tuple(sc["flags"]),
        drain_margin_s=int(sc["drain_margin_s"]),
        stop_method=str(sc["stop_method"]),
        entrypoint_flags=tuple(sc["entrypoint_flags"]),
        prestop_command=tuple(sc["prestop_command"]),
        cache_volume=sc["cache_volume"],
        cache_dir=sc["cache_dir"],
        inductor_cache_dir=sc["inductor_cache_dir"],
        cache_key_file=sc["cache_key_file"],
        key_module=sc["key_module"],
        key_memory_limit_min=str(sc["key_memory_limit_min"]),
        cache_dir_env=sc["cache_dir_env"],
        drain_flag_file=sc["drain_flag_file"],
        fleet_key_secret=sc["fleet_key_secret"],
        fleet_public_key=sc["fleet_public_key"],
        resume_secret=sc["resume_secret"],
        resume_secret_file=sc["resume_secret_file"],
        resume_env=dict(sc["resume_env"]),
        aws_notice_s=int(raw["spot"]["aws_notice_s"]),
        cold_start_budget_s=int(raw["startup"]["cold_start_budget_s"]),
        metric_names={k: v for k, v in metrics.items() if k != "model_label"},
        model_label=metrics["model_label"],
        k8s_version=str(k8s["version"]),
        app_label=k8s["app_label"],
        app_name=k8s["app_name"],
        capacity_label=k8s["capacity_label"],
    )


@dataclass(frozen=True)
class Doc:
    path: Path
    data: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.data["kind"]

    @property
    def name(self) -> str:
        return self.data["metadata"]["name"]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(K8S)}:{self.kind}/{self.name}"


class Manifests:
    """Every Kubernetes object in deploy/k8s, with lookups by kind and name."""

    def __init__(self, docs: list[Doc]):
        self.docs = docs

    def of_kind(self, kind: str, under: str | None = None) -> list[Doc]:
        return [
            d
            for d in self.docs
            if d.kind == kind and (under is None or d.path.is_relative_to(K8S / under))
        ]

    def get(self, kind: str, name: str, under: str = "base") -> dict[str, Any]:
        found = [d for d in self.of_kind(kind, under) if d.name == name]
        assert len(found) == 1, (kind, name, under, [d.id for d in found])
        # A copy, so that a test that edits it (misspelling a field) cannot leak into others.
        return copy.deepcopy(found[0].data)


def load_docs(root: Path = K8S) -> list[Doc]:
    docs = []
    for path in sorted(root.rglob("*.yaml")):
        if path.name in KUSTOMIZE_FILES:
            continue
        for data in yaml.safe_load_all(path.read_text()):
            if data:
                docs.append(Doc(path, data))
    return docs


def is_crd(data: dict[str, Any]) -> bool:
    return (data["apiVersion"], data["kind"]) in CRD_KINDS


def pod_spec_of(manifests: Manifests, source: str) -> dict[str, Any]:
    """The pod spec of a Deployment in base, or of the KServe InferenceService's predictor."""
    kind, name = source.split("/")
    if kind == "InferenceService":
        return manifests.get(kind, name, under="overlays/kserve")["spec"]["predictor"]
    return manifests.get(kind, name)["spec"]["template"]["spec"]


def containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in containers(pod) if c["name"] == name]
    assert len(found) == 1, (name, [c["name"] for c in containers(pod)])
    return found[0]


def serving_container(pod: dict[str, Any]) -> dict[str, Any]:
    # "torchserve" in the Deployments; KServe insists on "kserve-container".
    assert len(pod["containers"]) == 1, [c["name"] for c in pod["containers"]]
    return pod["containers"][0]


# The three pod specs that run a replica; most contract checks apply to each.
POD_SOURCES = [
    "Deployment/ts-llm-spot",
    "Deployment/ts-llm-ondemand",
    "InferenceService/ts-llm",
]


@pytest.fixture(scope="session")
def contract() -> Contract:
    return load_contract()


@pytest.fixture(scope="session")
def manifests() -> Manifests:
    return Manifests(load_docs())


@pytest.fixture(scope="session")
def helpers():
    """Small lookups shared by the test modules (fixtures, since tests/ is not a package)."""

    class Helpers:
        pod_spec_of = staticmethod(pod_spec_of)
        containers = staticmethod(containers)
        container = staticmethod(container)
        serving_container = staticmethod(serving_container)
        load_docs = staticmethod(load_docs)
        load_contract = staticmethod(load_contract)

    return Helpers


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Parametrize at collection time, so each pod spec and each manifest is its own test id.
    if "pod_source" in metafunc.fixturenames:
        metafunc.parametrize("pod_source", POD_SOURCES)
    for name, want_crd in [("builtin_doc", False), ("crd_doc", True)]:
        if name in metafunc.fixturenames:
            docs = [d for d in load_docs() if is_crd(d.data) == want_crd]
            metafunc.parametrize(name, docs, ids=[d.id for d in docs])


@pytest.fixture
def pod(manifests: Manifests, pod_source: str) -> dict[str, Any]:
    return pod_spec_of(manifests, pod_source)
