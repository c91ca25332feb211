from __future__ import annotations

from pathlib import Path

from handler.torchserve.launch import with_paths_from


def test_files_the_config_names_are_made_absolute_from_its_directory(tmp_path):
    props = {"metrics_config": "metrics.yaml", "vmargs": "-Xmx2g -Dlog4j.configurationFile=log4j2.xml"}
    out = with_paths_from(props, tmp_path)
    assert out["metrics_config"] == str(tmp_path / "metrics.yaml")
    assert out["vmargs"] == f"-Xmx2g -Dlog4j.configurationFile={tmp_path / 'log4j2.xml'}"


def test_absolute_paths_uris_and_other_keys_are_kept(tmp_path):
    for path in ("/etc/ts/log4j2.xml", "file:///etc/ts/log4j2.xml"):
        props = {"vmargs": f"-Dlog4j.configurationFile={path}", "job_queue_size": "1000"}
        assert with_paths_from(props, tmp_path) == props


def test_the_repository_config_names_a_log_configuration_that_exists():
    repo = Path(__file__).parents[2]
    from handler.torchserve.launch import read_properties

    vmargs = with_paths_from(read_properties(repo / "config.properties"), repo)["vmargs"]
    assert Path(vmargs.removeprefix("-Dlog4j.configurationFile=")).is_file()
