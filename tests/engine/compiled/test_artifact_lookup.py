"""What a worker looks for, and the lookup of the background path, made before its model is prepared."""
from __future__ import annotations

from pathlib import Path

import pytest

from handler.engine.compiled import artifact_lookup, artifacts
from handler.engine.compiled.artifact_lookup import ArtifactRequest, artifact_request, look_up_in_background
from handler.engine.compiled.artifacts import ArtifactPlaces
from handler.engine.compiled.errors import CompileError
from handler.engine.compiled.steps import build_steps
from handler.engine.config import EngineConfig
from tests.support.tiny_model import tiny_transformer

NO_CHECKPOINT = Path("never-read")


def config(**fields) -> EngineConfig:
    return EngineConfig(NO_CHECKPOINT, dtype="float32", packed_weights="off", max_batch_size=2, max_seq_len=32, **fields)


@pytest.fixture
def started(monkeypatch) -> list[Path]:
    """The compile processes look_up_in_background starts, recorded (their dest) instead of started."""
    dests: list[Path] = []

    def start(cfg, key, dest):
        dests.append(dest)
        return f"process for {dest}"

    monkeypatch.setattr(artifact_lookup, "start_compile_process", start)
    return dests


def request(cache_dir: Path | None) -> ArtifactRequest:
    return ArtifactRequest(artifacts.artifact_key(config(), "0" * 64), ArtifactPlaces(cache_dir=cache_dir))


def test_no_artifact_places_means_no_artifact_request():
    assert artifact_request(None, config(), None, None) is None


def test_a_configuration_aot_cannot_serve_requests_no_artifact(caplog):
    places = ArtifactPlaces(cache_dir=Path("aot"))
    assert artifact_request(None, config(freezing=True), places, None) is None
    assert "compile artifacts are not used: freezing: true" in caplog.text


def test_only_the_background_path_with_a_cache_dir_looks_up_early(tmp_path, started):
    assert look_up_in_background(config(warm_start="blocking"), request(tmp_path / "aot")) is None
    assert look_up_in_background(config(warm_start="background"), request(None)) is None
    assert look_up_in_background(config(warm_start="background"), None) is None
    assert started == []


def test_with_no_artifact_the_compile_process_starts_at_once(tmp_path, started):
    found = look_up_in_background(config(warm_start="background"), request(tmp_path / "aot"))
    assert found.found is None and found.error is None
    assert found.compiling == f"process for {tmp_path / 'aot'}" and started == [tmp_path / "aot"]


def test_a_verified_artifact_is_found_and_nothing_compiles(tmp_path, started):
    wanted = request(tmp_path / "aot")
    artifacts.install(lambda staged: (staged / "graphs.json").write_text("{}"), wanted.key, tmp_path / "aot")
    found = look_up_in_background(config(warm_start="background"), wanted)
    assert found.found == tmp_path / "aot" and found.compiling is None and started == []


def test_a_failed_lookup_is_kept_for_build_steps_to_judge(tmp_path, monkeypatch):
    def broken(wanted):
        raise OSError("cache volume gone")

    monkeypatch.setattr(artifact_lookup, "find_verified", broken)
    wanted = request(tmp_path / "aot")
    kept = look_up_in_background(config(warm_start="background"), wanted)
    assert isinstance(kept.error, OSError)
    model = tiny_transformer(pages=4, max_seq_len=32)
    with pytest.raises(CompileError, match="cache volume gone"):
        build_steps(model, config(warm_start="background"), artifacts_wanted=wanted, lookup=kept)
    reasons = []
    steps = build_steps(model, config(warm_start="background", on_compile_error="eager"), reasons.append,
                        artifacts_wanted=wanted, lookup=kept)
    assert steps.mode == "eager" and reasons == ["OSError: cache volume gone"]


def test_the_key_names_the_threads_the_graphs_guard_on():
    # a graph compiled for 2 threads refuses a worker of 4 (NoMatchingGraph at its first request):
    # each thread count has an artifact of its own
    two, four = (artifacts.artifact_key(config(), "0" * 64, threads) for threads in (2, 4))
    assert two.digest() != four.digest()
    assert artifacts.artifact_key(config(), "0" * 64, 2).digest() == two.digest()
