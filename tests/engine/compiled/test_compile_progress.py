from handler.engine.compiled.compile_progress import CompileProgress, SideBySide


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
                    "time estimates follow")


def _side_by_side() -> SideBySide:
    return SideBySide(("here", "beside"), start=1000.0, expected={"here": 50.0, "beside": 100.0}, basis="the reference")


def test_side_by_side_estimate_is_the_slowest_expected_part_less_the_time_so_far():
    line = _side_by_side().line(now=1030.0)
    assert line == ("compiling graphs side by side: 0 of 2 done, 30 s so far; "
                    "about 70 s left (estimated from the reference)")


def test_a_part_done_later_than_expected_stretches_the_others_alike():
    progress = _side_by_side()
    progress.finished("here", now=1075.0)  # 1.5x its 50 s
    assert progress.left(now=1075.0) == 75.0  # 1.5 x 100 s, 75 s of it gone


def test_past_the_estimate_it_says_so_instead_of_a_negative_time():
    assert _side_by_side().line(now=1200.0).endswith("; finishing, later than estimated")


def test_all_parts_done_is_just_the_count():
    progress = _side_by_side()
    progress.finished("here", now=1040.0)
    progress.finished("beside", now=1090.0)
    assert progress.line(now=1091.0) == "compiling graphs side by side: 2 of 2 done, 91 s so far"
