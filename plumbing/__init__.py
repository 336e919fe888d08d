"""The parts of the KernelZero trainer that a reader of the method does not need: kernelzero.py is the method, top to
bottom in the order it runs, and imports these; none of them imports kernelzero.

    distributed.py  torchrun and FSDP2: ranks and their rows, collectives, this process's device and harness, the
                    sharded model's optimizer step, the blank rows that keep ranks in step
    lora.py         LoRA adapters: wrapping, merging, the adapter file
    models.py       where the models come from (named offline models, the tiny test model, loading) and the
                    sampler's GQA-aware attention
    policy.py       the Policy: the trained model with its AdamW state, the sampler, the KL reference; making,
                    placing and refreshing it
    checkpoints.py  a run's files: atomic checkpoints that resume on any world size, the trained models, JSON files
    console.py      what a run prints and logs: the round line, the phase timers, metrics.jsonl, the summary
    evaluation.py   the held-out eval (pass@k with intervals, fast_p) and self-distillation: `eval` and `distill`
    report.py       numbers from files: pass@k, fast_p, bootstrap intervals, the `compare` and `plot` subcommands
    config.py       the command line's machinery: a flag per Config field, choices, ranges, checks before any work
"""
