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
3. Introspection gets the widest net, because the reference's outputs for the very call a candidate is in sit in
   the worker's frames (a candidate that reads them and copies them with its own kernel computes nothing and passes
   every trial: pitfall 17): a banned name also counts when reached through another module (`torch.cuda.graphs.gc`
   is gc), through getattr/hasattr with a constant name (`getattr(tb, "tb_frame")`), or written as a string (what
   `operator.attrgetter` or `object.__getattribute__` would take); getattr with a computed name is out, as are
   `__builtins__`, `globals()`, `vars(x)`, an imported module's `__dict__`, attrgetter and `__getattribute__`, and
   getattr, vars and globals passed around as values. Not closed here: a route that names nothing these rules know
   (an alias, `s = sys; s._getframe()`); the worker's audit hook (harness.instrumentation._introspection_hook) sees
   those calls at run time whatever their name. `__subclasses__` (every class in the process: the verdict's
   transport among them, pitfall 21) is banned the same way; not closed here: a class's own dictionary read with a
   computed key (`type.__dict__["__sub" + "classes__"]`); the worker's Transport check sees what such a candidate
   patches.

Imported by eval_harness.py (its precheck), harness/instrumentation.py (HARNESS_MODULES, in a worker) and
kernelbench_tasks/catalog.py (import_aliases, name_chain); it imports nothing of the harness, so there is no import
cycle. It is loaded in a worker too, so to a candidate it is part of the harness (a harness module, banned and
covered by the identity snapshot like the others).

Use:
    from harness.static_checks import import_aliases, static_check
    static_check(tree, import_aliases(tree))   # ("threads", "imports threading") or None
"""

import ast
import re

# The harness's modules that run in a candidate's process (a worker): eval_harness.py and every module of the package
# harness/. Importing one, or assigning into it, is a monkeypatch, matched by its root name (eval_harness, harness:
# `import harness.worker`, `from harness import processes`); the worker's identity snapshot
# (harness.instrumentation._harness_snapshot) covers their functions
HARNESS_MODULES = ("eval_harness", "harness", "harness.processes", "harness.worker", "harness.compare",
                   "harness.timing", "harness.instrumentation", "harness.static_checks", "harness.verdict")
HARNESS_ROOTS = tuple(dict.fromkeys(name.split(".")[0] for name in HARNESS_MODULES))   # eval_harness, harness
BANNED_IMPORTS = {  # module root -> check name
    "threading": "threads", "_thread": "threads", "concurrent": "threads", "asyncio": "threads",
    "multiprocessing": "processes", "subprocess": "processes", "ctypes": "ctypes", "cffi": "ctypes",
    "inspect": "introspection", "importlib": "dynamic_code", "builtins": "monkeypatch",
    **{name: "monkeypatch" for name in HARNESS_ROOTS},
    "gc": "introspection",   # gc reaches every live object, the harness's stored reference outputs among them
    "torch.multiprocessing": "processes", "torch.overrides": "torch_function",
    "torch.utils._python_dispatch": "torch_function", "torch._dynamo": "torch_compile", "torch._inductor": "torch_compile",
    # raw file descriptors: the worker's pipe to the harness is one (a verdict written there is forged; run_job also
    # rejects a result without the job's key)
    "socket": "file_descriptors", "mmap": "file_descriptors", "fcntl": "file_descriptors", "pty": "file_descriptors",
    "_io": "file_descriptors",
    # files changed on disk: the harness's own sources (the next Evaluator's workers import them), its caches
    "shutil": "writes_files",
}
BANNED_NAMES = {  # dotted name (after resolving imports) -> check name
    "os.fork": "processes", "os.forkpty": "processes", "os.system": "processes", "os.popen": "processes",
    "os.posix_spawn": "processes", "os.posix_spawnp": "processes",
    **{f"os.{name}": "file_descriptors" for name in ("write", "writev", "pwrite", "pwritev", "sendfile", "dup", "dup2",
                                                       "fdopen", "open", "pipe", "pipe2", "openpty", "splice")},
    "io.FileIO": "file_descriptors", "io.open": "file_descriptors",
    **{f"os.{name}": "writes_files" for name in ("remove", "unlink", "rename", "renames", "replace", "rmdir",
                                                   "removedirs", "truncate", "ftruncate", "chmod", "chown", "symlink",
                                                   "link", "utime", "mkfifo", "mknod")},
    "gc.get_objects": "introspection", "gc.get_referrers": "introspection", "gc.get_referents": "introspection",
    "sys._getframe": "introspection", "sys._current_frames": "introspection", "sys.settrace": "introspection",
    "sys.setprofile": "introspection", "sys.modules": "sys_modules",
    "torch.cuda.Stream": "side_stream", "torch.cuda.stream": "side_stream", "torch.cuda.ExternalStream": "side_stream",
    "torch.cuda.set_stream": "side_stream", "torch.set_float32_matmul_precision": "tf32",
    "torch.Tensor._make_subclass": "tensor_subclass", "torch.Tensor._make_wrapper_subclass": "tensor_subclass",
    "torch.library.Library": "monkeypatch", "torch.library.impl": "monkeypatch",
    # how pickle reduces a type (the verdict is pickled to the harness: pitfall 21)
    "copyreg.dispatch_table": "monkeypatch", "copyreg.pickle": "monkeypatch",
    "torch.compile": "torch_compile",   # inductor would write the kernels, not the candidate
    # frames handed out by the standard library: the harness's frames (and the stored outputs) are their callers
    "logging.currentframe": "introspection", "traceback.walk_stack": "introspection",
    "traceback.walk_tb": "introspection",
    # the caching allocator's blocks with their device addresses: where the stored reference outputs lie, for a
    # kernel that reads them by address
    "torch.cuda.memory_snapshot": "introspection", "torch.cuda.memory.memory_snapshot": "introspection",
    "torch.cuda.memory._snapshot": "introspection", "torch._C._cuda_memorySnapshot": "introspection",
}
BANNED_ATTRS = {  # attribute names, whatever object they hang off
    "__torch_function__": "torch_function", "__torch_dispatch__": "torch_function", "as_subclass": "tensor_subclass",
    "numpy": "host_compute", "tolist": "host_compute",   # tensor data pulled to the host and computed there
    "__globals__": "introspection", "__builtins__": "introspection", "f_back": "introspection",
    "f_globals": "introspection", "f_locals": "introspection", "tb_frame": "introspection", "gi_frame": "introspection",
    "cr_frame": "introspection", "ag_frame": "introspection",
    # attribute reads by another name: object.__getattribute__(f, name), operator.attrgetter(name)(f)
    "__getattribute__": "introspection", "attrgetter": "introspection", "methodcaller": "introspection",
    # every class in the process, the harness's way of sending its verdict among them (object.__subclasses__() finds
    # multiprocessing's Connection, ForkingPickler, KernelResult: a patch rewrites the genuine verdict on its way
    # out, pitfall 21); a closure's cells hold what the harness's own patches close over (Triton's launch counter
    # holds the Instrumentation, and with it the job's connection and the snapshot)
    "__subclasses__": "introspection", "__closure__": "introspection", "cell_contents": "introspection",
    # pathlib's writers (a path's .open is the builtin open's rule: below)
    **{name: "writes_files" for name in ("write_text", "write_bytes", "touch", "unlink", "symlink_to", "hardlink_to",
                                         "chmod", "lchmod", "rmdir")},
}
# the last part of every introspection rule's name: as a string constant (an attrgetter's, a getattr's), a hit too
INTROSPECTION_WORDS = ({attr for attr, check in BANNED_ATTRS.items() if check == "introspection"}
                       | {name.rsplit(".", 1)[1] for name, check in BANNED_NAMES.items() if check == "introspection"})
# modules whose namespace (m.__dict__) holds what the banned names guard
NAMESPACE_ROOTS = {"torch", "time", "sys", "triton", "numpy", "math", "os", "logging", "traceback", "operator"}
# builtins that read attributes or namespaces by a name given at run time: as a call only with the rules below, and
# never as a value (`ga = getattr` would take them past the rules)
NAME_READERS = {"getattr", "vars"}
TF32_ATTRS = {"allow_tf32", "fp32_precision", "allow_fp16_reduced_precision_reduction",
              "allow_bf16_reduced_precision_reduction"}
# modules a candidate may not assign into (not os: candidates often set os.environ["TORCH_CUDA_ARCH_LIST"], harmless)
# (io, copyreg, pickle, struct: the verdict's transport to the harness uses them, pitfall 21)
PROTECTED_ROOTS = {"torch", "time", "builtins", "sys", "triton", "numpy", "math", "gc", "io", "copyreg", "pickle",
                   "struct", *HARNESS_ROOTS}
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


def banned_name(name: str | None) -> tuple[str, str] | None:
    """(check, name) if the dotted name, or any tail of it, is a banned name: modules re-export what they import
    (torch.cuda.graphs.gc is gc, so torch.cuda.graphs.gc.get_objects is gc.get_objects)."""
    parts = name.split(".") if name else []
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        if tail in BANNED_NAMES:
            return BANNED_NAMES[tail], tail
        if i and tail in BANNED_IMPORTS:   # (a banned module itself, reached as another module's attribute)
            return BANNED_IMPORTS[tail], tail
        if re.fullmatch(r"os\.(spawn|exec)\w*", tail):
            return "processes", tail
    return None


# C/C++ calls in a CUDA candidate's sources (its string constants) that reach files, descriptors and processes: the
# compiled extension runs in the worker, next to the harness's pipe and with its sources on disk, and the rules
# above read only Python. (Defence in depth: a source built from pieces at run time is not seen.)
NATIVE_CALLS = [(re.compile(r"\b(fopen|freopen|creat|openat|unlink|unlinkat|rename|renameat|truncate|ftruncate|"
                            r"chmod|symlink|mkstemp)\s*\(|\b(std::)?(o|i)?fstream\b|std::filesystem|<filesystem>"),
                 "writes_files"),
                (re.compile(r"(?<![\w.>])(open|write|pwrite|writev|dup|dup2|dup3|sendfile|syscall|mmap|ioctl)\s*\("),
                 "file_descriptors"),
                (re.compile(r"\b(system|popen|fork|vfork|execv|execve|execvp|execl|execlp|posix_spawn|dlopen)\s*\("),
                 "processes")]


def native_check(tree: ast.AST) -> tuple[str, str] | None:
    """(check, what) for a C/C++ call of NATIVE_CALLS in a candidate that carries C/C++ sources (a string constant
    with #include or __global__; then all of its string constants are read, as load_inline may join them)."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)   # (docstrings are prose, never compiled)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
    if not any("#include" in text or "__global__" in text for text in strings):
        return None
    strings = [re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S) for text in strings]   # (not comments)
    for pattern, check in NATIVE_CALLS:
        for text in strings:
            hit = pattern.search(text)
            if hit:
                return check, f"its C/C++ source calls {hit.group(0).strip()}"
    return None


def static_check(tree: ast.AST, aliases: dict) -> tuple[str, str] | None:
    """(check, message) for the first banned construct, else None. Rules in BANNED_* above."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    hit = native_check(tree)
    if hit:
        return hit
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom):
                names += [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                for banned, check in BANNED_IMPORTS.items():
                    if name == banned or name.startswith(banned + "."):
                        return check, f"imports {name}"
                hit = banned_name(name)   # (from sys import _getframe)
                if hit:
                    return hit[0], f"imports {hit[1]}"
        if isinstance(node, (ast.Name, ast.Attribute)):
            hit = banned_name(dotted(node, aliases))
            if hit:
                return hit[0], f"uses {hit[1]}"
        # open() and x.open(): open(fd) or a computed path may be the harness's pipe (/proc/self/fd/N); a file
        # opened to write may be the harness's sources on disk (the next Evaluator's workers import them) or its
        # caches. open(path, mode) takes the mode second; pathlib's p.open(mode) first, gzip.open(path, mode) second
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "open":
            builtin = isinstance(node.func, ast.Name)
            path = node.args[0] if builtin and node.args else None
            if path is not None and (not (isinstance(path, ast.Constant) and isinstance(path.value, str))
                                     or path.value.startswith(("/proc", "/dev"))):
                return "file_descriptors", f"opens {ast.unparse(path)}"
            modes = [kw.value for kw in node.keywords if kw.arg == "mode"]
            modes += node.args[1:2] if builtin else [
                a for a in node.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)
                and len(a.value) <= 3 and set(a.value) <= set("rwabxt+")]
            if any(not (isinstance(m, ast.Constant) and isinstance(m.value, str)) or set(m.value) & set("wax+")
                   for m in modes):
                return "writes_files", f"opens a file to write: {ast.unparse(node)[:80]}"
        if isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
            return BANNED_ATTRS[node.attr], f"uses .{node.attr}"
        # __builtins__ holds __import__, exec and getattr by other names; globals() holds __builtins__
        if isinstance(node, ast.Name) and node.id in ("__builtins__", "globals"):
            return "introspection", f"uses {node.id}"
        if isinstance(node, ast.Name) and node.id in NAME_READERS and id(node) not in called:
            return "introspection", f"uses {node.id} as a value"
        if isinstance(node, ast.Name) and node.id == "open" and id(node) not in called:   # (`o = open` is past the
            return "writes_files", "uses open as a value"                                    # two rules on open)
        if isinstance(node, ast.Constant) and node.value in INTROSPECTION_WORDS:
            return "introspection", f"names {node.value!r}"
        if isinstance(node, ast.Attribute) and node.attr == "__dict__" and \
                (dotted(node.value, aliases) or "").split(".")[0] in NAMESPACE_ROOTS:
            return "introspection", f"uses {ast.unparse(node)}"
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
            # getattr(sys, "mod" + "ules") or getattr(tb, "tb_" + "frame") reaches what the banned names guard: a
            # computed name is out on anything (on self too: `self` is only a name, any object can be passed as it)
            if fname == "getattr" and len(node.args) > 1 and not isinstance(node.args[1], ast.Constant):
                return "introspection", f"getattr on {ast.unparse(node.args[0])} with a computed name"
            # a constant name is the attribute written out: getattr(sys, "_getframe") is sys._getframe
            if fname in ("getattr", "hasattr") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str):
                attr, base = node.args[1].value, dotted(node.args[0], aliases)
                if attr in BANNED_ATTRS:
                    return BANNED_ATTRS[attr], f"{fname} of .{attr}"
                hit = banned_name(f"{base}.{attr}") if base else None
                if hit:
                    return hit[0], f"uses {hit[1]}"
            if fname == "vars" and node.args:
                return "introspection", "calls vars() (a namespace: names read by strings, __builtins__)"
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
