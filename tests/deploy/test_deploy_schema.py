"""Every manifest against the Kubernetes OpenAPI schemas, offline, in strict mode.

kubernetes-validate ships the upstream schemas; strict mode rejects unknown fields, which is
what catches a misspelt key (without it, `readynessProbe` would pass and do nothing). CRD kinds
(Prometheus Operator, KServe) have no schema there; test_deploy_crds.py checks them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"

# Custom resources (no schema in kubernetes-validate); keep in step with conftest.CRD_KINDS.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("serving.kserve.io/v1beta1", "InferenceService"),
}
KUSTOMIZATIONS = ["common", "base", "overlays/production", "overlays/kserve", "monitoring"]


def validate(data: dict, version: str) -> None:
    kubernetes_validate.validate(data, version, strict=True)


def is_crd(data: dict) -> bool:
    return (data["apiVersion"], data["kind"]) in CRD_KINDS


def test_manifest_validates_strictly(builtin_doc, contract) -> None:
    validate(builtin_doc.data, contract.k8s_version)


@pytest.mark.parametrize(
    "path, good, bad",
    [
        # A misspelt pod-level field, a misspelt container field, a misspelt probe field.
        (
            ("spec", "template", "spec"),
            "terminationGracePeriodSeconds",
            "terminationGracePeriodSecond",
        ),
        (("spec", "template", "spec", "containers", 0), "readinessProbe", "readynessProbe"),
        (
            ("spec", "template", "spec", "containers", 0, "livenessProbe"),
            "periodSeconds",
            "periodSecond",
        ),
    ],
)
def test_misspelt_field_is_rejected(manifests, contract, path, good, bad) -> None:
    """Proof that the validation can fail: strict mode must reject an unknown key."""
    dep = manifests.get("Deployment", "ts-llm-spot")
    node = dep
    for key in path:
        node = node[key]
    node[bad] = node.pop(good)
    with pytest.raises(kubernetes_validate.ValidationError, match=bad):
        validate(dep, contract.k8s_version)


def test_wrong_type_is_rejected(manifests, contract) -> None:
    dep = manifests.get("Deployment", "ts-llm-spot")
    dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep, contract.k8s_version)


def test_native_sidecar_field_needs_a_recent_schema(manifests) -> None:
    """restartPolicy on an init container (native sidecar) only exists since 1.28; the 1.27
    schema must reject it, which shows the version pin matters."""
    dep = manifests.get("Deployment", "ts-llm-spot")
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        validate(dep, "1.27.0")


# ---- kustomization files: what they list exists, and nothing is left out -----------------


def listed_resources(kdir: Path) -> list[Path]:
    kust = yaml.safe_load((kdir / "kustomization.yaml").read_text())
    return [(kdir / r).resolve() for r in kust.get("resources", [])]


@pytest.mark.parametrize("kdir", KUSTOMIZATIONS)
def test_kustomization_lists_existing_resources(kdir: str) -> None:
    for res in listed_resources(K8S / kdir):
        assert res.is_file() or (res / "kustomization.yaml").is_file(), res


def test_every_manifest_file_is_listed_somewhere() -> None:
    listed = {r for k in KUSTOMIZATIONS for r in listed_resources(K8S / k) if r.is_file()}
    on_disk = {
        p.resolve()
        for p in K8S.rglob("*.yaml")
        if p.name not in {"kustomization.yaml", "kustomizeconfig.yaml"}
    }
    assert on_disk - listed == set(), "manifests no kustomization applies"


def test_base_and_common_are_namespace_agnostic(manifests) -> None:
    for doc in manifests.docs:
        if doc.path.is_relative_to(K8S / "base") or doc.path.is_relative_to(K8S / "common"):
            assert "namespace" not in doc.data["metadata"], doc.id


# ---- the rendered output, when kubectl (with its built-in kustomize) is on PATH -------------

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


def render(kdir: str) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S / kdir)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@needs_kubectl
@pytest.mark.parametrize("kdir", KUSTOMIZATIONS)
def test_rendered_kustomization_validates(kdir: str, contract) -> None:
    docs = render(kdir)
    assert docs
    for data in docs:
        if not is_crd(data):
            validate(data, contract.k8s_version)


def configmap_refs(pod: dict) -> set[str]:
    refs = {v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
    for c in pod.get("initContainers", []) + pod["containers"]:
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                refs.add(ref["name"])
    return refs


@needs_kubectl
@pytest.mark.parametrize("kdir", ["base", "overlays/production", "overlays/kserve"])
def test_rendered_pods_reference_generated_configmaps(kdir: str) -> None:
    """Generated ConfigMaps get a hash suffix; every pod reference must follow it, including the
    InferenceService's (kustomizeconfig.yaml teaches kustomize that CRD)."""
    docs = render(kdir)
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    pods += [d["spec"]["predictor"] for d in docs if d["kind"] == "InferenceService"]
    assert pods
    for pod in pods:
        refs = configmap_refs(pod)
        assert refs and refs <= names, (refs, names)


@needs_kubectl
def test_production_overlay_replaces_every_placeholder() -> None:
    docs = render("overlays/production")
    text = yaml.safe_dump_all(docs)
    assert "REPLACE-ME" not in text
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "llm-serving", d["metadata"]["name"]
    images = {
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["initContainers"]
        + d["spec"]["template"]["spec"]["containers"]
    }
    assert len(images) == 1 and next(iter(images)).endswith("/ts-llm-spot:0.1.0"), images


def test_unrendered_base_still_has_placeholders(manifests) -> None:
    """The base must not ship a real-looking bucket or role: both are REPLACE-ME until an overlay
    sets them, so a forgotten overlay fails loudly instead of writing to someone's bucket."""
    sa = manifests.get("ServiceAccount", "ts-llm", under="common")
    assert "REPLACE-ME" in sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    kust = yaml.safe_load((K8S / "common" / "kustomization.yaml").read_text())
    literals = [lit for g in kust["configMapGenerator"] for lit in g.get("literals", [])]
    assert any(lit.startswith("S3_BUCKET=REPLACE-ME") for lit in literals), literals


def test_manifests_hands_out_copies(manifests) -> None:
    # Guard for the tests above that edit manifests: get() must hand out copies.
    a = manifests.get("Deployment", "ts-llm-spot")
    a["spec"]["replicas"] = 99
    assert manifests.get("Deployment", "ts-llm-spot")["spec"]["replicas"] != 99
