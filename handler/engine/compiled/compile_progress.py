"""What a cold compile tells the person waiting for it: which graph, how many are left, and
about how long, estimated from the graphs compiled so far (each takes minutes on 2 cores) or, for
graphs compiling side by side, from what such a compile took before (SideBySide)."""
from __future__ import annotations

from dataclasses import dataclass, field

MARKER = "compiling graph"  # starts each progress line: serve.sh finds the latest in the worker log


@dataclass
class CompileProgress:
    expected: int  # graphs expected in all; the coverage loop (aot.py) may find it needs more
    seconds: list[float] = field(default_factory=list)  # what each compiled graph took
    # Graphs compiled side by side in processes of their own (handler.engine.compiled.cold.side_by_side):
    # the number of this process's first graph among all, and how many compile beside it.
    first: int = 1
    beside: int = 0

    @property
    def total(self) -> int:
        return max(self.expected, self.first + len(self.seconds))

    def starting(self, what: str) -> str:
        """The line logged as this process's next graph starts compiling."""
        n = self.first + len(self.seconds)
        if self.beside:
            return (f"{MARKER} {n} of {self.total} ({what}), side by side with {self.beside} more in processes "
                    f"of their own; time estimates follow")
        if not self.seconds:
            return f"{MARKER} {n} of {self.total} ({what}); a time estimate follows the first graph"
        left = sum(self.seconds) / len(self.seconds) * (self.total - n + 1)
        return f"{MARKER} {n} of {self.total} ({what}); about {_duration(left)} left"

    def finished(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@dataclass
class SideBySide:
    """Parts (str(side_by_side.Part)) compiling side by side, as one progress line: how many
    are done, and about how long until the last is, from `expected` (each part's seconds from the
    start, handler.engine.compiled.cold.compile_times) scaled by how the parts that are done compared with it."""
    parts: tuple[str, ...]
    start: float  # time.monotonic() as the parts started
    expected: dict[str, float]
    basis: str  # where `expected` comes from, for the line
    done: dict[str, float] = field(default_factory=dict)  # seconds from start to each part's end

    def finished(self, part: str, now: float) -> None:
        self.done[part] = now - self.start

    def left(self, now: float) -> float:
        """Seconds until the last part is done (<= 0: later than expected)."""
        scale = max((self.done[p] / self.expected[p] for p in self.done), default=1.0)
        pending = [self.expected[p] * scale for p in self.parts if p not in self.done]
        return max(pending, default=0.0) - (now - self.start)

    def line(self, now: float) -> str:
        head = (f"{MARKER}s side by side: {len(self.done)} of {len(self.parts)} done, "
                f"{_duration(now - self.start)} so far")
        if len(self.done) == len(self.parts):
            return head
        left = self.left(now)
        if left <= 0:
            return f"{head}; finishing, later than estimated"
        return f"{head}; about {_duration(left)} left (estimated from {self.basis})"
