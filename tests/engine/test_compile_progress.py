from handler.engine.compile_progress import CompileProgress


def test_first_graph_has_no_estimate_yet():
    line = CompileProgress(expected=4).starting("prefill")
    assert line.startswith("compiling graph 1 of 4 (prefill)") and "estimate follows" in line


def test_estimate_is_the_mean_so_far_times_the_graphs_left():
    progress = CompileProgress(expected=4)
    progress.finished(100.0)
    progress.finished(20.0)
    assert progress.starting("decode").endswith("graph 3 of 4 (decode); about 2 min left")  # 60 s x 2


def test_more_graphs_than_expected_raise_the_total():
    progress = CompileProgress(expected=1)
    progress.finished(30.0)
    assert progress.starting("decode") == "compiling graph 2 of 2 (decode); about 30 s left"


def test_graphs_side_by_side_are_numbered_as_one_compile_without_an_estimate():
    line = CompileProgress(expected=3, first=2, beside=2).starting("prefill")
    assert line == ("compiling graph 2 of 3 (prefill), side by side with 2 more in processes of their own; "
                    "they finish about together")
