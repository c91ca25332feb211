"""Values that must agree do agree: manifests vs deploy/contract.yaml, and manifests vs each
other (ports, probe targets, grace period vs drain deadline, metric names, selectors).

Most checks run for each of the three pod specs that run a replica (spot and on-demand
Deployments, KServe predictor): see the `pod` fixture in conftest.py.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from handler.torchserve.launch import LOG_CONFIG_ARG

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
CONFIG_PROPERTIES = K8S / "common" / "config.properties"


def parse_properties(text: str) -> dict[str, str]:
    # The subset of java.util.Properties that config.properties uses: key=value, # comments.
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not key=value: {line!r}"
        assert key.strip() not in props, f"duplicate key {key.strip()}"
        props[key.strip()] = value.strip()
    return props


@pytest.fixture(scope="module")
def ts_props() -> dict[str, str]:
    return parse_properties(CONFIG_PROPERTIES.read_text())


def port_number(container: dict, port: int | str) -> int:
    # Probes resolve a named port within their own container.
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert len(named) == 1, (container["name"], port)
    return named[0]


def http_target(container: dict, probe: dict) -> tuple[int, str]:
    get = probe["httpGet"]
    return port_number(container, get["port"]), get["path"]


def declared_ports(pod: dict, helpers, regular_only: bool = False) -> dict[str, int]:
    cs = pod["containers"] if regular_only else list(helpers.containers(pod))
    return {p["name"]: p["containerPort"] for c in cs for p in c.get("ports", [])}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def flag_values(args: list[str]) -> dict[str, str]:
    # The manifests pass flags as --name=value, so each arg is self-contained.
    out = {}
    for arg in args[1:]:
        assert arg.startswith("--") and "=" in arg, f"expected --flag=value, got {arg!r}"
        name, _, value = arg.partition("=")
        out[name] = value
    return out


# ---- config.properties -----------------------------------------------------------------


@pytest.mark.parametrize(
    "key, port_key, bind_key",
    [
        ("inference_address", "inference", "inference"),
        ("management_address", "management", "management"),
        ("metrics_address", "metrics", "metrics"),
    ],
)
def test_config_properties_http_addresses(ts_props, contract, key, port_key, bind_key) -> None:
    expected = f"http://{contract.ts_bind[bind_key]}:{contract.ts_ports[port_key]}"
    assert ts_props[key] == expected


@pytest.mark.parametrize("name", ["grpc_inference", "grpc_management"])
def test_config_properties_grpc_addresses(ts_props, contract, name) -> None:
    assert ts_props[f"{name}_address"] == contract.ts_bind[name]
    assert int(ts_props[f"{name}_port"]) == contract.ts_ports[name]


def test_management_api_is_loopback_only(ts_props, contract) -> None:
    """Only the sidecar in the same pod may scale or unregister the model."""
    assert contract.ts_bind["management"] == "127.0.0.1"
    assert contract.ts_bind["grpc_management"] == "127.0.0.1"
    assert "127.0.0.1" in ts_props["management_address"]


def test_prometheus_metrics_are_on(ts_props) -> None:
    assert ts_props["metrics_mode"] == "prometheus"
    assert ts_props.get("enable_metrics_api", "true") == "true"


def test_token_auth_is_off_because_probes_and_the_service_cannot_send_keys(
    ts_props, helpers, manifests
) -> None:
    """The liveness probe hits /ping on the inference port, which with token auth on answers
    400 to a request without the per-pod key: the pod would be restarted forever."""
    pod = helpers.pod_spec_of(manifests, "Deployment/ts-llm-spot")
    ts = helpers.serving_container(pod)
    assert ts["livenessProbe"]["httpGet"]["port"] in ("http", 8080)
    assert ts_props["disable_token_authorization"] == "true"


def test_config_keys_are_known_to_torchserve(ts_props) -> None:
    """Every key must be one TorchServe 0.12.0's ConfigManager reads, or its `torchserve` launcher
    (vmargs: the JVM's arguments); a misspelt key is ignored silently by TorchServe, so check
    against the strings in its own jar and launcher."""
    ts = pytest.importorskip("ts")
    jar = Path(ts.__file__).parent / "frontend" / "model-server.jar"
    if not jar.is_file():
        pytest.skip("TorchServe frontend jar not installed")
    import zipfile

    with zipfile.ZipFile(jar) as z:
        cls = z.read("org/pytorch/serve/util/ConfigManager.class")
    launcher = (Path(ts.__file__).parent / "model_server.py").read_text()
    unknown = [k for k in ts_props if k.encode() not in cls and f'props.get("{k}")' not in launcher]
    assert unknown == []


REPO_CONFIG = REPO / "config.properties"
# Keys whose pod value differs from the repository's single-machine file on purpose.
POD_DIFFERENCES = {
    "inference_address",
    "metrics_address",
    "grpc_inference_address",
    "disable_token_authorization",
    "metrics_config",
    "vmargs",  # the log configuration's path, absolute in the image
}


def test_config_properties_follows_the_repository_one(ts_props) -> None:
    """Same keys and values as the top-level config.properties except the listed differences,
    so a timeout or queue size changed there is not silently missing in the cluster."""
    if not REPO_CONFIG.is_file():
        pytest.skip("no top-level config.properties in the tree yet")
    repo = parse_properties(REPO_CONFIG.read_text())
    assert set(ts_props) ^ set(repo) == set(), "keys only in one of the two files"
    differ = {k for k in repo if repo[k] != ts_props[k]}
    assert differ <= POD_DIFFERENCES, {k: (repo[k], ts_props[k]) for k in differ - POD_DIFFERENCES}


def dockerfile_copies() -> dict[str, str]:
    """COPY destination -> source, from deploy/docker/Dockerfile."""
    out = {}
    for line in (REPO / "deploy" / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            words = [w for w in line.split()[1:] if not w.startswith("--")]
            out[words[-1]] = words[0]
    return out


@pytest.mark.parametrize("key, prefix", [("metrics_config", ""), ("vmargs", LOG_CONFIG_ARG)])
def test_files_the_pod_config_names_are_in_the_image(ts_props, key, prefix) -> None:
    """metrics.yaml and log4j2.xml: at absolute paths the Dockerfile copies the repository's files to."""
    path = ts_props[key].removeprefix(prefix)
    assert path.startswith("/"), "relative to the JVM's working directory, which is the image's"
    source = dockerfile_copies().get(path)
    assert source, f"the Dockerfile does not put anything at {path}"
    if REPO_CONFIG.is_file():
        assert parse_properties(REPO_CONFIG.read_text())[key] == prefix + source


def test_startup_probe_outlasts_torchserve_startup_timeout(pod, ts_props, helpers) -> None:
    """TorchServe gives a loading (compiling) worker default_startup_timeout; the pod must not
    be killed by its startup probe before TorchServe itself gives up."""
    probe = helpers.serving_container(pod)["startupProbe"]
    budget = (
        probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    )
    assert budget >= int(ts_props["default_startup_timeout"])


# ---- ports ----------------------------------------------------------------------------


def test_container_ports_match_contract(pod, contract, helpers) -> None:
    ports = declared_ports(pod, helpers)
    assert ports == {
        "http": contract.ts_ports["inference"],
        "grpc": contract.ts_ports["grpc_inference"],
        "ts-metrics": contract.ts_ports["metrics"],
        "sidecar": contract.sidecar_port,
    }
    # Management is loopback-only; declaring it would suggest it is reachable.
    assert contract.ts_ports["management"] not in ports.values()
    assert contract.ts_ports["grpc_management"] not in ports.values()


def test_sidecar_port_is_on_the_sidecar(pod, contract, helpers) -> None:
    sidecar = helpers.container(pod, "sidecar")
    assert [p["containerPort"] for p in sidecar["ports"]] == [contract.sidecar_port]


def test_service_target_ports_resolve(manifests, helpers, contract) -> None:
    """Named targetPorts are looked up in the regular containers only; a numeric one must still
    be declared by some container, or nothing listens there."""
    svc = manifests.get("Service", "ts-llm")
    for source in ["Deployment/ts-llm-spot", "Deployment/ts-llm-ondemand"]:
        pod = helpers.pod_spec_of(manifests, source)
        regular = declared_ports(pod, helpers, regular_only=True)
        every = declared_ports(pod, helpers)
        for port in svc["spec"]["ports"]:
            target = port["targetPort"]
            if isinstance(target, str):
                assert target in regular, (port["name"], target)
            else:
                assert target in every.values(), (port["name"], target)


def test_service_ports_match_contract(manifests, contract) -> None:
    svc = manifests.get("Service", "ts-llm")
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert ports == {
        "http": contract.ts_ports["inference"],
        "grpc": contract.ts_ports["grpc_inference"],
        "ts-metrics": contract.ts_ports["metrics"],
        "sidecar": contract.sidecar_port,
    }


def test_service_selects_both_pools(manifests, contract) -> None:
    sel = manifests.get("Service", "ts-llm")["spec"]["selector"]
    for name in ["ts-llm-spot", "ts-llm-ondemand"]:
        labels = manifests.get("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert matches(sel, labels), name


# ---- probes ---------------------------------------------------------------------------


def test_readiness_comes_from_the_sidecar(pod, contract, helpers) -> None:
    ts = helpers.serving_container(pod)
    assert http_target(ts, ts["readinessProbe"]) == (
        contract.sidecar_port,
        contract.sidecar_paths["ready"],
    )


def test_startup_probe_waits_for_ready_for_a_cold_compile(pod, contract, helpers) -> None:
    ts = helpers.serving_container(pod)
    probe = ts["startupProbe"]
    assert http_target(ts, probe) == (contract.sidecar_port, contract.sidecar_paths["ready"])
    budget = (
        probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    )
    assert budget >= contract.cold_start_budget_s


def test_liveness_is_torchserve_ping(pod, contract, helpers) -> None:
    ts = helpers.serving_container(pod)
    assert http_target(ts, ts["livenessProbe"]) == (
        contract.ts_ports["inference"],
        contract.ping_path,
    )


def test_sidecar_probes_use_live(pod, contract, helpers) -> None:
    sidecar = helpers.container(pod, "sidecar")
    for kind in ["startupProbe", "livenessProbe"]:
        assert http_target(sidecar, sidecar[kind]) == (
            contract.sidecar_port,
            contract.sidecar_paths["live"],
        )
    # A readiness probe here would make pod readiness depend on the sidecar twice.
    assert "readinessProbe" not in sidecar


def test_probe_paths_are_sidecar_paths(pod, contract, helpers) -> None:
    for c in helpers.containers(pod):
        for kind in ["startupProbe", "readinessProbe", "livenessProbe"]:
            if kind not in c:
                continue
            port, path = http_target(c, c[kind])
            if port == contract.sidecar_port:
                assert path in contract.sidecar_paths.values(), (c["name"], kind, path)


def test_rollout_deadline_covers_a_cold_start(manifests, contract) -> None:
    for name in ["ts-llm-spot", "ts-llm-ondemand"]:
        dep = manifests.get("Deployment", name)
        assert dep["spec"]["progressDeadlineSeconds"] >= contract.cold_start_budget_s, name


# ---- termination: grace period, preStop, native sidecar --------------------------------


def test_grace_period_fits_the_spot_notice(pod, contract) -> None:
    grace = pod["terminationGracePeriodSeconds"]
    # The drain must fit, then TorchServe must have time to exit after SIGTERM...
    assert grace >= contract.aws_notice_s - contract.drain_margin_s
    assert grace >= contract.drain_deadline_s + contract.ts_stop_s
    # ...and the budget is planned inside the notice: beyond it the instance is already gone.
    assert grace <= contract.aws_notice_s


def test_prestop_asks_the_sidecar_to_drain(pod, contract, helpers) -> None:
    ts = helpers.serving_container(pod)
    command = ts["lifecycle"]["preStop"]["exec"]["command"]
    assert tuple(command) == contract.prestop_command
    assert command[0] == contract.sidecar_console_script
    assert command[1] in contract.subcommands
    assert all(a in contract.flags for a in command[2:] if a.startswith("--"))


def test_sidecar_is_native_and_starts_after_restore(pod, helpers) -> None:
    names = [c["name"] for c in pod["initContainers"]]
    # The key first: the restore looks it up.
    assert names == ["cache-key", "cache-restore", "sidecar"]
    key, restore, sidecar = pod["initContainers"]
    # restartPolicy Always: a native sidecar, stopped only after the main container exits.
    assert sidecar.get("restartPolicy") == "Always"
    # Plain init containers: they must finish before TorchServe starts loading.
    assert "restartPolicy" not in restore and "restartPolicy" not in key


@pytest.mark.parametrize("name, subcommand", [("cache-restore", "restore"), ("sidecar", "watch")])
def test_sidecar_commands_and_flags(pod, contract, helpers, name, subcommand) -> None:
    c = helpers.container(pod, name)
    assert c["command"] == [contract.sidecar_console_script]
    assert c["args"][0] == subcommand and subcommand in contract.subcommands
    flags = flag_values(c["args"])
    assert set(flags) <= set(contract.flags), set(flags) - set(contract.flags)
    assert flags["--model-name"] == contract.model_name
    assert flags["--cache-dir"] == contract.cache_dir
    if subcommand == "restore":
        # The key step's file; the watch publishes with the default key path, which
        # tests/deploy/test_deploy_sources.py checks is the same file.
        assert flags["--cache-key"] == contract.cache_key_file
    # The bucket and the prefix both come from the ConfigMap (next test), into one store URI.
    assert flags["--cache-store"] == "s3://$(S3_BUCKET)/$(S3_PREFIX)"
    # What is restored must be signed by the fleet key; pods sign nothing (builds do).
    assert flags["--cache-public-key"] == contract.fleet_public_key
    assert "--cache-signing-key" not in flags
    if subcommand == "watch":
        assert int(flags["--drain-margin-s"]) == contract.drain_margin_s
        assert flags["--stop-method"] == contract.stop_method
        assert flags["--drain-flag-file"] == contract.drain_flag_file
        # A preStop `drain` request gets the pod's grace period as its deadline.
        assert float(flags["--signal-grace-s"]) == pod["terminationGracePeriodSeconds"]


def test_the_fleet_public_key_is_mounted_from_its_secret(pod, contract, helpers) -> None:
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == contract.fleet_key_secret]
    # Not optional: a pod that could start without the key would restore unverified code.
    assert not volume["secret"].get("optional", False)
    key_dir = str(PurePosixPath(contract.fleet_public_key).parent)
    for c in helpers.containers(pod):
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] == volume["name"]]
        if c["name"] in ("cache-restore", "sidecar"):
            assert mounts == [{"name": volume["name"], "mountPath": key_dir, "readOnly": True}], c["name"]
        else:
            assert mounts == [], c["name"]


def test_s3_settings_come_from_the_sidecar_configmap(pod, helpers) -> None:
    for name in ["cache-restore", "sidecar"]:
        c = helpers.container(pod, name)
        refs = {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in c["env"] if "valueFrom" in e}
        for var in re.findall(r"\$\((\w+)\)", " ".join(c["args"])):
            assert refs[var] == {"name": "ts-llm-sidecar", "key": var}, (name, var)


# ---- the TorchServe container -----------------------------------------------------------


def entrypoint_flags(command: list[str]) -> dict[str, str]:
    # python -m MODULE --flag=value ... --
    assert command[-1] == "--", command
    return flag_values(["entrypoint", *command[3:-1]])


def test_torchserve_runs_behind_the_entrypoint(pod, contract, helpers) -> None:
    ts = helpers.serving_container(pod)
    assert ts["command"][:3] == ["python", "-m", contract.entrypoint_module]
    assert set(entrypoint_flags(ts["command"])) == set(contract.entrypoint_flags)
    assert ts["args"] == [
        "torchserve",
        "--start",
        "--foreground",
        "--model-store",
        contract.model_store,
        "--models",
        f"{contract.model_name}={contract.mar_file}",
        "--ts-config",
        contract.ts_config_path,
    ]


def test_the_entrypoint_records_its_stop_where_the_sidecar_reads_it(pod, contract, helpers) -> None:
    """In a pod the entrypoint stops TorchServe, not the sidecar: its measured stop must reach
    the sidecar's record (stop-seconds.json beside cache_dir), which the sidecar shares with
    the fleet, or every replica's drain keeps the 10 s default stop reserve."""
    from pathlib import PurePosixPath

    from handler.sidecar.drain.stop_record import NAME

    flags = entrypoint_flags(helpers.serving_container(pod)["command"])
    assert flags["--stop-record-file"] == str(PurePosixPath(contract.cache_dir).parent / NAME)
    assert str(PurePosixPath(flags["--stop-record-file"]).parent) == contract.cache_volume


def test_entrypoint_leaves_the_sidecar_port_alone(pod, contract, helpers) -> None:
    """The entrypoint embeds a sidecar with its own HTTP server; on the native sidecar's port
    it would fail to bind (same network namespace) and crash-loop TorchServe."""
    flags = entrypoint_flags(helpers.serving_container(pod)["command"])
    assert int(flags["--listen-port"]) != contract.sidecar_port
    assert int(flags["--listen-port"]) not in contract.ts_ports.values()


def test_entrypoint_sigterm_deadline_is_the_grace_period(pod, helpers) -> None:
    flags = entrypoint_flags(helpers.serving_container(pod)["command"])
    assert float(flags["--signal-grace-s"]) == pod["terminationGracePeriodSeconds"]


def test_only_the_native_sidecar_watches_the_metadata_service(pod, helpers) -> None:
    """A second watcher in the entrypoint would stop TorchServe on the spot notice itself; the
    container would exit and the kubelet restart it while the pod is draining."""
    flags = entrypoint_flags(helpers.serving_container(pod)["command"])
    assert flags["--clouds"] == ""
    watch = flag_values(helpers.container(pod, "sidecar")["args"])
    assert watch.get("--clouds", "aws") != ""


def test_config_properties_is_mounted_where_torchserve_reads_it(pod, contract, helpers) -> None:
    ts = helpers.serving_container(pod)
    mount = [m for m in ts["volumeMounts"] if m["mountPath"] == contract.ts_config_path]
    assert len(mount) == 1 and mount[0]["subPath"] == "config.properties"
    vol = next(v for v in pod["volumes"] if v["name"] == mount[0]["name"])
    assert vol["configMap"]["name"] == "ts-llm-config"
    assert vol["configMap"]["items"] == [{"key": "config.properties", "path": "config.properties"}]


def mounted_at(pod, helpers, path: str) -> list[dict]:
    """The volumes some container mounts at `path`."""
    names = {m["name"] for c in helpers.containers(pod) for m in c["volumeMounts"]
             if m["mountPath"] == path}
    return [v for v in pod["volumes"] if v["name"] in names]


def test_cache_volume_is_shared_by_every_container(pod, contract, helpers) -> None:
    vol = mounted_at(pod, helpers, contract.cache_volume)
    assert len(vol) == 1 and "emptyDir" in vol[0]
    names = [c["name"] for c in helpers.containers(pod)]
    assert names[:3] == ["cache-key", "cache-restore", "sidecar"] and len(names) == 4
    for c in helpers.containers(pod):
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts.get(vol[0]["name"]) == contract.cache_volume, c["name"]
    env = {e["name"]: e.get("value") for e in helpers.serving_container(pod)["env"]}
    assert env[contract.cache_dir_env] == contract.cache_dir
    assert env["TORCHINDUCTOR_CACHE_DIR"] == contract.inductor_cache_dir


def inside(path: str, root: str) -> bool:
    """path is root or below it (POSIX paths, no symlinks in play)."""
    return PurePosixPath(root) in (PurePosixPath(path), *PurePosixPath(path).parents)


def test_artifact_dir_is_inside_the_volume_and_not_a_mount_point(pod, contract,
                                                                 helpers) -> None:
    """An install locks and stages in the artifact dir's parent and renames the dir itself:
    the parent must be on the volume (writable; /var/cache is root's) and the dir no mount."""
    artifact = PurePosixPath(contract.cache_dir)
    assert artifact != PurePosixPath(contract.cache_volume)
    assert inside(str(artifact.parent), contract.cache_volume)
    for c in helpers.containers(pod):
        for m in c["volumeMounts"]:
            assert not inside(m["mountPath"], contract.cache_dir), (c["name"], m["mountPath"])


def test_inductor_cache_is_beside_the_artifact_dir_not_inside(pod, contract, helpers) -> None:
    """handler.engine.compiled.artifacts.check_layout refuses TORCHINDUCTOR_CACHE_DIR inside (or equal
    to) the artifact dir: every worker load would fail."""
    env = {e["name"]: e.get("value") for e in helpers.serving_container(pod)["env"]}
    inductor, artifact = env["TORCHINDUCTOR_CACHE_DIR"], env[contract.cache_dir_env]
    assert not inside(inductor, artifact), (inductor, artifact)
    assert not inside(artifact, inductor), (inductor, artifact)
    assert inside(inductor, contract.cache_volume), "on the pod's volume, writable"
    assert PurePosixPath(inductor).parent == PurePosixPath(artifact).parent, "siblings"


def memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def test_key_step_writes_the_key_the_restore_reads(pod, contract, helpers) -> None:
    key = helpers.container(pod, "cache-key")
    assert key["command"] == ["python", "-m", contract.key_module]
    assert key["args"] == ["key", f"{contract.model_store}/{contract.mar_file}",
                           f"--out={contract.cache_key_file}"]
    restore = flag_values(helpers.container(pod, "cache-restore")["args"])
    assert restore["--cache-key"] == contract.cache_key_file
    # The watch passes no --cache-key: it publishes with <cache-dir>/cache-key.json, the key
    # step's file (and, after a cold compile, the one inside the installed artifact).
    watch = flag_values(helpers.container(pod, "sidecar")["args"])
    assert "--cache-key" not in watch
    assert str(PurePosixPath(contract.cache_key_file).parent) == watch["--cache-dir"]
    assert inside(contract.cache_key_file, contract.cache_volume)


def test_key_step_has_memory_for_importing_torch(pod, contract, helpers) -> None:
    resources = helpers.container(pod, "cache-key")["resources"]
    assert memory_bytes(resources["limits"]["memory"]) >= memory_bytes(
        contract.key_memory_limit_min)
    assert memory_bytes(resources["requests"]["memory"]) <= memory_bytes(
        resources["limits"]["memory"])


def test_drain_flag_is_shared_by_sidecar_and_torchserve_outside_the_cache(
        pod, contract, helpers) -> None:
    flag_dir = contract.drain_flag_file.rsplit("/", 1)[0]
    # Never inside the cache volume: the cache is published to S3 and restored elsewhere,
    # where a restored flag would make the new replica refuse every request.
    assert not inside(contract.drain_flag_file, contract.cache_volume)
    (vol,) = mounted_at(pod, helpers, flag_dir)
    assert "emptyDir" in vol
    for name in ["sidecar", helpers.serving_container(pod)["name"]]:
        mounts = {m["name"]: m["mountPath"] for m in helpers.container(pod, name)["volumeMounts"]}
        assert mounts.get(vol["name"]) == flag_dir, name
    # The entrypoint's own drain (SIGTERM without preStop) closes admission with the same file.
    flags = entrypoint_flags(helpers.serving_container(pod)["command"])
    assert flags["--drain-flag-file"] == contract.drain_flag_file


def test_one_image_for_all_containers(pod, helpers) -> None:
    assert len({c["image"] for c in helpers.containers(pod)}) == 1


def test_pod_meets_restricted_pod_security(pod, helpers) -> None:
    sec = pod["securityContext"]
    assert sec["runAsNonRoot"] is True
    assert sec["seccompProfile"]["type"] == "RuntimeDefault"
    for c in helpers.containers(pod):
        csec = c["securityContext"]
        assert csec["allowPrivilegeEscalation"] is False, c["name"]
        assert csec["capabilities"]["drop"] == ["ALL"], c["name"]


# ---- autoscaling and metrics ---------------------------------------------------------------


def hpas(manifests) -> list[dict]:
    return [d.data for d in manifests.docs if d.kind == "HorizontalPodAutoscaler"]


def test_hpa_scales_on_the_handler_queue_metric(manifests, contract) -> None:
    assert len(hpas(manifests)) == 3
    for hpa in hpas(manifests):
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] == contract.metric_names["queue_waiting"]
        assert metric["pods"]["metric"]["selector"]["matchLabels"] == {
            contract.model_label: contract.model_name
        }


def test_hpas_target_existing_workloads(manifests) -> None:
    base = {d.name for d in manifests.of_kind("Deployment", "base")}
    targets = {
        d.path.parent.name: d.data["spec"]["scaleTargetRef"]["name"]
        for d in manifests.docs
        if d.kind == "HorizontalPodAutoscaler"
    }
    assert {
        d.data["spec"]["scaleTargetRef"]["name"]
        for d in manifests.of_kind("HorizontalPodAutoscaler", "base")
    } == base
    # KServe names the predictor's Deployment <InferenceService name>-predictor.
    isvc = manifests.get("InferenceService", "ts-llm", under="overlays/kserve")
    assert targets["kserve"] == f"{isvc['metadata']['name']}-predictor"


def test_on_demand_only_takes_the_overflow(manifests) -> None:
    """The on-demand HPA targets a deeper queue than the spot one, so it grows only when spot
    cannot keep the queue at its own target (spot pods Pending)."""

    def target(name: str) -> float:
        hpa = manifests.get("HorizontalPodAutoscaler", name)
        return float(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])

    assert target("ts-llm-ondemand") > target("ts-llm-spot")
    ondemand = manifests.get("HorizontalPodAutoscaler", "ts-llm-ondemand")
    assert ondemand["spec"]["minReplicas"] >= 1, "the on-demand floor must not be zero"


def adapter_rules(manifests) -> list[dict]:
    cm = manifests.get("ConfigMap", "prometheus-adapter", under="monitoring")
    return yaml.safe_load(cm["data"]["config.yaml"])["rules"]


def test_prometheus_adapter_serves_the_hpa_metric(manifests, contract) -> None:
    rules = adapter_rules(manifests)
    served = {r["name"]["as"]: r for r in rules}
    for hpa in hpas(manifests):
        name = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        rule = served[name]
        assert rule["seriesQuery"].startswith(name + "{")
        assert re.fullmatch(rule["name"]["matches"], name)
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
        assert "<<.LabelMatchers>>" in rule["metricsQuery"]


def test_adapter_rules_only_name_contract_metrics(manifests, contract) -> None:
    for rule in adapter_rules(manifests):
        assert rule["name"]["as"] in contract.metric_names.values(), rule["name"]


def test_servicemonitor_matches_the_service(manifests, contract) -> None:
    sm = manifests.get("ServiceMonitor", "ts-llm")
    svc = manifests.get("Service", "ts-llm")
    assert matches(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    scraped = {e["port"]: e["path"] for e in sm["spec"]["endpoints"]}
    assert set(scraped) <= set(svc_ports)
    # Both metrics endpoints, on the paths the servers expose.
    by_port = {svc_ports[name]: path for name, path in scraped.items()}
    assert by_port == {
        contract.ts_ports["metrics"]: contract.metrics_path,
        contract.sidecar_port: contract.sidecar_paths["metrics"],
    }


def test_podmonitor_ports_are_kserve_container_ports(manifests, contract, helpers) -> None:
    pm = manifests.get("PodMonitor", "ts-llm", under="overlays/kserve")
    pod = helpers.pod_spec_of(manifests, "InferenceService/ts-llm")
    ports = declared_ports(pod, helpers)
    by_port = {ports[e["port"]]: e["path"] for e in pm["spec"]["podMetricsEndpoints"]}
    assert by_port == {
        contract.ts_ports["metrics"]: contract.metrics_path,
        contract.sidecar_port: contract.sidecar_paths["metrics"],
    }


# ---- selectors and labels --------------------------------------------------------------


def test_deployment_selectors_match_their_own_pods_only(manifests) -> None:
    spot = manifests.get("Deployment", "ts-llm-spot")
    ondemand = manifests.get("Deployment", "ts-llm-ondemand")
    for dep, other in [(spot, ondemand), (ondemand, spot)]:
        sel = dep["spec"]["selector"]["matchLabels"]
        assert matches(sel, dep["spec"]["template"]["metadata"]["labels"])
        # Overlapping selectors would make the two Deployments fight over each other's pods.
        assert not matches(sel, other["spec"]["template"]["metadata"]["labels"])


def test_pdb_covers_both_pools(manifests) -> None:
    sel = manifests.get("PodDisruptionBudget", "ts-llm")["spec"]["selector"]["matchLabels"]
    for name in ["ts-llm-spot", "ts-llm-ondemand"]:
        labels = manifests.get("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert matches(sel, labels), name


def test_topology_spread_selects_own_pods(manifests) -> None:
    for name in ["ts-llm-spot", "ts-llm-ondemand"]:
        tpl = manifests.get("Deployment", name)["spec"]["template"]
        for tsc in tpl["spec"]["topologySpreadConstraints"]:
            assert matches(tsc["labelSelector"]["matchLabels"], tpl["metadata"]["labels"])
        keys = {t["topologyKey"] for t in tpl["spec"]["topologySpreadConstraints"]}
        assert "topology.kubernetes.io/zone" in keys


def test_kserve_selectors_use_the_label_kserve_sets(manifests) -> None:
    isvc = manifests.get("InferenceService", "ts-llm", under="overlays/kserve")
    label = {"serving.kserve.io/inferenceservice": isvc["metadata"]["name"]}
    pdb = manifests.get("PodDisruptionBudget", "ts-llm", under="overlays/kserve")
    pm = manifests.get("PodMonitor", "ts-llm", under="overlays/kserve")
    assert pdb["spec"]["selector"]["matchLabels"] == label
    assert pm["spec"]["selector"]["matchLabels"] == label
    for tsc in isvc["spec"]["predictor"]["topologySpreadConstraints"]:
        assert tsc["labelSelector"]["matchLabels"] == label


# ---- spot placement --------------------------------------------------------------------

SPOT_LABELS = {("karpenter.sh/capacity-type", "spot"), ("eks.amazonaws.com/capacityType", "SPOT")}


def required_terms(pod: dict) -> list[list[dict]]:
    node = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [t["matchExpressions"] for t in node["nodeSelectorTerms"]]


def test_spot_pool_requires_spot_nodes(manifests, helpers) -> None:
    pod = helpers.pod_spec_of(manifests, "Deployment/ts-llm-spot")
    terms = required_terms(pod)
    # Each ORed term pins one labelling scheme to spot.
    assert {
        (e["key"], e["values"][0]) for t in terms for e in t if e["operator"] == "In"
    } == SPOT_LABELS
    assert all(len(t) == 1 for t in terms)


def test_on_demand_pool_excludes_spot_nodes(manifests, helpers) -> None:
    pod = helpers.pod_spec_of(manifests, "Deployment/ts-llm-ondemand")
    (term,) = required_terms(pod)
    assert {(e["key"], e["values"][0]) for e in term if e["operator"] == "NotIn"} == SPOT_LABELS


def test_spot_taints_are_tolerated_only_by_spot_pods(manifests, helpers) -> None:
    def spot_tolerations(pod: dict) -> set:
        return {(t["key"], t.get("value")) for t in pod["tolerations"]} & SPOT_LABELS

    assert spot_tolerations(helpers.pod_spec_of(manifests, "Deployment/ts-llm-spot")) == SPOT_LABELS
    assert (
        spot_tolerations(helpers.pod_spec_of(manifests, "InferenceService/ts-llm")) == SPOT_LABELS
    )
    assert spot_tolerations(helpers.pod_spec_of(manifests, "Deployment/ts-llm-ondemand")) == set()


def test_no_toleration_hides_a_dying_node(pod) -> None:
    """Termination handlers taint a node that got a notice so nothing new lands there; a
    blanket toleration (no key) or one for those taints would schedule replicas onto it."""
    for t in pod["tolerations"]:
        assert t.get("key"), t
        assert not t["key"].startswith("aws-node-termination-handler/"), t
        assert t["key"] != "karpenter.sh/disrupted", t
        if t["effect"] == "NoExecute":
            assert t["tolerationSeconds"] <= 60, t


# ---- the copies of the pod template stay in step ----------------------------------------

# What may differ between the pools: where they run. Everything else is one replica design.
PLACEMENT_KEYS = {"affinity", "tolerations", "topologySpreadConstraints"}
KSERVE_ONLY_KEYS = {"minReplicas", "maxReplicas"}


def test_pools_share_one_pod_design(manifests, helpers) -> None:
    spot = helpers.pod_spec_of(manifests, "Deployment/ts-llm-spot")
    ondemand = helpers.pod_spec_of(manifests, "Deployment/ts-llm-ondemand")
    assert strip(spot, PLACEMENT_KEYS) == strip(ondemand, PLACEMENT_KEYS)
    # The NoExecute tolerations (fast eviction from a lost node) are shared too.
    assert no_execute(spot) == no_execute(ondemand)


def strip(pod: dict, keys: set[str]) -> dict:
    return {k: v for k, v in pod.items() if k not in keys}


def no_execute(pod: dict) -> list[dict]:
    return [t for t in pod["tolerations"] if t["effect"] == "NoExecute"]


def test_kserve_predictor_is_the_same_pod(manifests, helpers) -> None:
    spot = helpers.pod_spec_of(manifests, "Deployment/ts-llm-spot")
    predictor = helpers.pod_spec_of(manifests, "InferenceService/ts-llm")
    a, b = strip(spot, PLACEMENT_KEYS | KSERVE_ONLY_KEYS), strip(predictor, PLACEMENT_KEYS | KSERVE_ONLY_KEYS)
    a["containers"] = [dict(c, name="kserve-container") for c in a["containers"]]
    assert a == b


def test_the_two_deployments_roll_without_losing_capacity(manifests) -> None:
    for name in ["ts-llm-spot", "ts-llm-ondemand"]:
        rolling = manifests.get("Deployment", name)["spec"]["strategy"]["rollingUpdate"]
        assert rolling["maxUnavailable"] == 0, name


# ---- the image -------------------------------------------------------------------------


def dockerfile_instruction(name: str) -> Any:
    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, (name, lines)
    value = lines[0][len(name) + 1 :]
    return yaml.safe_load(value) if value.startswith("[") else value


def test_dockerfile_matches_the_torchserve_container(manifests, helpers, contract) -> None:
    pod = helpers.pod_spec_of(manifests, "Deployment/ts-llm-spot")
    ts = helpers.serving_container(pod)
    # The image's entrypoint is the single-container form (its embedded sidecar owns 8090);
    # the pod adds only the flags that make room for the native sidecar.
    assert dockerfile_instruction("ENTRYPOINT") == [
        "python",
        "-m",
        contract.entrypoint_module,
        "--",
    ]
    assert dockerfile_instruction("CMD") == ts["args"]
    exposed = {int(p) for p in dockerfile_instruction("EXPOSE").split()}
    assert exposed == set(declared_ports(pod, helpers).values())
    uid, gid = dockerfile_instruction("USER").split(":")
    assert int(uid) == pod["securityContext"]["runAsUser"]
    assert int(gid) == pod["securityContext"]["runAsGroup"]
    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    assert f"{contract.model_store}/{contract.mar_file}" in text


def test_the_serving_container_resumes_cut_streams_from_the_cache_bucket(pod, contract, helpers) -> None:
    # issue 62: in the shipped deployment a cut stream could not resume
    ts = helpers.serving_container(pod)
    env = {e["name"]: e for e in ts["env"]}
    assert env[contract.resume_env["store"]]["value"] == "s3://$(S3_BUCKET)/$(S3_PREFIX)"
    for var in ("S3_BUCKET", "S3_PREFIX"):
        assert env[var]["valueFrom"]["configMapKeyRef"] == {"name": "ts-llm-sidecar", "key": var}
    assert env[contract.resume_env["secret_file"]]["value"] == contract.resume_secret_file


def test_the_resume_secret_is_mounted_from_its_secret_into_the_serving_container_only(pod, contract, helpers) -> None:
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == contract.resume_secret]
    assert not volume["secret"].get("optional", False), "a replica without it would write unsealed records"
    secret_dir = str(PurePosixPath(contract.resume_secret_file).parent)
    for c in helpers.containers(pod):
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] == volume["name"]]
        expected = [{"name": volume["name"], "mountPath": secret_dir, "readOnly": True}]
        assert mounts == (expected if c is helpers.serving_container(pod) else []), c["name"]


def test_the_handler_reads_the_resume_settings_the_manifests_set(contract) -> None:
    from handler.serving.config import RESUME_ENV

    assert {"resume_store": contract.resume_env["store"],
                          "resume_secret_file": contract.resume_env["secret_file"]} == RESUME_ENV
