"""Test suites that test_kernelzero.py collects (CI runs `python -m pytest -q test_kernelzero.py`).

Each module here is imported at the end of test_kernelzero.py, after its environment set-up (TRITON_INTERPRET on a
machine without a GPU), so its tests run under the same conditions. Shared task sources and helpers come from
`test_kernelzero` itself (imported inside the tests that need them).
"""
