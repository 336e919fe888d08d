"""Two-API modules composed from the catalog: SFT targets for the Proposer beyond the templated corpus.

What it is. The Proposer is asked, every round, for one module that uses a set of two catalog APIs. Its SFT corpus
(synth.py) covers the five templated families only, and a Proposer trained on it alone misuses the APIs it never saw
there (measured on the CPU: 8 of 32 modules passed the (values, indices) pair of torch.cummin or torch.topk on as a
tensor). Here each of the catalog's APIs is composed with another one: the first's call on its example inputs, the
second's call on that result (its other inputs: new inputs of the result's shape). Every composition is checked by
the task linter (on the CPU, at the small example sizes); the ones that pass are listed in
sft_data/proposer_compositions.json, and the trainer renders them at the device's size (`elements`, as the prompt's
examples are) for the Proposer's SFT.

How it departs from KernelZero.
    1. The paper's Proposer warm start is not public; this is our own construction, correct by construction and
       linted, like synth.py's corpus.
    2. Only chains (first -> second) are composed, and only where the second API's inputs all share its first
       input's example shape (elementwise, norms, reductions, scans, pooling, ...): a second matmul or a loss with
       integer targets would need shapes the first's output does not give.

Run it (deterministic from --seed):
    python -m kernelbench_tasks.compose --n 600 --seed 0 --out kernelbench_tasks/sft_data/proposer_compositions.json
"""
import argparse
import dataclasses
import json
import os
import random
import re

import torch

from kernelbench_tasks import catalog


# ---------------------------------------------------------------------------------------------------------------------
# One composition

COMPOSITIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_data", "proposer_compositions.json")
EXTRA_NAMES = ("u", "v", "w")   # the second API's other inputs (the first API's are named x, y, z by the catalog)
MAX_INPUT_BYTES = 512 * 2 ** 20   # the task linter's limit (max_input_mb)


def _renamed(call, names, op):
    """A call template with its input names replaced (`names`: old -> new) and its module `self.op` renamed."""
    if names:
        call = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", lambda m: names[m.group(1)], call)
    return call.replace("self.op", op)


def _shape_of(first, shapes):
    """The shape of the first API's call on inputs of `shapes` (run on the meta device: nothing is allocated)."""
    namespace, inputs = catalog.on_meta(_module(first, None, shapes, None, []))
    with torch.device("meta"):
        out = namespace["Model"]()(*inputs)
    return list(out.shape) if isinstance(out, torch.Tensor) else None


def _module(first, second, shapes, h_shape, extras):
    """Source of the module: `first` on inputs of `shapes`, then `second` (None: first alone) on its result."""
    a = catalog.lookup(first)
    inputs = [catalog._input_expr(s, a["domains"].get(n, "normal"), "float32") for n, s in zip(a["inputs"], shapes)]
    args = list(a["inputs"])
    init = [_renamed(a["init"], {}, "self.op1")] if a["init"] else []
    body = [f"h = {_renamed(a['call'], {}, 'self.op1')}"]
    if second is None:
        body.append("return h")
        title = first
    else:
        b = catalog.lookup(second)
        names = {b["inputs"][0]: "h", **{n: e for n, e in zip(b["inputs"][1:], extras)}}
        init += [_renamed(b["init"], {}, "self.op2")] if b["init"] else []
        body.append(f"return {_renamed(b['call'], names, 'self.op2')}")
        args += extras
        inputs += [catalog._input_expr(h_shape, b["domains"].get(n, "normal"), "float32") for n in b["inputs"][1:]]
        title = f"{first} -> {second}"
    lines = "".join(f"\n        {line}" for line in init)
    return (f'"""{title}, rank {len(shapes[0])}, float32."""\n'
            "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
            "class Model(nn.Module):\n"
            f"    def __init__(self):\n        super().__init__(){lines}\n\n"
            f"    def forward(self, {', '.join(args)}):\n" + "".join(f"        {line}\n" for line in body) + "\n\n"
            f"def get_inputs():\n    return [{', '.join(inputs)}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def composable(second):
    """Can `second` take another API's output as its first input: all its inputs share that input's example shape."""
    b = catalog.lookup(second)
    return all(len({tuple(s) for s in shapes}) == 1 for shapes in b["example_shapes"].values())


def composed_module(first, second, rank, elements=0):
    """Source of the module `first -> second` at `rank`, the first's inputs at about `elements` values
    (catalog.scaled_shapes; 0: the example sizes), halved until all inputs fit the linter's 512 MB (the second's
    other inputs take the first's output shape, 4x its input after an upsampling); None where the first's output
    does not suit the second.

    composed_module("torch.cummin", "torch.nn.functional.relu", 2) ->
        def forward(self, x):
            h = torch.cummin(x, dim=-1).values
            return F.relu(h)
    """
    b = catalog.lookup(second)
    while True:
        shapes = catalog.scaled_shapes(catalog.lookup(first), rank, elements)
        try:
            h_shape = _shape_of(first, shapes)
        except Exception:
            return None
        if h_shape is None or len(h_shape) not in b["ranks"] or len(b["inputs"]) - 1 > len(EXTRA_NAMES):
            return None
        src = _module(first, second, shapes, h_shape, list(EXTRA_NAMES[:len(b["inputs"]) - 1]))
        if elements <= 1 or sum(x.numel() * x.element_size() for x in catalog.on_meta(src)[1]) <= MAX_INPUT_BYTES:
            return src
        elements //= 2


def proposer_targets(elements=0, path=COMPOSITIONS):
    """[(apis, module source)] of the listed compositions, rendered at `elements` (the trainer's Proposer SFT)."""
    with open(path) as f:
        listed = json.load(f)["compositions"]
    rendered = [(c["apis"], composed_module(*c["apis"], c["rank"], elements)) for c in listed]
    return [(apis, src) for apis, src in rendered if src]


# ---------------------------------------------------------------------------------------------------------------------
# Drawing and linting compositions

def draw_compositions(n, seed, workers=None):
    """Up to n distinct (first, second, rank) compositions that pass the task linter on the CPU, drawn from
    catalog.sample_api_set pairs (random order, a rank both accept), every catalog API first in turn so that each
    appears; never a held-out task's structure. Returns ([{"apis": [first, second], "rank": r}], stats)."""
    from eval_harness import lint_tasks
    from kernelbench_tasks.synth import level_task_hashes
    rng, held_out = random.Random(seed), level_task_hashes()
    candidates, seen = [], set()
    for attempt in range(20 * n):
        first = catalog.CATALOG[attempt % len(catalog.CATALOG)]
        pair = catalog.sample_api_set(rng, 2, {first["name"]: 1e6})   # (first is drawn first, almost surely)
        if len(pair) < 2 or pair[0] is not first:
            continue
        second = pair[1]
        ranks = sorted(set(first["example_shapes"]) & set(second["example_shapes"]) & set(second["ranks"]))
        if not ranks or not composable(second["name"]):
            continue
        key = (first["name"], second["name"], rng.choice(ranks))
        src = composed_module(*key) if key not in seen else None
        seen.add(key)
        if src and catalog.normalized_source_hash(src) not in held_out:
            candidates.append((key, src))
        if len(candidates) >= 2 * n:
            break
    reports = lint_tasks([src for _, src in candidates], device="cpu", workers=workers)
    kept = [{"apis": list(key[:2]), "rank": key[2]} for (key, _), r in zip(candidates, reports) if r["ok"]][:n]
    failed = [r["problems"][0].split(":")[0] for r in reports if not r["ok"]]
    return kept, {"candidates": len(candidates), "ok": sum(r["ok"] for r in reports), "kept": len(kept),
                  "failures": {k: failed.count(k) for k in sorted(set(failed))}}


@dataclasses.dataclass
class Config:
    n: int = 600  # compositions to keep
    seed: int = 0  # the draw's seed
    out: str = "kernelbench_tasks/sft_data/proposer_compositions.json"  # where the list goes
    workers: int = 0  # lint worker processes (0: every core)


def main(cfg):
    print(json.dumps(dataclasses.asdict(cfg)))
    kept, stats = draw_compositions(cfg.n, cfg.seed, cfg.workers or None)
    with open(cfg.out, "w") as f:
        json.dump({"config": dataclasses.asdict(cfg), "stats": stats, "compositions": kept}, f, indent=0)
    print(json.dumps(stats))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(Config):
        parser.add_argument(f"--{field.name}", type=field.type, default=field.default)
    main(Config(**vars(parser.parse_args())))
