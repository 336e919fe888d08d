"""Tests for cuda_ext/build.py (fast_load_inline), cuda_ext's one-shot examples and bench.py's candidate generators.

CPU tests need no GPU (nvcc, when present, only compiles); GPU tests are marked and run on the H200.
"""
import os
import re
import shutil
import subprocess
import sysconfig
import types

import pytest
import torch

from cuda_ext import build
from tests.common import ROOT


def _cudabuild_example_pieces():
    """The load_inline arguments of cuda_ext/example_cuda.py (read from the file, not imported: no GPU here)."""
    src = open(os.path.join(ROOT, "cuda_ext", "example_cuda.py")).read()
    cuda = re.search(r'cuda_source = r"""(.*?)"""', src, re.S).group(1)
    cpp = re.search(r'cpp_source = "(.*?)"', src).group(1)
    return dict(name="elementwise_add", cpp_sources=cpp, cuda_sources=cuda, functions=["elementwise_add_cuda"])


def _cudabuild_fake_module(path):
    module = types.ModuleType("fake_ext")
    module.__file__ = path
    return module


# ---------------------------------------------------------------------------------------------------------------------
# CPU tests

def test_cudabuild_cache_key_stable_and_unique():
    base = ("ext", "main", "cu", [[], ["-O3"], [], []])
    assert build.build_key(*base) == build.build_key(*base)
    keys = {build.build_key(*base), build.build_key("ext2", *base[1:]), build.build_key("ext", "main2", "cu", base[3]),
            build.build_key("ext", "main", "cu2", base[3]), build.build_key("ext", "main", "cu", [[], [], [], []])}
    assert len(keys) == 5


def test_cudabuild_include_rewriting_and_op_headers():
    src = "\n".join(["#include <torch/extension.h>", '  #  include "torch/types.h"', "#include <ATen/ATen.h>",
                     "#include <torch/torch.h>", "#include <ATen/cuda/CUDAContext.h>",
                     "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); return at::zeros({3}); }",
                     "__global__ void k(float* p) { p[0] = my_helper(p[1]); }"])
    cu = build.fast_cuda_source([src])
    active = [line.split("//")[0].strip() for line in cu.splitlines() if re.match(r"\s*#\s*include", line)]
    for umbrella in ("torch/extension.h", "torch/types.h", "ATen/ATen.h", "torch/torch.h"):
        assert not any(umbrella in line for line in active), umbrella
    assert "#include <ATen/cuda/CUDAContext.h>" in active            # a specific header is kept as written
    assert "#include <ATen/core/Tensor.h>" in active                  # the prelude is pasted in
    # the operators it calls are declared by the real per-op headers' text, minus their four heavy includes
    assert {"#include <ATen/ops/empty_like_ops.h>", "#include <ATen/ops/zeros_ops.h>"} <= set(active)
    assert "inline at::Tensor empty_like(const at::Tensor & self" in cu
    assert not set(active) & {f"#include <{h}>" for h in build.HEAVY_OP_INCLUDES}
    assert not any("my_helper" in line or "ops/f.h" in line or "pragma once" in line for line in active)
    assert cu.index("inline at::Tensor empty_like(") < cu.index("__global__")  # declarations before use
    # a source that includes per-op headers itself gets the real ones (our copies would be redefinitions)
    own = build.fast_cuda_source(["#include <ATen/ops/zeros.h>\n" + src])
    assert "#include <ATen/ops/empty_like.h>" in own and "inline at::Tensor empty_like(" not in own


def test_cudabuild_prelude_only_uses_headers_that_plain_includes():
    """The prelude (and every per-op header it may add) must be a subset of what plain's <torch/types.h> includes,
    so a fast build never sees a declaration that a plain build would not: only a missing one (then: fallback)."""
    inc = build.torch_include_dir()
    header = open(build.PRELUDE_PATH).read()
    prelude = re.findall(r"^#include <([^>]+)>", header, re.M)
    assert "ATen/core/Tensor.h" in prelude
    cmd = ["g++", "-std=c++20", "-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", inc,
           "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"),
           "-isystem", sysconfig.get_path("include"), "-M", "-x", "c++", "-"]
    deps = subprocess.run(cmd, input="#include <torch/types.h>\n", capture_output=True, text=True, check=True).stdout
    deps = {os.path.relpath(os.path.realpath(p), os.path.realpath(inc))
            for p in deps.replace("\\\n", " ").split() if p.startswith("/")}
    assert set(prelude) <= deps, set(prelude) - deps
    ops = {f"ATen/ops/{n}.h" for n in build.aten_op_names()}
    assert len(ops) > 1000 and ops <= deps
    pasted = "\n".join(build.op_declarations(sorted(build.aten_op_names())))   # what the pasted copies include
    assert {h for h in re.findall(r"^#include <([^>]+)>", pasted, re.M) if "/" in h} <= deps   # (not <optional>)
    for cuda_only in ("c10/cuda/CUDAStream.h", "ATen/cuda/CUDAContext.h"):   # why the prelude leaves them out
        assert cuda_only not in deps


def test_cudabuild_every_pasted_op_declaration_compiles_with_the_prelude(tmp_path):
    """All ~1,350 per-operator wrappers, pasted without their heavy includes, compile on top of the prelude alone
    (g++ host syntax check, ~10 s): no operator call makes the fast build fail for a missing include."""
    inc = build.torch_include_dir()
    src = tmp_path / "all_ops.cpp"
    src.write_text(open(build.PRELUDE_PATH).read() + "\n".join(build.op_declarations(sorted(build.aten_op_names())))
                   + "\nat::Tensor f(at::Tensor t) { return torch::empty_like(t).add(torch::zeros({3}, torch::kF32)); }\n")
    cmd = ["g++", "-fsyntax-only", "-Wno-unknown-pragmas", build.torch_cxx_std(), "-DTORCH_API_INCLUDE_EXTENSION_H",
           "-isystem", inc, "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_cudabuild_main_cpp_is_what_torch_writes(tmp_path, monkeypatch):
    """main_cpp_source is plain load_inline's main.cpp byte for byte (fast_main_cpp may then swap its first include,
    for declaration-only sources): its verdict is plain's."""
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "_jit_compile", lambda *a, **k: None)   # write the sources, build nothing
    pieces = _cudabuild_example_pieces()
    for handling in (True, False):
        cpp_extension.load_inline(**pieces, build_directory=str(tmp_path), with_pytorch_error_handling=handling)
        mine = build.main_cpp_source([pieces["cpp_sources"]], pieces["functions"], handling)
        assert (tmp_path / "main.cpp").read_text() == mine


def test_cudabuild_main_cpp_includes_only_the_bindings_half_for_declarations():
    """Cpp sources that only declare get main.cpp with <torch/python.h> (braces or # inside comments do not count);
    a body, a preprocessor line or the C++ frontend keep plain's <torch/extension.h>; the rest of the text is
    plain's, byte for byte."""
    decl = "torch::Tensor f(torch::Tensor a, double eps); // a {comment}\n/* #define X */"
    plain = build.main_cpp_source([decl], ["f"], True)
    slim, header = build.fast_main_cpp(plain, [decl])
    assert header == "torch/python.h" and slim.splitlines()[0] == "#include <torch/python.h>"
    assert slim.splitlines()[1:] == plain.splitlines()[1:]
    for kept in ("torch::Tensor f(torch::Tensor a) { return a; }",
                 "#include <vector>\ntorch::Tensor f(torch::Tensor a);", "torch::Tensor f(torch::nn::Module m);"):
        main = build.main_cpp_source([kept], ["f"], True)
        assert build.fast_main_cpp(main, [kept]) == (main, "torch/extension.h")


def test_cudabuild_extension_h_adds_no_pybind11_beyond_python_h():
    """Why the slim main.cpp binds as plain's does: <torch/extension.h> is <torch/all.h> + <torch/python.h>, and no
    header of torch's C++ API but python.h mentions pybind11 (a type caster seen by one build and not the other would
    convert arguments differently)."""
    inc = build.torch_include_dir()
    text = open(os.path.join(inc, "torch", "extension.h")).read()
    assert re.findall(r"#include <([\w/.]+)>", text) == ["torch/all.h", "torch/python.h"]
    api = os.path.join(inc, "torch", "csrc", "api", "include")
    mentions = [os.path.relpath(os.path.join(d, f), api) for d, _, files in os.walk(api) for f in files
                if "pybind11" in open(os.path.join(d, f), errors="replace").read()]
    assert mentions == [os.path.join("torch", "python.h")], mentions


@pytest.mark.skipif(shutil.which("g++") is None or not os.path.exists(
    os.path.join(sysconfig.get_path("include"), "Python.h")), reason="needs g++ and Python's headers")
def test_cudabuild_slim_main_cpp_binds_like_plain_on_the_cpu(tmp_path):
    """The slim main.cpp (<torch/python.h>) built for real, without CUDA (a C++ body in a second file stands in for
    the .cu), imported and called: the result is right, a wrong argument type is pybind11's TypeError and a failed
    TORCH_CHECK a RuntimeError carrying its message, as with plain's bindings (~30 s of CPU)."""
    from torch.utils import cpp_extension
    decl = "torch::Tensor twice(torch::Tensor a);"
    main, header = build.fast_main_cpp(build.main_cpp_source([decl], ["twice"], True), [decl])
    assert header == "torch/python.h"
    (tmp_path / "main.cpp").write_text(main)
    (tmp_path / "impl.cpp").write_text("#include <ATen/core/Tensor.h>\n#include <ATen/ops/mul.h>\n"
                                       "namespace torch { using at::Tensor; }\n"
                                       "torch::Tensor twice(torch::Tensor a) {\n"
                                       "  TORCH_CHECK(a.dim() == 1, \"twice wants 1-D, got \", a.dim());\n"
                                       "  return at::mul(a, 2); }\n")
    module = cpp_extension.load("kz_slim_twice", [str(tmp_path / "main.cpp"), str(tmp_path / "impl.cpp")],
                                build_directory=str(tmp_path), with_cuda=False)
    x = torch.arange(4.0)
    assert torch.equal(module.twice(x), 2 * x)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        module.twice("not a tensor")
    with pytest.raises(RuntimeError, match="twice wants 1-D, got 2"):
        module.twice(torch.ones(2, 2))


def test_cudabuild_pch_built_once_skipped_when_locked_or_failing(tmp_path, monkeypatch):
    import fcntl
    fake_cxx, log = tmp_path / "fake-c++", tmp_path / "runs.log"   # writes its -o file; exit status $KZ_FAKE_RC
    fake_cxx.write_text(f'#!/bin/sh\necho run >> {log}\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && echo pch > "$2"; shift; '
                        'done\nexit ${KZ_FAKE_RC:-0}\n')
    fake_cxx.chmod(0o755)
    runs = lambda: len(log.read_text().split()) if log.exists() else 0   # noqa: E731
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path / "cache"))
    build.tool_versions()   # (cached) asks the real compilers for their versions, before we swap in the fake
    monkeypatch.setattr(build.cpp_extension, "get_cxx_compiler", lambda: str(fake_cxx))
    monkeypatch.setattr(build, "host_flags", lambda cflags, includes: ["-fPIC", *cflags])
    root = build.ensure_pch([], [])
    assert root and open(os.path.join(root, "torch", "extension.h.gch")).read() == "pch\n"
    assert build.ensure_pch([], []) == root and runs() == 1             # built once, then found
    locked = build.ensure_pch(["-O3"], [])                              # learn the -O3 directory, then empty it
    shutil.rmtree(locked)
    os.makedirs(locked)
    with open(os.path.join(locked, "lock"), "w") as held:               # someone else is building it
        fcntl.flock(held, fcntl.LOCK_EX)
        assert build.ensure_pch(["-O3"], []) is None and runs() == 2    # compile without it, do not wait
    monkeypatch.setenv("KZ_FAKE_RC", "1")
    assert build.ensure_pch(["-O2"], []) is None and build.ensure_pch(["-O2"], []) is None
    assert runs() == 3                                                  # a failing PCH build is not retried
    assert build.ensure_pch(["-g"], [], max_pchs=3) is None and runs() == 3   # the disk cap
    monkeypatch.delenv("KZ_FAKE_RC")
    slim = build.ensure_pch([], [], header="torch/python.h")             # the bindings' half: its own PCH,
    assert slim != root and os.path.exists(os.path.join(slim, "torch", "python.h.gch")) and runs() == 4
    assert build.ensure_pch([], [], header="torch/python.h") == slim and runs() == 4


def _cudabuild_patch(monkeypatch, tmp_path, fast=None, plain=None):
    """Point the cache at tmp_path, skip the PCH, and replace the two compilers; returns the call log."""
    calls = []
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "ensure_pch", lambda *a, header="torch/extension.h", **k: str(tmp_path / "pch" / header))
    monkeypatch.setattr(build, "import_built", lambda name, so: _cudabuild_fake_module(so))

    def fake_load(name, sources, **kw):
        calls.append(("fast", sources, kw))
        if fast:
            raise RuntimeError(fast)
        return _cudabuild_fake_module(os.path.join(kw["build_directory"], name + ".so"))

    def fake_plain(**kw):
        calls.append(("plain", None, kw))
        if plain:
            raise RuntimeError(plain)
        return _cudabuild_fake_module(os.path.join(kw["build_directory"], kw["name"] + ".so"))

    monkeypatch.setattr(build.cpp_extension, "load", fake_load)
    monkeypatch.setattr(build, "PLAIN_LOAD_INLINE", fake_plain)
    return calls


def test_cudabuild_fast_path_flags_and_warm_cache(tmp_path, monkeypatch):
    calls = _cudabuild_patch(monkeypatch, tmp_path)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    module = build.fast_load_inline(**_cudabuild_example_pieces(), extra_cuda_cflags=["-O3"])
    assert module.__kz_build__ == "fast" and [c[0] for c in calls] == ["fast"]
    sources, kw = calls[0][1], calls[0][2]
    assert kw["extra_cflags"][0] == f"-I{tmp_path / 'pch' / 'torch/python.h'}"   # (declarations only: the slim one)
    assert open(sources[0]).read().startswith("#include <torch/python.h>\n")
    assert kw["extra_cuda_cflags"] == ["-gencode=arch=compute_90,code=sm_90", "-O3"]
    cu = open(sources[1]).read()
    assert "#include <ATen/core/Tensor.h>" in cu and "ATen/ops/empty_like.h" in cu
    assert not re.search(r"^\s*#include <torch/extension.h>", cu, re.M)
    assert os.path.dirname(sources[0]).startswith(str(tmp_path / "builds"))
    again = build.fast_load_inline(**_cudabuild_example_pieces(), extra_cuda_cflags=["-O3"])
    assert again.__kz_build__ == "cached-fast" and len(calls) == 1   # warm: no compiler at all
    other = build.fast_load_inline(**_cudabuild_example_pieces())     # other flags: another directory
    assert other.__kz_build__ == "fast" and len(calls) == 2 and calls[1][1][0] != sources[0]


def test_cudabuild_falls_back_to_plain_when_fast_fails(tmp_path, monkeypatch):
    calls = _cudabuild_patch(monkeypatch, tmp_path, fast="Error building extension 'x': cuda.cu(9): error: boom")
    module = build.fast_load_inline(**_cudabuild_example_pieces())
    assert module.__kz_build__ == "plain" and [c[0] for c in calls] == ["fast", "plain"]
    plain_kw = calls[1][2]
    assert plain_kw["build_directory"].endswith("plain") and plain_kw["cuda_sources"] == \
        _cudabuild_example_pieces()["cuda_sources"]   # the candidate's own sources, untouched
    assert build.fast_load_inline(**_cudabuild_example_pieces()).__kz_build__ == "cached-plain" and len(calls) == 2


def test_cudabuild_compile_failure_is_plain_verdict_and_cached(tmp_path, monkeypatch):
    error = "Error building extension 'x': cuda.cu(9): error: identifier \"y\" is undefined"
    calls = _cudabuild_patch(monkeypatch, tmp_path, fast=error, plain=error)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="is undefined"):
            build.fast_load_inline(**_cudabuild_example_pieces())
    assert [c[0] for c in calls] == ["fast", "plain"]   # the second call answered from the cache
    # a killed build (no compiler error in the message) is not cached: the next call builds again
    calls = _cudabuild_patch(monkeypatch, tmp_path, fast="Killed", plain="Error building extension 'x': Killed")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            build.fast_load_inline(**_cudabuild_example_pieces(), extra_cflags=["-DX"])
    assert [c[0] for c in calls] == ["fast", "plain"] * 2


def test_cudabuild_unusual_sources_go_straight_to_plain(tmp_path, monkeypatch):
    calls = _cudabuild_patch(monkeypatch, tmp_path)
    pieces = _cudabuild_example_pieces()
    pieces["cuda_sources"] += "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &elementwise_add_cuda); }\n"
    assert build.fast_load_inline(**pieces).__kz_build__ == "plain" and [c[0] for c in calls] == ["plain"]
    assert build.fast_load_inline(**_cudabuild_example_pieces(), no_implicit_headers=True).__kz_build__ == "plain"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compile only, no GPU)")
def test_cudabuild_prelude_compiles_with_nvcc(tmp_path):
    """The fast .cu of the one-shot example, of a golden solution with two launches and of a synthetic GEMM pair
    compiles with nvcc and torch's flags (~15 s of CPU each), their launches on PyTorch's current stream included.
    A CPU build of torch ships c10/cuda's headers without the one a CUDA build generates
    (c10/cuda/impl/cuda_cmake_macros.h, one line for a shared-library build): written here when it is missing."""
    from torch.utils import cpp_extension
    from kernelbench_tasks import synth
    inc = build.torch_include_dir()
    extra = []
    if not os.path.exists(os.path.join(inc, "c10", "cuda", "impl", "cuda_cmake_macros.h")):
        (tmp_path / "c10" / "cuda" / "impl").mkdir(parents=True)
        (tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(
            "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        extra = ["-isystem", str(tmp_path)]
    golden = open(os.path.join(ROOT, "kernelbench_tasks", "solutions", "level2", "002_MatmulSoftmax_cuda.py")).read()
    gemm = next(p for p in synth.generate_pairs(40, "cuda", seed=11, verify=False)[0] if p["kind"] == "gemm")
    sources = {"example": _cudabuild_example_pieces()["cuda_sources"],
               "golden": re.search(r'cuda_source = r"""(.*?)"""', golden, re.S).group(1),
               "synth": re.search(r'cuda_source = r"""(.*?)"""', gemm["solution"], re.S).group(1)}
    for name, source in sources.items():
        assert "c10::cuda::getCurrentCUDAStream()" in source, name
        cu = tmp_path / f"{name}.cu"
        cu.write_text(build.fast_cuda_source([source]))
        cmd = (["nvcc", "-DTORCH_EXTENSION_NAME=kz_" + name, "-DTORCH_API_INCLUDE_EXTENSION_H", *extra,
                "-isystem", inc, "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"),
                "-isystem", sysconfig.get_path("include")] + cpp_extension.COMMON_NVCC_FLAGS
               + ["-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC", build.torch_cxx_std(),
                  "-c", str(cu), "-o", str(tmp_path / f"{name}.o")])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        assert "warning" not in proc.stderr, (name, proc.stderr[-3000:])   # the prelude itself is quiet


def test_cudabuild_bench_candidates_are_distinct_and_labelled():
    import bench
    pairs = bench.candidates("cuda", 10, "t", n=4096, rows=8, cols=64) + bench.candidates("triton", 10, "t", n=4096)
    assert len({c for _, c, _ in pairs}) == 20
    labels = [label for _, _, label in pairs]
    assert {"ok", "wrong", "fail"} == set(labels) and labels.count("ok") >= 10
    other_run = bench.candidates("cuda", 10, "u", n=4096, rows=8, cols=64)
    assert not {c for _, c, _ in other_run} & {c for _, c, _ in pairs}   # the run tag changes every source
    # the cold section's --cold-stream: the launch and its header as the one-shot example (c10) or ATen write them
    for stream, header, call in (("c10", "c10/cuda/CUDAStream.h", "c10::cuda::getCurrentCUDAStream()"),
                                 ("aten", "ATen/cuda/CUDAContext.h", "at::cuda::getCurrentCUDAStream()")):
        src = bench.cuda_elementwise("add", "t", "ok", 256, False, [], stream=stream)["cuda_sources"]
        assert f"#include <{header}>" in src and f"<<<(n + 256 - 1) / 256, 256, 0, {call}>>>" in src, stream
    legacy = bench.cuda_elementwise("add", "t", "ok", 256, False, [])["cuda_sources"]
    assert "<<<(n + 256 - 1) / 256, 256>>>" in legacy and "getCurrentCUDAStream" not in legacy
    with pytest.raises(ValueError):
        bench.cuda_elementwise("add", "t", "ok", 256, False, [], stream="at")
    assert bench.parse_args(["harness", "--cold-stream", "c10"]).cold_stream == "c10"
    with pytest.raises(SystemExit):   # a clear argparse error at once
        bench.parse_args(["harness", "--cold-stream", "at"])


def test_cudabuild_bench_triton_candidates_get_their_labels_on_cpu():
    """bench.py's labels are what the harness says (Triton under the interpreter, tiny sizes)."""
    import bench
    import eval_harness
    pairs = bench.candidates("triton", 5, "cpu-test", n=4096, rows=16, cols=64)   # labels ok, ok, wrong, ok, fail
    with eval_harness.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, trials=1) as ev:
        results = ev.map([(r, c) for r, c, _ in pairs])
    assert [bench.coarse(r.error_kind) for r in results] == [label for _, _, label in pairs], \
        [(r.error_kind, r.error[:200]) for r in results]


def test_cudabuild_triton_example_is_correct_on_cpu():
    import eval_harness
    ref = open(os.path.join(ROOT, "cuda_ext", "example_ref.py")).read()
    cand = open(os.path.join(ROOT, "cuda_ext", "example_triton.py")).read()
    result = eval_harness.evaluate(ref, cand, backend="triton", device="cpu", trials=1)
    assert result.error_kind == "ok", result.error


# ---------------------------------------------------------------------------------------------------------------------
# GPU tests (skipped without a GPU)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudabuild_gpu_fast_build_runs_and_matches(tmp_path):
    # a cold build in a fresh directory (the machine's PCH in cache_root() is reused, or built once here)
    ext = build.fast_load_inline(**_cudabuild_example_pieces(), build_directory=str(tmp_path))
    assert ext.__kz_build__ == "fast"   # not the plain fallback
    a, b = torch.randn(100_003, device="cuda"), torch.randn(100_003, device="cuda")
    torch.testing.assert_close(ext.elementwise_add_cuda(a, b), a + b)
    again = build.fast_load_inline(**_cudabuild_example_pieces(), build_directory=str(tmp_path))
    assert again.__kz_build__ == "cached-fast"
    torch.testing.assert_close(again.elementwise_add_cuda(a, b), a + b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudabuild_gpu_source_that_fails_plain_fails_fast(tmp_path):
    """A kernel that uses the CUDA stream API without including its header: plain fails, so fast must too."""
    pieces = _cudabuild_example_pieces()
    assert "#include <c10/cuda/CUDAStream.h>\n" in pieces["cuda_sources"]
    pieces["cuda_sources"] = pieces["cuda_sources"].replace("#include <c10/cuda/CUDAStream.h>\n", "")
    with pytest.raises(RuntimeError):
        build.PLAIN_LOAD_INLINE(**pieces, build_directory=str(tmp_path))
    with pytest.raises(RuntimeError):
        build.fast_load_inline(**pieces, build_directory=str(tmp_path / "fast"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudabuild_gpu_examples_are_correct_candidates():
    import eval_harness
    ref = open(os.path.join(ROOT, "cuda_ext", "example_ref.py")).read()
    for backend in ("cuda", "triton"):
        cand = open(os.path.join(ROOT, "cuda_ext", f"example_{backend}.py")).read()
        result = eval_harness.evaluate(ref, cand, backend=backend)
        assert result.error_kind == "ok", (backend, result.error)
        # both launch on PyTorch's current stream (CUDA: c10::cuda::getCurrentCUDAStream()), so both are timed as
        # CUDA graph replays, with no host latency inside the timed window
        assert result.details["timing_method"] == "graph", (backend, result.details)
