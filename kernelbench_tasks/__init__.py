"""KernelBench-format tasks written for KernelZero, the API catalog, and the synthetic pair generator.

    level1/NNN_Name.py   single operations (matmuls, activations, reductions, norms, pooling, convs, scans, losses,
                         attention, a few fp16/bf16 variants); held out: never trained on
    level2/NNN_Name.py   fusions (GEMM/conv epilogues, attention blocks, residual chains, norm modulation, ...)
    solutions/levelN/    golden CUDA and Triton solutions for some of the tasks
    catalog.py           the torch APIs the Proposer samples from (kernelzero.py's Proposer phase)
    synth.py             verified synthetic (module, kernel) pairs for the SFT warm start

Each task defines `class Model(nn.Module)`, `get_inputs()` (CPU tensors) and `get_init_inputs()`; sizes are
module-level globals. `task_files(level)` lists a level's task paths in order; check them with
`python eval_harness.py lint kernelbench_tasks/level1/*.py`. `held_out_hashes()` is what keeps generated modules
(synthetic pairs, the Proposer's modules) from being a held-out task at other sizes.
"""
import os

TASKS_DIR = os.path.dirname(os.path.abspath(__file__))


def task_files(level: int) -> list[str]:
    """Sorted paths of level `level`'s task files (NNN_Name.py)."""
    d = os.path.join(TASKS_DIR, f"level{level}")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f[:3].isdigit() and f.endswith(".py"))


def held_out_hashes(levels=(1, 2)) -> set[str]:
    """Size-independent normalised hashes of the level tasks: a module whose
    catalog.normalized_source_hash(src, ignore_constants=True) is in this set is a held-out task (maybe resized)."""
    from kernelbench_tasks.catalog import normalized_source_hash
    hashes = set()
    for level in levels:
        for path in task_files(level):
            with open(path) as f:
                hashes.add(normalized_source_hash(f.read(), ignore_constants=True))
    return hashes
