"""A walk of one request through `handler/serving/`: the modules its calls enter, in order
(docs/architecture.md, "One request's walk").

A stop is a call from one serving module into another; stops in a row at one module are one stay.
The stages are the batching mode's module and the lifecycle's (admit, start, step, reply, end);
every other serving module is a helper of the stage whose stay called it (protocol under
admission, formats under the reply). A return is a stay at a stage the walk had left, or a
helper called under two stages."""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SERVING = Path(__file__).resolve().parents[2] / "handler" / "serving"
STAGES = {"continuous_service.py", "dynamic_service.py", "loop_service.py", "lifecycle/admit.py", "lifecycle/start.py",
          "lifecycle/step.py", "lifecycle/reply.py", "lifecycle/end.py"}


@dataclass(frozen=True)
class Walk:
    stops: tuple[tuple[str, str], ...]  # (module, the stage it was called under), a stay each

    @property
    def stays(self) -> list[str]:
        return [module for module, _ in self.stops]

    @property
    def returns(self) -> list[str]:
        seen: dict[str, str] = {}  # module -> the stage it was first called under
        back = []
        for i, (module, stage) in enumerate(self.stops):
            if module in STAGES and module in self.stays[:i]:
                back.append(module)
            elif module not in STAGES and seen.setdefault(module, stage) != stage:
                back.append(f"{module} (under {seen[module]} and {stage})")
        return back


def walk(call: Callable[[], object]) -> Walk:
    """Run `call` on this thread, recording every call from one serving module into another."""
    stops: list[tuple[str, str]] = []

    def profile(frame, event, _arg):
        if event == "call" and _from_another_file(frame) and (module := _serving_module(frame)) is not None:
            stop = (module, _stage(frame))
            if not stops or stops[-1] != stop:
                stops.append(stop)
        return profile

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return Walk(tuple(stops))


def _from_another_file(frame) -> bool:
    return frame.f_back is not None and frame.f_back.f_code.co_filename != frame.f_code.co_filename


def _serving_module(frame) -> str | None:
    path = Path(frame.f_code.co_filename)
    return path.relative_to(SERVING).as_posix() if path.is_relative_to(SERVING) else None


def _stage(frame) -> str:
    """The nearest stage on the stack, this frame's own module first."""
    while frame is not None:
        if (module := _serving_module(frame)) in STAGES:
            return module
        frame = frame.f_back
    return "outside serving"
