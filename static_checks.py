"""
The harness's static checks: what it rejects in a candidate's source before running anything (parse only, nothing
is executed), in the parent process. eval_harness._precheck turns a hit into a `reward_hack` verdict whose
details["check"] names the rule, and a source that is not a candidate of the backend at all into `format`.

How this departs from KernelBench's eval (which has no static check):
1. The rules target the known ways a model games kernel benchmarks (the pitfalls table in eval_harness.py's
   docstring): threads and processes, side streams, TF32 switches, tensor subclasses and __torch_function__,
   torch.compile (inductor would write the kernels), introspection that reaches the harness's stored reference
   outputs, assignments into torch / the harness / timers (monkey-patching), dynamic code, and an `except` branch
   that silently falls back to torch.
2. Names are resolved through the candidate's imports (`import torch.cuda as tc; tc.Stream` is torch.cuda.Stream),
   but not through assignments (`_t = torch; _t.relu = slow`): the worker's identity snapshot catches those at run
   time. A static check is a first line; every rule here also has a run-time check or cannot matter at run time.

Use:
    from static_checks import import_aliases, static_check
    static_check(tree, import_aliases(tree))   # ("threads", "imports threading") or None
"""

import ast
import re

# The harness's modules that run in a candidate's process (a worker): importing one, or assigning into it, is a
# monkeypatch; the worker's identity snapshot (harness_instrumentation._harness_snapshot) covers their functions
HARNESS_MODULES = ("eval_harness", "harness_processes", "harness_worker", "harness_compare", "harness_timing",
                   "harness_instrumentation")
BANNED_IMPORTS = {  # module root -> check name
    "threading": "threads", "_thread": "threads", "concurrent": "threads", "asyncio": "threads",
    "multiprocessing": "processes", "subprocess": "processes", "ctypes": "ctypes", "cffi": "ctypes",
    "inspect": "introspection", "importlib": "dynamic_code", "builtins": "monkeypatch",
    "static_checks": "monkeypatch", **{name: "monkeypatch" for name in HARNESS_MODULES},
    "gc": "introspection",   # gc reaches every live object, the harness's stored reference outputs among them
    "torch.multiprocessing": "processes", "torch.overrides": "torch_function",
    "torch.utils._python_dispatch": "torch_function", "torch._dynamo": "torch_compile", "torch._inductor": "torch_compile",
}
BANNED_NAMES = {  # dotted name (after resolving imports) -> check name
    "os.fork": "processes", "os.forkpty": "processes", "os.system": "processes", "os.popen": "processes",
    "os.posix_spawn": "processes", "os.posix_spawnp": "processes",
    "gc.get_objects": "introspection", "gc.get_referrers": "introspection", "gc.get_referents": "introspection",
    "sys._getframe": "introspection", "sys._current_frames": "introspection", "sys.settrace": "introspection",
    "sys.setprofile": "introspection", "sys.modules": "sys_modules",
    "torch.cuda.Stream": "side_stream", "torch.cuda.stream": "side_stream", "torch.cuda.ExternalStream": "side_stream",
    "torch.cuda.set_stream": "side_stream", "torch.set_float32_matmul_precision": "tf32",
    "torch.Tensor._make_subclass": "tensor_subclass", "torch.Tensor._make_wrapper_subclass": "tensor_subclass",
    "torch.library.Library": "monkeypatch", "torch.library.impl": "monkeypatch",
    "torch.compile": "torch_compile",   # inductor would write the kernels, not the candidate
}
BANNED_ATTRS = {  # attribute names, whatever object they hang off
    "__torch_function__": "torch_function", "__torch_dispatch__": "torch_function", "as_subclass": "tensor_subclass",
    "numpy": "host_compute", "tolist": "host_compute",   # tensor data pulled to the host and computed there
    "__globals__": "introspection", "__builtins__": "introspection", "f_back": "introspection",
    "f_globals": "introspection", "f_locals": "introspection", "tb_frame": "introspection", "gi_frame": "introspection",
}
TF32_ATTRS = {"allow_tf32", "fp32_precision", "allow_fp16_reduced_precision_reduction",
              "allow_bf16_reduced_precision_reduction"}
# modules a candidate may not assign into (not os: candidates often set os.environ["TORCH_CUDA_ARCH_LIST"], harmless)
PROTECTED_ROOTS = {"torch", "time", "builtins", "sys", "static_checks", "triton", "numpy", "math", "gc",
                   *HARNESS_MODULES}
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__"}
STREAM_IN_SOURCE = re.compile(r"getStreamFromPool|cudaStreamCreate")  # in CUDA source strings


def import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted path it was imported as (`import torch.nn.functional as F` -> F: torch.nn.functional,
    `import torch.nn` -> torch: torch). Also used by kernelbench_tasks/catalog.py."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def name_chain(node: ast.AST, subscripts: bool = False) -> list[str] | None:
    """['F', 'gelu'] for F.gelu: the names of an attribute chain that starts at a plain name, else None (e.g.
    (x + y).sum). subscripts=True also walks through subscripts (sys.modules["os"].system -> sys, modules,
    system). Also used by kernelbench_tasks/catalog.py."""
    parts = []
    while isinstance(node, ast.Attribute) or (subscripts and isinstance(node, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


def dotted(node: ast.AST, aliases: dict) -> str | None:
    """'torch.cuda.Stream' for an attribute chain (or subscript base) rooted at an imported name, else None."""
    chain = name_chain(node, subscripts=True)
    if chain is None or chain[0] not in aliases:
        return None
    return ".".join([aliases[chain[0]]] + chain[1:])


def static_check(tree: ast.AST, aliases: dict) -> tuple[str, str] | None:
    """(check, message) for the first banned construct, else None. Rules in BANNED_* above."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom):
                names += [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                for banned, check in BANNED_IMPORTS.items():
                    if name == banned or name.startswith(banned + "."):
                        return check, f"imports {name}"
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = dotted(node, aliases)
            if name in BANNED_NAMES:
                return BANNED_NAMES[name], f"uses {name}"
            if name and re.fullmatch(r"os\.(spawn|exec)\w*", name):
                return "processes", f"uses {name}"
        if isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
            return BANNED_ATTRS[node.attr], f"uses .{node.attr}"
        if getattr(node, "name", getattr(node, "id", None)) in ("__torch_function__", "__torch_dispatch__"):
            return "torch_function", "defines __torch_function__/__torch_dispatch__"
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if dotted(base, aliases) in ("torch.Tensor", "torch._C.TensorBase", "torch.nn.Parameter"):
                    return "tensor_subclass", f"class {node.name} subclasses torch.Tensor"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr in TF32_ATTRS:
                        return "tf32", f"sets {ast.unparse(t)}"
                    name = dotted(t, aliases) if isinstance(t, (ast.Attribute, ast.Subscript)) else None
                    if name and name.split(".")[0] in PROTECTED_ROOTS:
                        return "monkeypatch", f"assigns to {ast.unparse(t)}"
        if isinstance(node, ast.Call):
            fname = node.func.id if isinstance(node.func, ast.Name) else None
            if fname in DYNAMIC_CALLS:
                return "dynamic_code", f"calls {fname}()"
            if fname in ("setattr", "delattr") and node.args:
                name = dotted(node.args[0], aliases) or ""
                if name.split(".")[0] in PROTECTED_ROOTS:
                    return "monkeypatch", f"{fname} on {name}"
            # getattr(sys, "mod" + "ules") reaches what the banned names guard: a computed name on a module is out
            if fname == "getattr" and len(node.args) > 1 and not isinstance(node.args[1], ast.Constant):
                name = dotted(node.args[0], aliases) or ""
                if name.split(".")[0] in PROTECTED_ROOTS | {"os"}:
                    return "introspection", f"getattr on {name} with a computed name"
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            for handler in node.handlers:
                for sub in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
                    if isinstance(sub, ast.Call) and (dotted(sub.func, aliases) or "").startswith("torch."):
                        return "try_except_fallback", f"except branch calls {ast.unparse(sub.func)} (silent fallback)"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and STREAM_IN_SOURCE.search(node.value):
            return "side_stream", "CUDA source creates a stream"
    return None


def backend_problem(tree: ast.AST, src: str, backend: str) -> str | None:
    """Why the candidate is not a `backend` candidate at all (-> format), else None."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    names |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if "ModelNew" not in names:
        return "no class ModelNew"
    if backend == "triton":
        jitted = any(re.search(r"\bjit\b", ast.unparse(d)) for n in ast.walk(tree)
                     if isinstance(n, ast.FunctionDef) for d in n.decorator_list)
        return None if jitted else "no @triton.jit kernel"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", "")) == "load_inline"]
    strings = " ".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return None if calls and "__global__" in strings else "no load_inline call with a __global__ CUDA kernel"
