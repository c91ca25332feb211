"""Fixtures for the test doubles' own tests: the sidecar tests' emulator and fake clock."""

from tests.sidecar.conftest import FakeClock, clock, emulator, emulator_with_clock

__all__ = ["FakeClock", "clock", "emulator", "emulator_with_clock"]
