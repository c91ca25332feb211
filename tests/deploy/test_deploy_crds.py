"""Structural checks for the CRD kinds that kubernetes-validate has no schema for.

ServiceMonitor and PodMonitor (Prometheus Operator, monitoring.coreos.com/v1) are checked
against small hand-written JSON schemas: the fields we use are typed, every other field of the
CRD is allowed by name, and anything else (a misspelling) is rejected, like strict mode.

The InferenceService (KServe, serving.kserve.io/v1beta1) predictor is a Kubernetes PodSpec with
a few KServe fields inline: the KServe fields are checked here, and the rest is validated as a
real Pod against the Kubernetes schema.
"""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest

# Prometheus duration, as the operator's CRD pattern spells it.
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": STRING_MAP, "matchExpressions": {"type": "array"}},
    "additionalProperties": False,
}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    "additionalProperties": False,
}


def allow(*names: str) -> dict:
    # Fields of the CRD that these manifests do not use: allowed, untyped.
    return {n: {} for n in names}


SCRAPE_ENDPOINT_COMMON = {
    "path": {"type": "string", "pattern": "^/"},
    "interval": {"type": "string", "pattern": DURATION},
    "scrapeTimeout": {"type": "string", "pattern": DURATION},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    **allow(
        "params",
        "honorLabels",
        "honorTimestamps",
        "trackTimestampsStaleness",
        "relabelings",
        "metricRelabelings",
        "tlsConfig",
        "bearerTokenSecret",
        "authorization",
        "basicAuth",
        "oauth2",
        "followRedirects",
        "enableHttp2",
        "filterRunning",
        "proxyUrl",
        "noProxy",
        "proxyFromEnvironment",
        "proxyConnectHeader",
    ),
}
MONITOR_SPEC_COMMON = {
    "selector": LABEL_SELECTOR,
    **allow(
        "namespaceSelector",
        "jobLabel",
        "podTargetLabels",
        "sampleLimit",
        "targetLimit",
        "labelLimit",
        "labelNameLengthLimit",
        "labelValueLengthLimit",
        "keepDroppedTargets",
        "attachMetadata",
        "scrapeProtocols",
        "fallbackScrapeProtocol",
        "bodySizeLimit",
        "scrapeClass",
        "selectorMechanism",
        "nativeHistogramBucketLimit",
        "nativeHistogramMinBucketFactor",
        "scrapeClassicHistograms",
        "convertClassicHistogramsToNHCB",
    ),
}


def monitor_schema(kind: str, endpoints_key: str, endpoint_props: dict, extra_spec: dict) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", endpoints_key],
                "properties": {
                    **MONITOR_SPEC_COMMON,
                    **extra_spec,
                    endpoints_key: {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {**SCRAPE_ENDPOINT_COMMON, **endpoint_props},
                            "additionalProperties": False,
                        },
                    },
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    }


SERVICE_MONITOR = monitor_schema(
    "ServiceMonitor",
    "endpoints",
    {"port": {"type": "string"}, **allow("targetPort", "bearerTokenFile")},
    allow("targetLabels", "serviceDiscoveryRole"),
)
POD_MONITOR = monitor_schema(
    "PodMonitor",
    "podMetricsEndpoints",
    {"port": {"type": "string"}, "portNumber": {"type": "integer"}, **allow("targetPort")},
    {},
)

# PredictorSpec fields that are KServe's own; everything else in the predictor is PodSpec.
KSERVE_PREDICTOR_FIELDS = {
    "minReplicas": {"type": "integer", "minimum": 0},
    "maxReplicas": {"type": "integer", "minimum": 1},
    **allow(
        "scaleTarget",
        "scaleMetric",
        "scaleMetricType",
        "containerConcurrency",
        "timeout",
        "canaryTrafficPercent",
        "logger",
        "batcher",
        "labels",
        "annotations",
        "deploymentStrategy",
        "autoScaling",
        "model",
        "workerSpec",
    ),
}
KSERVE_ANNOTATIONS = {
    "serving.kserve.io/deploymentMode": {"RawDeployment", "Standard", "Serverless"},
    "serving.kserve.io/autoscalerClass": {"hpa", "external", "none", "keda"},
}


def check_monitor(data: dict) -> None:
    schema = {"ServiceMonitor": SERVICE_MONITOR, "PodMonitor": POD_MONITOR}[data["kind"]]
    jsonschema.validate(data, schema)


def check_inference_service(data: dict, k8s_version: str) -> None:
    assert data["apiVersion"] == "serving.kserve.io/v1beta1", data["apiVersion"]
    jsonschema.validate(data["metadata"], METADATA)
    for key, value in data["metadata"].get("annotations", {}).items():
        if key in KSERVE_ANNOTATIONS:
            assert value in KSERVE_ANNOTATIONS[key], (key, value)
    assert set(data["spec"]) == {"predictor"}, set(data["spec"])
    predictor = data["spec"]["predictor"]
    kserve = {k: v for k, v in predictor.items() if k in KSERVE_PREDICTOR_FIELDS}
    jsonschema.validate(
        kserve,
        {"type": "object", "properties": KSERVE_PREDICTOR_FIELDS, "additionalProperties": False},
    )
    assert kserve["minReplicas"] <= kserve["maxReplicas"], kserve
    pod_spec = {k: v for k, v in predictor.items() if k not in KSERVE_PREDICTOR_FIELDS}
    assert [c["name"] for c in pod_spec["containers"]] == ["kserve-container"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": data["metadata"]["name"]},
        "spec": pod_spec,
    }
    kubernetes_validate.validate(pod, k8s_version, strict=True)


def check_crd(data: dict, k8s_version: str) -> None:
    if data["kind"] == "InferenceService":
        check_inference_service(data, k8s_version)
    else:
        check_monitor(data)


def test_crd_manifest_is_structurally_valid(crd_doc, contract) -> None:
    check_crd(crd_doc.data, contract.k8s_version)


def test_every_crd_kind_is_present(manifests) -> None:
    assert {d.kind for d in manifests.docs} >= {"ServiceMonitor", "PodMonitor", "InferenceService"}


def mutate(data: dict, path: tuple, good: str, bad: str) -> dict:
    data = copy.deepcopy(data)
    node = data
    for key in path:
        node = node[key]
    node[bad] = node.pop(good)
    return data


def test_misspelt_servicemonitor_field_is_rejected(manifests, contract) -> None:
    sm = manifests.get("ServiceMonitor", "ts-llm")
    bad = mutate(sm, ("spec", "endpoints", 0), "interval", "intervall")
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        check_crd(bad, contract.k8s_version)


def test_bad_scrape_interval_is_rejected(manifests, contract) -> None:
    sm = manifests.get("ServiceMonitor", "ts-llm")
    sm["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        check_crd(sm, contract.k8s_version)


def test_misspelt_podmonitor_field_is_rejected(manifests, contract) -> None:
    pm = manifests.get("PodMonitor", "ts-llm", under="overlays/kserve")
    bad = mutate(pm, ("spec",), "podMetricsEndpoints", "podMetricEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        check_crd(bad, contract.k8s_version)


def test_misspelt_predictor_pod_field_is_rejected(manifests, contract) -> None:
    isvc = manifests.get("InferenceService", "ts-llm", under="overlays/kserve")
    bad = mutate(
        isvc, ("spec", "predictor"), "terminationGracePeriodSeconds", "terminationGracePeriod"
    )
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriod"):
        check_crd(bad, contract.k8s_version)


def test_wrong_kserve_container_name_is_rejected(manifests, contract) -> None:
    isvc = manifests.get("InferenceService", "ts-llm", under="overlays/kserve")
    isvc["spec"]["predictor"]["containers"][0]["name"] = "torchserve"
    with pytest.raises(AssertionError):
        check_crd(isvc, contract.k8s_version)
