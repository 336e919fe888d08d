"""KernelZero's tests, one file per topic. CPU by default (Triton under the interpreter, tiny models); tests marked
`gpu` need a CUDA GPU and skip without one.

    python -m pytest -q tests                      # everything; on the CPU the gpu tests skip (what CI runs)
    python -m pytest -q -m gpu tests               # the GPU tests, on the GPU machine
    python -m pytest -q tests/test_harness.py      # one topic; or -k NAME for a subset by name

  test_harness.py             eval_harness.py and the package harness/: known-good candidates, anti reward hacking
                              (a case per pitfall), isolation (timeouts, crashes, no processes left), the typed
                              verdict and forged answers, the GPU gate, lint, CLI, GPU tests
  test_graph_timing.py        the graph timing's replays that do nothing: poisoned outputs, the bandwidth floor
  test_harness_throughput.py  harness throughput: memory admission, workers booted ahead, trial inputs on the GPU
  test_reference_server.py    a task's reference server: the verdicts of private trials, a write to the shared
                              inputs seen and put back, a correct verdict only on the server's findings
  test_cuda_ext.py            cuda_ext/: fast_load_inline and the bench generators' candidates
  test_tasks.py               kernelbench_tasks/: task library, API catalog, golden solutions, synthetic pairs
  test_loss.py                kernelzero.py's copyable block: advantages, the clipped surrogate loss, CA-GRPO rewards,
                              the frontier reward, masking; metrics (pass@k and fast_p from plumbing/report.py)
  test_trainer.py             kernelzero.py's trainer: the phases on fakes (ablations), models, tokenizer, rollout
                              and update on the tiny model, LoRA, attention, config and CLI, the loop, eval, GPU tests
  test_bench.py               bench.py: attention, rollout, train and the processes section on the CPU
  test_named_models.py        named offline models (GGUF slices installed as fake packages)
  test_newcomer.py            what a newcomer meets first: flag errors, console messages, plots, the harness CLI
  test_replication.py         replication: held-out statistics, compare, greedy eval, the self-distilled corpus
  test_distributed.py         torchrun on the CPU (gloo): 2 ranks and 1 rank give the one-process round (LoRA too),
                              resume on another world size, a dying rank ends the job; the one-rank NCCL run on a GPU
Shared task sources, candidates, the pitfall table and helpers: common.py (not collected: its name has no test_).

This package's import is the environment set-up, and pytest runs it before any test module (they are tests.test_*):
without a CUDA GPU, TRITON_INTERPRET=1 before anything imports triton (Triton kernels then run under the interpreter
on the CPU); the repository root on sys.path for eval_harness, kernelzero, bench, cuda_ext and kernelbench_tasks.
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports triton
