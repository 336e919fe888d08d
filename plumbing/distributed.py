"""
torchrun and FSDP2: the ranks, their share of a phase's rows, the collectives, this process's device and harness,
the sharded model and its optimizer step. Without torchrun there is no process group: world() is 1, my_rows() is
every row, the collectives return their input and idle_passes() is 0, so a one-process run is the plain program.

How this departs from a plain torchrun + FSDP2 setup:
1. Each rank generates and verifies its own share of a phase's rows (my_rows) on its own GPU and its share of the
   CPU cores (open_evaluator); the verdicts and texts are gathered (gather_rows), so group statistics, rewards and
   pool updates are those of a one-process run.
2. FSDP2 gathers the weights in every forward and reduces the gradients in every backward, so every rank must run as
   many of them as the others: a rank with fewer rows adds passes on blank rows of weight 0 (idle_passes).
3. A NaN or inf gradient norm skips the optimizer step instead of reaching every weight (optimizer_step).
4. A phase's sampling seed is a function of the run's seed, the round and the phase (phase_seed), so a resumed run
   and a run on more ranks draw the same samples.

kernelzero.py and the other plumbing modules import it; it imports none of them. `cfg` below is a kernelzero.Config.
"""

import math
import os
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist

from eval_harness import Evaluator

# -----------------------------------------------------------------------------
# Ranks: one process per GPU, each with its share of a phase's rows


def world():
    return dist.get_world_size() if dist.is_initialized() else 1


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def my_rows(n):
    """This rank's contiguous share of n rows (sizes differ by at most one): 10 rows on 4 ranks are 2, 3, 2, 3."""
    return slice(n * rank() // world(), n * (rank() + 1) // world())


def gather_rows(items):
    """Every rank's list, concatenated in rank order (the inverse of my_rows): all ranks get the whole batch's
    verdicts and texts, so group statistics, rewards and pool updates are those of a one-process run."""
    if world() == 1:
        return list(items)
    parts = [None] * world()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def _reduce(values, op):
    if world() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")   # (NCCL reduces GPU tensors only)
    dist.all_reduce(t, op=op)
    return t.tolist()


def all_sum(values):
    """[float] summed elementwise over ranks."""
    return _reduce(values, dist.ReduceOp.SUM)


def all_max(value):
    """The largest of every rank's float."""
    return _reduce([value], dist.ReduceOp.MAX)[0]


def barrier():
    if world() > 1:
        dist.barrier()


def idle_passes(n, size):
    """How many forward/backward passes without rows of its own this rank, with n rows in microbatches of `size`,
    adds so that it runs as many as the rank with the most: FSDP2 gathers weights in every forward and reduces
    gradients in every backward, so every rank must run the same number of them. 0 in one process. E.g. microbatches
    of 4: a rank with 5 rows (2 microbatches) next to one with 9 (3): 1; a rank with no rows: 3."""
    own = -(-n // size)   # (ceil)
    return int(all_max(own)) - own


def pad_rows(t, n, value=0):
    """t (N, ...) with n more rows of `value`: the blank rows of idle_passes (their outputs are dropped or weigh 0)."""
    return torch.cat([t, t.new_full((n, *t.shape[1:]), value)]) if n else t


def say(*args, **kwargs):
    """print on rank 0 only: one console, however many ranks."""
    if rank() == 0:
        print(*args, **kwargs)


# -----------------------------------------------------------------------------
# This process's device and harness


def resolve_device(cfg):
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is visible; use --device cpu (and --backend triton)")
    return torch.device(cfg.device)


def setup_ranks(cfg):
    """This process's device. Under torchrun (it sets LOCAL_RANK, RANK, WORLD_SIZE): one GPU per rank and NCCL, or
    gloo for ranks on the CPU (the tests); a collective waits at most cfg.dist_timeout_s, so a rank that died or
    hangs ends the job with an error instead of a hang. Without torchrun: resolve_device, no process group."""
    device = resolve_device(cfg)
    if "LOCAL_RANK" not in os.environ or dist.is_initialized():
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=cfg.dist_timeout_s))
    return device


def open_evaluator(cfg, harness_device, device, **opts):
    """The harness for this process: every GPU without torchrun, this rank's own GPU under it (timing stays fair per
    GPU), and the CPU cores shared out between the ranks."""
    workers = cfg.eval_workers or (None if world() == 1 else max(1, len(os.sched_getaffinity(0)) // world()))
    gpus = [device.index] if device.index is not None else None
    return Evaluator(backend=cfg.backend, device=harness_device, cpu_workers=workers, gpus=gpus,
                     gpu_workers=cfg.gpu_workers, **opts)


def harness_device_for(cfg, device):
    if cfg.backend == "cuda" and not torch.cuda.is_available():
        raise SystemExit("the CUDA backend needs a GPU: pass --backend triton to run Triton kernels under the interpreter")
    return "cuda" if torch.cuda.is_available() and device.type == "cuda" else "cpu"



def phase_seed(cfg, round_, phase):
    """The seed of one phase's sampling (rollout adds each generate call's first prompt index): a function of the
    run's seed, the round and the phase, so that a resumed run and a run on more ranks draw the same samples."""
    return zlib.crc32(f"{cfg.seed}/{round_}/{phase}".encode())


# -----------------------------------------------------------------------------
# FSDP2: the sharded model and its optimizer step


def shard_model(model, device):
    """FSDP2 (torch.distributed.fsdp.fully_shard), the way PyTorch's own recipes apply it: each transformer block is
    one unit (its weights gathered just before it runs, its gradients reduce-scattered right after), and the root
    holds the rest (embeddings, final norm, lm_head, tied or not). Frozen weights (LoRA's base) are sharded too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world(),))
    for block in model.modules():
        if type(block).__name__.endswith("DecoderLayer"):   # (Qwen2DecoderLayer, LlamaDecoderLayer, ...)
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_tensor(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t   # (FSDP2: gather the shards)


def optimizer_step(policy, max_norm):
    """Clip the gradients to max_norm, then take the AdamW step unless their norm is not finite: a NaN or inf
    gradient would reach every weight through the clip factor (max_norm / NaN) and AdamW's moments, so that step is
    skipped and the run goes on (verl's actor does the same). Returns the pre-clip norm (all ranks' under FSDP2)."""
    norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_norm)))   # (frozen: no grad)
    if math.isfinite(norm):
        policy.opt.step()
    else:
        say(f"warning: non-finite gradient norm ({norm}); this optimizer step was skipped")
    return norm

