"""The contract against the code that implements its other side.

deploy/contract.yaml states what the manifests assume about the sidecar and the handler. Once
that code is in the tree, these tests run the sidecar's real argument parser over every command
line the manifests run (restore, watch, the preStop drain, the entrypoint's flags) and look for
the assumed HTTP paths and metric names in the source, so a rename on either side fails here
rather than in a cluster. Until the code exists they skip.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Where the rest of the system may declare things; the manifests and tests are not evidence.
NOT_SOURCES = {"deploy", "tests", "docs", ".venv", ".git", "build"}


def module_file(module: str) -> Path:
    return REPO.joinpath(*module.split(".")).with_suffix(".py")


def source_text(root: Path, suffixes: tuple[str, ...]) -> str:
    parts = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(REPO).parts
        if rel[0] in NOT_SOURCES or rel[:2] == ("handler", "planner"):
            continue
        if path.is_file() and path.suffix in suffixes:
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def sidecar_cli_present() -> bool:
    return module_file("handler.sidecar.app.cli").is_file()


def serving_handler_present() -> bool:
    # The TorchServe adapter (the serving issue) declares the ts_llm_* serving metrics.
    return "BaseHandler" in source_text(REPO / "handler", (".py",))


needs_sidecar = pytest.mark.skipif(
    not sidecar_cli_present(), reason="handler/sidecar/app/cli.py not in the tree yet"
)


def parses(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None if the parser accepts argv, else argparse's complaint."""
    try:
        parser.parse_args(argv)
    except SystemExit as err:
        return f"rejected (exit {err.code}): {argv}"
    return None


def with_env_placeholders(args: list[str]) -> list[str]:
    # $(VAR) is expanded by the kubelet from the container's env; any value will do here.
    return [re.sub(r"\$\((\w+)\)", "placeholder", a) for a in args]


def test_pyproject_declares_the_console_scripts(contract) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[contract.sidecar_console_script] == f"{contract.sidecar_module}:main"
    assert scripts["ts-llm-plan"] == "handler.planner.cli:main"


@needs_sidecar
def test_sidecar_modules_exist(contract) -> None:
    for module in [contract.sidecar_module, contract.entrypoint_module]:
        assert module_file(module).is_file(), module


@needs_sidecar
@pytest.mark.parametrize("name", ["cache-restore", "sidecar"])
def test_sidecar_cli_accepts_the_container_command_lines(pod, helpers, name) -> None:
    cli = importlib.import_module("handler.sidecar.app.cli")
    args = with_env_placeholders(helpers.container(pod, name)["args"])
    error = parses(cli.build_parser(), args)
    assert error is None, error


@needs_sidecar
def test_sidecar_cli_accepts_the_prestop_command(pod, helpers, contract) -> None:
    cli = importlib.import_module("handler.sidecar.app.cli")
    command = helpers.serving_container(pod)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == contract.sidecar_console_script
    error = parses(cli.build_parser(), command[1:])
    assert error is None, error


@needs_sidecar
def test_entrypoint_accepts_the_torchserve_container_flags(pod, helpers) -> None:
    entrypoint = importlib.import_module("handler.sidecar.app.entrypoint")
    command = helpers.serving_container(pod)["command"]
    argv = [*command[3:], "torchserve", "--start"]
    try:
        entrypoint.parse(argv)
    except SystemExit as err:
        pytest.fail(f"entrypoint rejected {command[3:]}: exit {err.code}")


@needs_sidecar
def test_sidecar_serves_the_probe_paths(contract) -> None:
    text = source_text(REPO / "handler" / "sidecar", (".py",))
    missing = [
        p for p in contract.sidecar_paths.values() if f'"{p}"' not in text and f"'{p}'" not in text
    ]
    assert missing == [], "the probes and the ServiceMonitor use these paths"
    assert str(contract.sidecar_port) in text


@pytest.mark.skipif(
    not serving_handler_present(), reason="the TorchServe handler is not in the tree yet"
)
def test_handler_declares_the_metrics_the_hpa_uses(contract) -> None:
    text = source_text(REPO, (".py", ".yaml", ".yml", ".properties", ".sh"))
    missing = [m for m in contract.metric_names.values() if m not in text]
    assert missing == [], "the HPA / adapter / dashboards expect these metrics"


@needs_sidecar
def test_sidecar_exports_the_hpa_metric_with_the_selector_label(contract) -> None:
    """The HPAs select ts_llm_requests_waiting{model_name=llm}; the sidecar's collector must
    export exactly that name and label (and the in-flight gauge the contract names)."""
    load = importlib.import_module("handler.sidecar.endpoints.replica_load")
    assert contract.metric_names["queue_waiting"] == load.WAITING
    assert contract.metric_names["in_flight"] == load.IN_FLIGHT
    assert contract.model_label == load.MODEL_LABEL


@needs_sidecar
def test_sidecar_config_knows_the_drain_flag_and_cache_dir(contract) -> None:
    config = importlib.import_module("handler.sidecar.config")
    settings = config.config_from_mapping({"drain_flag_file": contract.drain_flag_file,
                                           "cache_dir": contract.cache_dir,
                                           "cache_store": "s3://bucket/prefix"})
    # Without --cache-key (the watch container), publish reads the key step's file.
    assert settings.cache_key_path.as_posix() == contract.cache_key_file


def source_constant(module: str, name: str) -> str:
    """A module-level string constant, read from the source (importing handler.engine would
    pull in torch and the engine for one string)."""
    tree = ast.parse(module_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            assert isinstance(node.value, ast.Constant), (module, name)
            return str(node.value.value)
    raise AssertionError(f"{module} defines no {name}")


@needs_sidecar
def test_key_path_agrees_between_key_step_restore_publish_and_worker(
        pod, helpers, contract) -> None:
    """The key step writes one file; the restore must read that file, the watching sidecar's
    publish must default to it, and a worker's cold compile must write the same name inside
    the artifact dir it installs (so publish finds the key of what it uploads)."""
    cli = importlib.import_module("handler.sidecar.app.cli")
    config = importlib.import_module("handler.sidecar.config")
    key_step = helpers.container(pod, "cache-key")["args"]
    (out,) = [a.partition("=")[2] for a in key_step if a.startswith("--out=")]
    paths = {"key step": out}
    for name in ["cache-restore", "sidecar"]:
        args = cli.build_parser().parse_args(
            with_env_placeholders(helpers.container(pod, name)["args"]))
        paths[name] = config.config_from_args(args).cache_key_path.as_posix()
    env = {e["name"]: e.get("value") for e in helpers.serving_container(pod)["env"]}
    worker = source_constant("handler.cache.key", "KEY_FILE_NAME")
    paths["worker"] = f"{env[contract.cache_dir_env]}/{worker}"
    assert set(paths.values()) == {contract.cache_key_file}, paths
    assert worker == config.KEY_FILE_NAME


def test_key_step_command_is_accepted_by_precompile(pod, helpers, contract,
                                                    monkeypatch) -> None:
    """The key step's real CLI parses its arguments and writes the key where it says; the
    key computation itself (torch, the .mar) is stubbed: this checks the command line."""
    module = importlib.import_module(contract.key_module)
    cache = importlib.import_module("handler.cache")
    key = cache.CacheKey(torch_version="2.13.0", triton_version="none", device_type="cpu",
                         device_capability="x86_64", weights_digest="w" * 16,
                         config_digest="c" * 16, package_version="0.1.0")
    seen: dict[str, object] = {}
    monkeypatch.setattr(module, "key_for_mar", lambda mar: seen.setdefault("mar", mar) and key)
    monkeypatch.setattr(module, "write_key_file",
                        lambda cache_key, path: seen.setdefault("out", (cache_key, path)))
    c = helpers.container(pod, "cache-key")
    assert c["command"][:2] == ["python", "-m"] and c["command"][2] == contract.key_module
    try:
        code = module.main(c["args"])
    except SystemExit as err:
        pytest.fail(f"{contract.key_module} rejected {c['args']}: exit {err.code}")
    assert code == 0
    assert Path(str(seen["mar"])).as_posix() == f"{contract.model_store}/{contract.mar_file}"
    assert seen["out"] == (key, Path(contract.cache_key_file))
