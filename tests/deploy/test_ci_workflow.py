"""deploy/ci/artifacts.yml, the example CI workflow: valid GitHub Actions structure, one job per
real CPU profile, and only archive.sh options that exist."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from handler.engine.platform import BY_NAME
from handler.packing.cli import parse_args

WORKFLOW = Path(__file__).resolve().parents[2] / "deploy" / "ci" / "artifacts.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def _archive_argv(run: str) -> list[str]:
    concrete = re.sub(r"\$\{\{[^}]*\}\}", "X", run)  # expressions -> a placeholder value
    argv = shlex.split(concrete)
    return argv[argv.index("./archive.sh") + 1:]


def test_it_is_a_workflow_with_a_trigger_and_jobs_that_run_somewhere(workflow):
    assert workflow["name"] and workflow[True]  # YAML 1.1 reads the key `on` as True
    for name, job in workflow["jobs"].items():
        assert job["runs-on"], name
        assert all(("run" in s) != ("uses" in s) for s in job["steps"]), name


def test_every_action_is_pinned_to_a_version(workflow):
    uses = [s["uses"] for job in workflow["jobs"].values() for s in job["steps"] if "uses" in s]
    assert uses and all(re.search(r"@v\d+$", u) for u in uses)


def test_the_matrix_lists_real_profiles_each_on_a_runner_labelled_with_it(workflow):
    include = workflow["jobs"]["artifacts"]["strategy"]["matrix"]["include"]
    assert {e["profile"] for e in include} >= {"avx2", "avx512", "avx512_bf16"}
    for entry in include:
        assert entry["profile"] in BY_NAME
        assert entry["profile"] in entry["runner"]


def test_every_archive_call_uses_options_archive_sh_accepts(workflow):
    calls = [run for job in workflow["jobs"].values() for run in _runs(job) if "./archive.sh" in run]
    assert len(calls) == 2
    for run in calls:
        parse_args(_archive_argv(run))  # argparse exits on an unknown option


def test_artifacts_are_built_for_the_archived_model_and_published(workflow):
    mar = parse_args(_archive_argv(next(r for r in _runs(workflow["jobs"]["mar"]) if "./archive.sh" in r)))
    aot = parse_args(_archive_argv(next(r for r in _runs(workflow["jobs"]["artifacts"]) if "./archive.sh" in r)))
    assert aot.model_name == mar.model_name and aot.cpu_profile == "X" and aot.aot_store == "X"
    assert workflow["jobs"]["artifacts"]["needs"] == "mar"


def test_published_artifacts_are_signed_with_a_key_written_before(workflow):
    steps = workflow["jobs"]["artifacts"]["steps"]
    archive = next(i for i, s in enumerate(steps) if "./archive.sh" in s.get("run", ""))
    key_file = parse_args(_archive_argv(steps[archive]["run"])).signing_key
    assert key_file.endswith(".pem")
    writes = [s for s in steps[:archive] if key_file in s.get("run", "")]
    assert len(writes) == 1 and "umask 077" in writes[0]["run"]  # private: the runner's other users cannot read it
    assert "secrets." in next(iter(writes[0]["env"].values()))
