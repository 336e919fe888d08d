"""cuda_ext/build.py: fast_load_inline, a drop-in for torch.utils.cpp_extension.load_inline for small CUDA candidates.

A KernelBench-style CUDA candidate calls `load_inline(name, cpp_sources, cuda_sources, functions=[...])` when it is
imported. Plain load_inline takes 41-55 s cold on our H200 machine for a 3-line kernel, and almost all of it is nvcc
parsing torch's headers (the .cu gets `#include <torch/types.h>` prepended, and candidates add
`#include <torch/extension.h>` themselves). The eval harness swaps this function in inside its worker processes.

How it departs from torch's load_inline (each choice is measured; numbers in the comments below and in bench.py):
  1. One build directory per (sources, flags, torch, nvcc, arch) sha256 under cache_root(): cache hits across
     processes and runs, and no two different candidates ever share a directory (no lock fights). A built module is
     imported straight from its .so (no ninja, no compiler): the warm path. Compile failures are cached too.
  2. The .cu does not get torch's umbrella headers. `#include <torch/extension.h>` (and torch/types.h, torch/torch.h,
     torch/all.h, ATen/ATen.h) becomes cuda_ext/kz_prelude.cuh, a small set of REAL torch headers, plus, for every
     ATen operator NAME called in the source, the text of its real header ATen/ops/NAME.h without the four heavy
     includes that every generated per-operator header carries. That is the big win: the one-shot example's .cu
     takes 18.5 CPU s with nvcc instead of 142 (measured on our CPU machine; numbers in kz_prelude.cuh).
  3. main.cpp (the pybind11 bindings, written exactly as load_inline writes them) is compiled against a precompiled
     header (a GCC PCH) built once per machine and flag set into cache_root()/pch. torch's own `use_pch=True` can
     not be used here: it writes the PCH into torch's include directory and every plain load_inline call
     (use_pch=False) deletes it again, which races with parallel builds. Where the cpp sources only declare
     functions (the usual `torch::Tensor f(torch::Tensor x);`), main.cpp includes <torch/python.h> instead of
     <torch/extension.h>: the same bindings without the C++ frontend (fast_main_cpp).
  4. One architecture: the current GPU's (sm_90 on the H200) or TORCH_CUDA_ARCH_LIST, no PTX copy.
  5. The verdict never changes: if the fast build fails for any reason, the exact plain load_inline runs (its own
     directory, torch's flags). The module says which path built it: `module.__kz_build__` is "fast", "plain",
     "cached-fast" or "cached-plain".

Everything else (compiler flags, link flags, ninja, the import) is torch's own `cpp_extension.load()`, so the
fast build only differs from plain in the .cu text, the arch flag and the PCH include directory.

Known limits: the .cu sees a subset of plain's declarations, so a source can only fail the fast compile where plain
succeeds (then plain runs: slower, same verdict), e.g. Tensor operators (`a + b`: ATen/TensorOperators.h drags in
all of ATen/Functions.h). In the .cu, torch::empty & co. resolve to at::empty & co. (plain: torch's autograd-aware
wrappers of them), which differ only for factory calls asking for requires_grad=True. A source that compiles fast
but would fail plain needs a clash with a declaration the prelude leaves out; the operators a source calls are
always declared, for that reason (see op_names).

Use it:
    from cuda_ext.build import fast_load_inline
    ext = fast_load_inline("add", cpp_sources=CPP, cuda_sources=CU, functions=["add_cuda"])
Measure it: `python bench.py harness` (cold/warm build times against plain load_inline, on the GPU machine).
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import time

import torch
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))
PRELUDE_PATH = os.path.join(HERE, "kz_prelude.cuh")
# torch's own load_inline, captured when this module is imported (the harness swaps ours in only afterwards).
PLAIN_LOAD_INLINE = cpp_extension.load_inline


def cache_root() -> str:
    """Where builds and precompiled headers live: $KZ_CACHE_DIR, else ~/.cache/kernelzero."""
    return os.environ.get("KZ_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kernelzero")


def torch_include_dir() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "include")


# ---------------------------------------------------------------------------------------------------------------------
# The .cu text: prelude instead of torch's umbrella headers, plus the per-operator headers the source calls

# The headers that pull in (nearly) all of torch. <torch/extension.h> in the .cu costs 57 s on the H200 machine,
# <torch/types.h> 26 s, a .cu without torch headers 0.7-2 s (H200, 2026-12-02).
UMBRELLA_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](torch/extension\.h|torch/types\.h|torch/torch\.h|'
                         r'torch/all\.h|ATen/ATen\.h)[>"]', re.M)
# Sources that need what only the full headers have (pybind11 in the .cu, the C++ frontend): the fast compile
# would fail anyway, so go straight to the plain build instead of paying for a doomed attempt.
NEEDS_FULL_RE = re.compile(r"PYBIND11_MODULE|pybind11::|\bpy::|torch::(nn|autograd|jit|optim|data|serialize)::")
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


@functools.lru_cache(maxsize=None)
def aten_op_names() -> frozenset:
    """Operators with a per-operator header that plain's <torch/types.h> includes (via ATen/Functions.h), so that
    including one never declares anything a plain build would not have (~1,350 names)."""
    with open(os.path.join(torch_include_dir(), "ATen", "Functions.h")) as f:
        return frozenset(re.findall(r"#include <ATen/ops/(\w+)\.h>", f.read()))


def op_names(source: str) -> list[str]:
    """Every NAME( in the source that is an ATen operator: torch::empty_like(, at::zeros(, and also unqualified
    calls (an unqualified relu(t) on a Tensor finds at::relu by argument-dependent lookup in a plain build, so the
    fast build must see the same declarations). Device-side max(/exp( match too: an extra declaration is harmless."""
    return sorted(set(CALL_RE.findall(source)) & aten_op_names())


# The generated per-operator headers (ATen/ops/NAME.h) all include the same list; these four are heavy (together
# ~66k preprocessed lines: ATen/Context.h, and IValue via ATen/DeviceGuard.h) and the inline wrappers in the header
# never use them. Measured (nvcc -c, CPU s): prelude alone 14-17 s, prelude + real ATen/ops/empty_like.h 28-32 s.
HEAVY_OP_INCLUDES = ("ATen/Context.h", "ATen/DeviceGuard.h", "ATen/TensorUtils.h", "ATen/TracerMode.h")
HEAVY_INCLUDE_RE = re.compile(r"^#include <(%s)>\n" % "|".join(re.escape(h) for h in HEAVY_OP_INCLUDES), re.M)
# A source that itself includes per-operator headers would see our copies twice (redefinitions): real headers then.
OWN_OP_HEADERS_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]ATen/(ops/|Functions\.h|NativeFunctions\.h|native/)',
                               re.M)


def op_declarations(names: list[str], real_headers: bool = False) -> list[str]:
    """The declarations of these operators: the real per-operator header, pasted without its four heavy includes
    and its `#pragma once` (its other includes, e.g. ATen/ops/NAME_ops.h, stay: they are light). The pasted text is
    token for token the real header's, so the fast .cu and main.cpp (which includes the real one) agree (ODR)."""
    if real_headers:
        return [f"#include <ATen/ops/{n}.h>" for n in names]
    out = []
    for n in names:
        with open(os.path.join(torch_include_dir(), "ATen", "ops", f"{n}.h")) as f:
            text = f.read()
        out.append(f"// [kz] ATen/ops/{n}.h without {', '.join(HEAVY_OP_INCLUDES)}")
        out.append(HEAVY_INCLUDE_RE.sub("", text).replace("#pragma once\n", ""))
    return out


def fast_cuda_source(cuda_sources: list[str]) -> str:
    """The .cu that the fast build compiles. Plain load_inline writes
    "#include <torch/types.h>\\n#include <cuda.h>\\n#include <cuda_runtime.h>\\n" + "\\n".join(cuda_sources)."""
    body = UMBRELLA_RE.sub(r"// [kz] #include <\1>: the prelude at the top of this file stands in for it",
                           "\n".join(cuda_sources))
    with open(PRELUDE_PATH) as f:
        prelude = f.read()
    ops = op_declarations(op_names(body), real_headers=OWN_OP_HEADERS_RE.search(body) is not None)
    return "\n".join([prelude, "// [kz] declarations of the ATen operators this source calls", *ops,
                      "#include <cuda.h>", "#include <cuda_runtime.h>", body])


def main_cpp_source(cpp_sources: list[str], functions, with_pytorch_error_handling: bool) -> str:
    """main.cpp exactly as torch's load_inline writes it: <torch/extension.h>, the cpp sources, the bindings."""
    lines = ["#include <torch/extension.h>", *cpp_sources]
    if functions is not None:
        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, list):
            functions = {f: f for f in functions}
        elif not isinstance(functions, dict):
            raise ValueError(f"Expected 'functions' to be a list or dict, but was {type(functions)}")
        lines.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn, doc in functions.items():
            target = f"torch::wrap_pybind_function({fn})" if with_pytorch_error_handling else fn
            lines.append(f'm.def("{fn}", {target}, "{doc}");')
        lines.append("}")
    return "\n".join(lines)


# <torch/extension.h> is <torch/all.h> (the C++ frontend: nn, optim, data, ...) + <torch/python.h> (pybind11 and
# torch's type casters). The bindings need only the second, and GCC instantiates the templates that a header leaves
# pending in every file that includes it, PCH or not: main.cpp of the one-shot example took 7.0 s of CPU with the
# precompiled <torch/extension.h> and 4.7 s with a precompiled <torch/python.h> (g++, our 2-core CPU machine)
BINDINGS_HEADER = "torch/python.h"
COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def fast_main_cpp(main_cpp: str, cpp_sources: list[str]) -> tuple[str, str]:
    """(main.cpp, the header to precompile for it). Cpp sources that only declare (no braces, no preprocessor
    lines, nothing from the C++ frontend) name types that <torch/types.h> declares, or fail to compile (then the
    plain build decides): main.cpp then includes <torch/python.h>. No header that <torch/all.h> adds declares a
    pybind11 type caster (a test checks), so the bindings convert every argument as plain's do. Anything else:
    main.cpp as plain writes it."""
    code = COMMENT_RE.sub("", "\n".join(cpp_sources))
    if "{" in code or "#" in code or NEEDS_FULL_RE.search(code):
        return main_cpp, "torch/extension.h"
    return main_cpp.replace("#include <torch/extension.h>", f"#include <{BINDINGS_HEADER}>", 1), BINDINGS_HEADER


# ---------------------------------------------------------------------------------------------------------------------
# Flags: one GPU architecture, and the flags main.cpp is compiled with (the PCH must be built with the same ones)

def arch_flags(extra_cuda_cflags: list[str]) -> list[str]:
    """-gencode for the current GPU only (torch also embeds PTX for the newest visible arch, which a candidate that
    runs on this machine never needs). A user arch flag wins, as in torch."""
    if any("arch" in f for f in extra_cuda_cflags):
        return []
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):   # the harness sets it in its compile workers: torch's own parsing
        return cpp_extension._get_cuda_arch_flags()
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]
    return []   # no GPU and no arch list: torch picks (and fails exactly as a plain build would)


@functools.lru_cache(maxsize=None)
def torch_cxx_std() -> str:
    """The -std flag torch's load() gives the host compiler (c++17 up to torch 2.10-ish, c++20 in 2.13). It is read
    from torch's ninja writer because the PCH is only used when built with the same -std (else GCC silently
    parses the real header: slower, never wrong)."""
    found = re.search(r"-std=c\+\+\d+", inspect.getsource(cpp_extension._write_ninja_file_to_build_library))
    return found.group(0) if found else "-std=c++17"


def split_flags(flags) -> list[str]:
    """Flags as a shell would split them (torch writes them into build.ninja, so "" vanishes, "-a -b" is two)."""
    return shlex.split(" ".join(f.strip() for f in flags or []))


def host_flags(extra_cflags: list[str], extra_include_paths: list[str]) -> list[str]:
    """main.cpp's compile flags in torch's load() (minus -DTORCH_EXTENSION_NAME, which torch's headers never use)."""
    includes = cpp_extension.include_paths("cuda") + [sysconfig.get_path("include", scheme="posix_prefix")]
    return (["-DTORCH_API_INCLUDE_EXTENSION_H"] + [f"-I{os.path.abspath(p)}" for p in extra_include_paths]
            + [a for p in includes for a in ("-isystem", p)] + ["-fPIC", torch_cxx_std()] + split_flags(extra_cflags))


@functools.lru_cache(maxsize=None)
def tool_versions() -> str:
    """Compiler identities for the cache keys: a new nvcc or g++ must not reuse old objects or PCHs."""
    out = []
    for cmd in (["nvcc", "--version"], shlex.split(cpp_extension.get_cxx_compiler()) + ["--version"]):
        try:
            out.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout)
        except (OSError, subprocess.SubprocessError) as e:
            out.append(f"{cmd[0]}: {e}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------------
# The precompiled header for main.cpp (built once per machine and flag set)

def ensure_pch(extra_cflags: list[str], extra_include_paths: list[str], verbose: bool = False,
               max_pchs: int = 8, header: str = "torch/extension.h") -> str | None:
    """A directory holding HEADER.gch (torch/extension.h.gch, or torch/python.h.gch: fast_main_cpp) for these
    flags, or None when there is none (yet).

    main.cpp is `#include <torch/extension.h>` + declarations + bindings. CPU seconds with g++ on our shared CPU
    machine: 36-45 without the PCH, 12-18 with it (most of the rest is GCC instantiating templates at the end of
    the file, which no PCH saves); with a candidate's extra_cflags=["-O3"]: 65 without, 31.5 with. Building the
    PCH takes 60-80 s CPU and ~785 MB, once per flag set. (The fast .cu of the same example: 18.5 s.) The directory is put first on main.cpp's -I
    path; GCC looks for torch/extension.h.gch there before it looks for the header, and ignores a PCH built with
    other flags (-O3, -g, -std...), so the PCH is keyed by the flags. Exactly one process builds it (a file lock);
    the others compile without it in the meantime rather than wait."""
    flags = host_flags(extra_cflags, extra_include_paths)
    key = hashlib.sha256(json.dumps([torch.__version__, tool_versions(), flags, header]).encode()).hexdigest()[:16]
    root = os.path.join(cache_root(), "pch", key)
    gch = os.path.join(root, header + ".gch")
    if os.path.exists(gch):
        return root
    if os.path.exists(os.path.join(root, "failed.txt")):
        return None
    pchs = os.path.dirname(root)
    if os.path.isdir(pchs) and len(os.listdir(pchs)) >= max_pchs:
        return None   # ~0.8 GB each: candidates with ever new extra_cflags must not fill the disk
    os.makedirs(os.path.dirname(gch), exist_ok=True)
    with open(os.path.join(root, "lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)   # released by the kernel if we die
        except BlockingIOError:
            return None   # another process is building it right now
        if os.path.exists(gch):
            return root
        # (torch/python.h lives in torch's C++ API include directory, torch/extension.h at the top)
        source = next((path for path in (os.path.join(torch_include_dir(), header),
                                         os.path.join(torch_include_dir(), "torch", "csrc", "api", "include", header))
                       if os.path.exists(path)), os.path.join(torch_include_dir(), header))
        cmd = shlex.split(cpp_extension.get_cxx_compiler()) + ["-x", "c++-header", source, "-o", gch + ".tmp"] + flags
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:   # e.g. a flag the host compiler rejects: main.cpp's own compile will say so
            with open(os.path.join(root, "failed.txt"), "w") as f:
                f.write(shlex.join(cmd) + "\n" + proc.stderr[-4000:])
            return None
        os.replace(gch + ".tmp", gch)   # atomic: nobody ever sees half a PCH
        if verbose:
            print(f"[kz] built the precompiled <{header}> in {time.time() - t0:.1f} s: {gch}", file=sys.stderr)
    return root


# ---------------------------------------------------------------------------------------------------------------------
# fast_load_inline

def build_key(name: str, main_cpp: str, cuda_cu: str, flags: list) -> str:
    """sha256 of everything that changes the built module (sources, flags, torch, compilers, the current GPU arch)."""
    parts = [name, main_cpp, cuda_cu, flags, torch.__version__, str(torch.version.cuda), sys.version, tool_versions()]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def import_built(module_name: str, so_path: str):
    """Import an extension module from its .so, as torch's load() does at the end of a build (no ninja, no g++)."""
    spec = importlib.util.spec_from_file_location(module_name, so_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_json(path: str, obj: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)   # atomic: a reader never sees half a marker


def is_compile_error(message: str) -> bool:
    """A real compiler verdict (worth caching) rather than a killed or crashed build (worth retrying)."""
    return "Error building extension" in message and re.search(r"\berror\b", message) is not None \
        and "Killed" not in message


def remove_stale_lock(directory: str, max_age_s: float = 900.0) -> None:
    """torch's build lock in `directory`, left behind when a worker was killed mid-build (e.g. at its compile
    timeout). A build that is really running that long would already have timed out in the harness."""
    lock = os.path.join(directory, "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > max_age_s:
        os.remove(lock)


def fast_load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None, extra_cuda_cflags=None,
                     extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose=False,
                     with_cuda=None, is_python_module=True, with_pytorch_error_handling=True,
                     keep_intermediates=True, use_pch=False, **kwargs):
    """Same arguments and result as torch.utils.cpp_extension.load_inline (see the module docstring).
    `build_directory`, when given, is used as the cache root for this call. `use_pch` is accepted and ignored (the
    fast path always uses its own PCH; the plain fallback runs without torch's)."""
    plain_args = dict(name=name, cpp_sources=cpp_sources, cuda_sources=cuda_sources, functions=functions,
                      extra_cflags=extra_cflags, extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
                      extra_include_paths=extra_include_paths, verbose=verbose, with_cuda=with_cuda,
                      is_python_module=is_python_module, with_pytorch_error_handling=with_pytorch_error_handling,
                      keep_intermediates=keep_intermediates, **kwargs)
    cpp_list = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources or [])
    cuda_list = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources or [])
    extra_cflags, extra_cuda_cflags = list(extra_cflags or []), list(extra_cuda_cflags or [])
    extra_ldflags, extra_include_paths = list(extra_ldflags or []), list(extra_include_paths or [])

    main_cpp, header = fast_main_cpp(main_cpp_source(cpp_list, functions, with_pytorch_error_handling), cpp_list)
    cuda_cu = fast_cuda_source(cuda_list) if cuda_list else ""
    arch = arch_flags(extra_cuda_cflags)
    key = build_key(name, main_cpp, cuda_cu, [extra_cflags, arch + extra_cuda_cflags, extra_ldflags,
                                             extra_include_paths, with_cuda, is_python_module, sorted(kwargs.items())])
    directory = os.path.join(build_directory or os.path.join(cache_root(), "builds"), f"{name}_{key[:20]}")
    done, failed = os.path.join(directory, "kz_build.json"), os.path.join(directory, "kz_failed.json")

    # Warm path: built before (by any process): import the .so directly, ~0.1 s instead of ninja's ~1 s.
    if os.path.exists(done):
        with open(done) as f:
            info = json.load(f)
        try:
            module = import_built(info["module"], info["so"])
            module.__kz_build__ = "cached-" + info["path"]
            return module
        except (ImportError, OSError):   # e.g. a half-cleaned cache: forget the marker and build again
            os.remove(done)
    if os.path.exists(failed):
        with open(failed) as f:
            raise RuntimeError(json.load(f)["error"])

    os.makedirs(directory, exist_ok=True)
    t0 = time.time()
    # Anything unusual (extra load_inline options, a C++-only or non-Python extension, pybind11 or the C++
    # frontend in the .cu) goes straight to the plain build: the fast path is only for the common case.
    unusual = (any(v for v in kwargs.values()) or not is_python_module or not cuda_list
               or NEEDS_FULL_RE.search("\n".join(cuda_list)) is not None)
    fast_error = "skipped: unusual arguments or a source that needs the full torch headers" if unusual else ""
    module = None
    if not unusual:
        try:
            for fname, text in (("main.cpp", main_cpp), ("cuda.cu", cuda_cu)):
                with open(os.path.join(directory, fname), "w") as f:
                    f.write(text)
            pch = ensure_pch(extra_cflags, extra_include_paths, verbose, header=header)
            remove_stale_lock(directory)
            module = cpp_extension.load(
                name, [os.path.join(directory, "main.cpp"), os.path.join(directory, "cuda.cu")],
                extra_cflags=([f"-I{pch}"] if pch else []) + extra_cflags, extra_cuda_cflags=arch + extra_cuda_cflags,
                extra_ldflags=extra_ldflags, extra_include_paths=extra_include_paths, build_directory=directory,
                verbose=verbose, with_cuda=with_cuda, is_python_module=True, keep_intermediates=keep_intermediates)
            path = "fast"
        except Exception as e:   # noqa: BLE001  any failure: the plain build decides the verdict
            fast_error = str(e)[-4000:]
    if module is None:
        if verbose and not unusual:
            print(f"[kz] fast build of {name} failed, running the plain load_inline build", file=sys.stderr)
        plain_dir = os.path.join(directory, "plain")
        os.makedirs(plain_dir, exist_ok=True)
        remove_stale_lock(plain_dir)
        try:
            module = PLAIN_LOAD_INLINE(build_directory=plain_dir, **plain_args)
        except Exception as e:
            if is_compile_error(str(e)):   # deterministic: the same source fails the same way next time
                write_json(failed, {"error": str(e), "fast_error": fast_error})
            raise
        path = "plain"
        if not is_python_module:   # load_inline returned the library path; nothing to cache or annotate
            return module
    write_json(done, {"module": module.__name__, "so": module.__file__, "path": path,
                      "seconds": round(time.time() - t0, 2), "fast_error": fast_error})
    module.__kz_build__ = path
    return module
