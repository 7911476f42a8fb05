"""The Kubernetes manifests for the Gateway API Inference Extension and autoscaling, checked
against the schemas that an API server would check them with.

The custom resources (InferencePool, InferenceObjective, HTTPRoute) are validated with
jsonschema against the openAPIV3Schema of the CRDs vendored in docker/k8s/crds/ (the
upstream files; their README says from which commit). The built-in kinds (the picker's
Deployment, Service, RBAC and ConfigMap, the HPA) go through kubernetes-validate, as
docker/k8s/'s other manifests do. A broken copy of each kind is rejected too, so that
the checks are shown to bite. Then the manifests must agree with one another: the pool
selects the pagode pods on their port, names the picker's Service, the route and the
objective name the pool, the picker reads the vLLM-named series, and the HPA scales the
Deployment on the series the adapter rule serves.

The CRDs' CEL rules (x-kubernetes-validations) are not evaluated here: only an API server
does that. Nothing here was applied to a cluster (docs/deploy.md).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_deploy_config import K8S, container_args, kubernetes_validate, load_yaml_docs, run_tool

CRDS = K8S / "crds"
GATEWAY = K8S / "gateway"
CUSTOM_MANIFESTS = ("inferencepool.yaml", "inferenceobjective.yaml", "httproute.yaml")
VLLM_METRIC_FLAGS = {
    "--total-queued-requests-metric": "vllm:num_requests_waiting",
    "--total-running-requests-metric": "vllm:num_requests_running",
    "--kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "--lora-info-metric": "vllm:lora_requests_info",
    "--cache-info-metric": "vllm:cache_config_info",
}


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the openAPIV3Schema of every served version of the vendored CRDs."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = load_yaml_docs(path)[0]
        assert crd["kind"] == "CustomResourceDefinition", path
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def validation_errors(resource: dict[str, Any]) -> list[str]:
    schema = crd_schemas().get((resource["apiVersion"], resource["kind"]))
    assert schema is not None, f"no vendored CRD serves {resource['apiVersion']} {resource['kind']}"
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(resource)]


def gateway_doc(name: str, kind: str) -> dict[str, Any]:
    docs = [d for d in load_yaml_docs(GATEWAY / name) if d["kind"] == kind]
    assert len(docs) == 1, f"{name}: {len(docs)} {kind}"
    return docs[0]


def test_vendored_crds_serve_the_versions_the_manifests_use() -> None:
    served = set(crd_schemas())
    assert {("inference.networking.k8s.io/v1", "InferencePool"),
            ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
            ("gateway.networking.k8s.io/v1", "HTTPRoute")} <= served
    readme = (CRDS / "README.md").read_text(encoding="utf-8")
    for path in CRDS.glob("*.yaml"):
        assert path.name in readme, f"{path.name}: its source is not in crds/README.md"
    assert len(re.findall(r"\b[0-9a-f]{40}\b", readme)) >= 2, "the README names the upstream commits"


@pytest.mark.parametrize("name", CUSTOM_MANIFESTS)
def test_custom_resources_validate_against_their_crd_schemas(name: str) -> None:
    for resource in load_yaml_docs(GATEWAY / name):
        assert validation_errors(resource) == [], f"{name}: {resource['kind']}"


def test_crd_schemas_reject_broken_custom_resources() -> None:
    pool = gateway_doc("inferencepool.yaml", "InferencePool")
    for breakage in ("no selector", "port as text", "no picker", "unknown failure mode"):
        broken = copy.deepcopy(pool)
        spec = broken["spec"]
        if breakage == "no selector":
            del spec["selector"]
        elif breakage == "port as text":
            spec["targetPorts"][0]["number"] = "8000"
        elif breakage == "no picker":
            del spec["endpointPickerRef"]
        else:
            spec["endpointPickerRef"]["failureMode"] = "Sometimes"
        assert validation_errors(broken), f"an InferencePool with {breakage} passed"
    objective = copy.deepcopy(gateway_doc("inferenceobjective.yaml", "InferenceObjective"))
    del objective["spec"]["poolRef"]
    assert validation_errors(objective)
    route = copy.deepcopy(gateway_doc("httproute.yaml", "HTTPRoute"))
    route["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Glob"
    assert validation_errors(route)


def test_built_in_kinds_validate_against_kubernetes_schemas(tmp_path: Path) -> None:
    exe = kubernetes_validate()
    for path in (GATEWAY / "epp.yaml", K8S / "hpa.yaml"):
        result = run_tool(exe, "--strict", path)
        assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "hpa.yaml"
    broken.write_text((K8S / "hpa.yaml").read_text(encoding="utf-8").replace(
        "minReplicas: 2", "minReplicas: two"), encoding="utf-8")
    assert run_tool(exe, "--strict", broken).returncode != 0


def pagode_deployment() -> dict[str, Any]:
    deployment: dict[str, Any] = load_yaml_docs(K8S / "deployment.yaml")[0]
    return deployment


def test_the_pool_selects_the_pagode_pods_and_names_the_picker() -> None:
    pool = gateway_doc("inferencepool.yaml", "InferencePool")["spec"]
    template = pagode_deployment()["spec"]["template"]
    assert pool["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ports = {p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert {p["number"] for p in pool["targetPorts"]} <= ports
    service = gateway_doc("epp.yaml", "Service")
    assert pool["endpointPickerRef"]["name"] == service["metadata"]["name"]
    assert pool["endpointPickerRef"]["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    epp = gateway_doc("epp.yaml", "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= epp["metadata"]["labels"].items()
    pool_name = gateway_doc("inferencepool.yaml", "InferencePool")["metadata"]["name"]
    route = gateway_doc("httproute.yaml", "HTTPRoute")
    assert [(b["kind"], b["name"]) for r in route["spec"]["rules"] for b in r["backendRefs"]] == \
        [("InferencePool", pool_name)]
    assert gateway_doc("inferenceobjective.yaml", "InferenceObjective")["spec"]["poolRef"]["name"] == pool_name
    args = container_args(gateway_doc("epp.yaml", "Deployment"))
    assert args[args.index("--pool-name") + 1] == pool_name


def test_the_picker_reads_the_vllm_named_series_and_may_watch_what_it_needs() -> None:
    epp = gateway_doc("epp.yaml", "Deployment")
    args = container_args(epp)
    assert {flag: args[args.index(flag) + 1] for flag in VLLM_METRIC_FLAGS} == VLLM_METRIC_FLAGS
    config_path = args[args.index("--config-file") + 1]
    config_map = gateway_doc("epp.yaml", "ConfigMap")
    plugins = yaml.safe_load(config_map["data"][Path(config_path).name])
    assert plugins["kind"] == "EndpointPickerConfig"
    names = {p["type"] for p in plugins["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= names
    assert {p["pluginRef"] for p in plugins["schedulingProfiles"][0]["plugins"]} <= names
    rules = {(g, r) for rule in gateway_doc("epp.yaml", "Role")["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools"),
            ("inference.networking.x-k8s.io", "inferenceobjectives")} <= rules
    assert epp["spec"]["template"]["spec"]["serviceAccountName"] == \
        gateway_doc("epp.yaml", "ServiceAccount")["metadata"]["name"]
    # The picker outlives the drain of the pods it routes to.
    assert epp["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= \
        pagode_deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_the_hpa_scales_the_deployment_on_the_queue_the_adapter_serves() -> None:
    hpa = load_yaml_docs(K8S / "hpa.yaml")[0]
    deployment = pagode_deployment()
    assert (hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]) == \
        ("Deployment", deployment["metadata"]["name"])
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    adapter = load_yaml_docs(K8S / "prometheus-adapter" / "values.yaml")[0]
    [rule] = adapter["rules"]["custom"]
    series = rule["seriesQuery"].split("{")[0]
    assert series == "vllm:num_requests_waiting"
    served_as = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series)
    assert metric["pods"]["metric"]["name"] == served_as
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert hpa["spec"]["minReplicas"] >= 1 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
