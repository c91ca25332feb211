"""Test doubles that run as real services: the cloud metadata emulator (metadata_emulator.py,
its state in metadata_state.py) and moto's S3 server (moto.py), for the tests and the
benchmarks (the chaos drill, the startup run).

Nothing in the serving or spot path imports this package; tests/testing/test_testing_isolation.py
scans handler/ to keep it so.
"""
