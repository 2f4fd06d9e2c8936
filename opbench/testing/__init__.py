"""Helpers shipped for tests and benchmarks (as MetaSchedule ships ``testing/local_rpc.py``)."""
