"""harness/verdict.py: a verdict, the one typed object that goes from the worker to the caller.

A verdict is a KernelResult (eval_harness re-exports it: `from eval_harness import KernelResult`). The worker builds
it with verdict(), its pipe carries it to the parent (pickled: a dataclass of plain fields), run_job adds the
parent's timings to its details, and the caller gets that same object. The parent's own verdicts (a timeout, a
crash, a forged message, the static checks' and an unsupported backend's) are made by verdict() too.

The candidate runs in the worker and can write to its pipe, so what comes through there is checked before it is
believed: harness.processes.forged takes a result only with the key the parent sent with the job, and only if it is
well_formed (a KernelResult of exactly its fields, each of its type, `correct` exactly error_kind == "ok").

This module imports nothing of the harness; eval_harness, harness.processes and the worker side import it, so there
is no import cycle. It runs in a worker too, so to a candidate it is part of the harness (harness.static_checks bans
importing it, and the identity snapshot covers its functions).
"""
from __future__ import annotations
import dataclasses
from dataclasses import dataclass, field

ERROR_KINDS = ("ok", "format", "compile", "runtime", "mismatch", "timeout", "crash", "reward_hack", "unsupported")


@dataclass
class KernelResult:
    compiled: bool            # the candidate imported (and, for CUDA, its extension built)
    correct: bool             # exactly error_kind == "ok"
    error_kind: str           # one of ERROR_KINDS
    error: str = ""           # short, truncated message
    speedup: float | None = None         # reference median / candidate median (GPU timing only)
    runtime_ms: float | None = None      # candidate median
    ref_runtime_ms: float | None = None  # reference (eager) median
    compile_s: float | None = None       # import + build time of the candidate
    details: dict = field(default_factory=dict)  # trials, errors, checks fired, launches, coverage, timing means...


FIELDS = frozenset(f.name for f in dataclasses.fields(KernelResult))


def truncate(text: str, n: int = 1500) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n // 3] + "\n...\n" + text[-(2 * n) // 3:]


def verdict(kind: str, error: str = "", **fields) -> KernelResult:
    """The verdict of kind `kind` (one of ERROR_KINDS): `correct` is exactly kind == "ok", the error message is
    truncated, `compiled` is False unless given; other fields (speedup, details, ...) as given."""
    assert kind in ERROR_KINDS, kind
    fields["compiled"] = bool(fields.get("compiled", False))
    return KernelResult(correct=(kind == "ok"), error_kind=kind, error=truncate(error), **fields)


def well_formed(result) -> bool:
    """Whether `result` is a verdict as verdict() makes one: a KernelResult with exactly its fields, each of its
    type, error_kind one of ERROR_KINDS and `correct` exactly error_kind == "ok". (A result from a worker's pipe,
    where the candidate can write, is unpickled to whatever it says: harness.processes.forged asks this.)"""
    if type(result) is not KernelResult or set(vars(result)) != FIELDS:
        return False
    numbers = (result.speedup, result.runtime_ms, result.ref_runtime_ms, result.compile_s)
    return (type(result.error_kind) is str and result.error_kind in ERROR_KINDS
            and result.correct is (result.error_kind == "ok") and type(result.compiled) is bool
            and type(result.error) is str and type(result.details) is dict
            and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in numbers))
