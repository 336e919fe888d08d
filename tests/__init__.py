"""Test suites that test_kernelzero.py collects (CI runs `python -m pytest -q test_kernelzero.py`).

Each module here is star-imported by test_kernelzero.py, so pytest collects its tests (and fixtures) once, as items of
test_kernelzero.py; the modules are deliberately not named test_*.py, so pytest never collects them a second time.
Shared task sources, candidates and helpers live in tests/common.py.

This package's import is the environment set-up, and it runs before any of its modules: without a CUDA GPU,
TRITON_INTERPRET=1 before anything imports triton (Triton kernels then run under the interpreter on the CPU); the
repository root on sys.path for eval_harness, kernelzero, bench, cuda_ext and kernelbench_tasks.
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports triton
