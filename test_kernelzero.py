"""KernelZero tests. CPU by default (Triton under the interpreter, tiny models); tests marked `gpu` need a CUDA GPU
and skip without one.

    python -m pytest -q test_kernelzero.py            # everything; on the CPU the gpu tests skip (what CI runs)
    python -m pytest -q -m gpu test_kernelzero.py     # the GPU tests, on the GPU machine
    python -m pytest -q test_kernelzero.py -k tasks   # a subset by name (harness, cudabuild, tasks, solutions,
                                                      # trainer, bench, named_model, newcomer, replication,
                                                      # distributed)

This file is the index: the suites live in tests/ (modules not named test_*.py, so pytest collects each test once,
here) and are star-imported below, so that every test's node id is test_kernelzero.py::<name>. Without a CUDA GPU,
importing the tests package sets TRITON_INTERPRET=1 before anything imports triton (tests/__init__.py).

Suites, in this order:
  tests/harness.py             eval_harness.py, harness/processes.py and the worker side: known-good candidates,
                               anti reward hacking (a case per pitfall), isolation (timeouts, crashes, no processes
                               left), the GPU gate, lint, CLI, GPU tests
  tests/graph_timing.py        the graph timing's replays that do nothing: poisoned outputs, the bandwidth floor
  tests/cuda_ext.py            cuda_ext/: fast_load_inline and the bench generators' candidates
  tests/tasks.py               kernelbench_tasks/: task library, API catalog, golden solutions, synthetic pairs
  tests/loss.py                the pure functions: advantages, the clipped surrogate loss, CA-GRPO rewards, the frontier
                               reward (kernelzero.py), masking, metrics (pass@k and fast_p from plumbing/report.py)
  tests/trainer.py             kernelzero.py's trainer: the phases on fakes (ablations), models, tokenizer, rollout
                               and update on the tiny model, LoRA, attention, config and CLI, the loop, eval, GPU
                               tests
  tests/bench.py               bench.py: attention, rollout, train and the processes section on the CPU
  tests/named_models.py        named offline models (GGUF slices installed as fake packages)
  tests/harness_throughput.py  harness throughput: memory admission, workers booted ahead
  tests/newcomer.py            what a newcomer meets first: flag errors, console messages, plots, the harness CLI
  tests/replication.py         replication: held-out statistics, compare, greedy eval, the self-distilled corpus
  tests/distributed.py         torchrun on the CPU (gloo): 2 ranks and 1 rank give the one-process round (LoRA
                               too), resume on another world size, a dying rank ends the job; the one-rank NCCL run
                               on a GPU
Shared task sources, candidates, the pitfall table and helpers: tests/common.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the repository root: its modules and tests/
import tests  # noqa: E402,F401  (first: the environment set-up, TRITON_INTERPRET before anything imports triton)

from tests.harness import *  # noqa: E402,F401,F403
from tests.graph_timing import *  # noqa: E402,F401,F403
from tests.cuda_ext import *  # noqa: E402,F401,F403
from tests.tasks import *  # noqa: E402,F401,F403
from tests.loss import *  # noqa: E402,F401,F403
from tests.trainer import *  # noqa: E402,F401,F403
from tests.bench import *  # noqa: E402,F401,F403
from tests.named_models import *  # noqa: E402,F401,F403
from tests.harness_throughput import *  # noqa: E402,F401,F403
from tests.newcomer import *  # noqa: E402,F401,F403
from tests.replication import *  # noqa: E402,F401,F403
from tests.distributed import *  # noqa: E402,F401,F403
