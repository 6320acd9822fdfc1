"""Pretrained-model decoding and fine-tuning: jaxil against transformers on
the same weights, side by side in one run.

Models (``--models``):

- ``gpt2-tiny``: a random GPT-2 (vocabulary 512, d 64, 2 layers, 2 heads,
  learned positions, tied head), made locally with transformers' config
  class and saved as an HF directory that jaxil then loads;
- ``llama-tiny``: a random Llama (vocabulary 512, d 64, 2 layers, 4 heads,
  2 key/value heads, SwiGLU 256, RoPE, untied head), the same way;
- ``smollm2``: SmolLM2-135M-Instruct from its shipped GGUF (dequantized to
  float32; transformers loads the same file with ``gguf_file=``).

Without torch and transformers the tiny models are jaxil's own random
initialisation and the peer's columns are empty (the JSON says why).

Each engine runs in a process of its own, started afresh for each model
(:mod:`benchmarks.side_process`): jaxil in one, transformers in another,
llama.cpp in a third. The parent orders the timings, one call at a time,
so no two engines ever run at once, and no engine shares its process with
another's threads, allocator or caches (in one process with the
transformers model, jaxil's SmolLM2 prefill at B = 256 timed 14.8 s; alone,
10.9 s). At each batch B (``--batches``) every row gets a random prompt of
``--prompt`` tokens (the same for both sides) and the sides are timed
alternately (:func:`benchmarks.token_rollout.time_sides`: compiled ahead,
one warm-up, medians over the repeats, ``block_until_ready``, each timed by
the process that runs it):

- ``jaxil_prefill``: the prompts through
  [`Transformer.decode`][jaxil.nn.transformer.Transformer.decode] into an
  empty cache, one pass (``fresh``: the prompt attends to itself), logits at
  each row's last token; ``hf_prefill_t1`` / ``_t2``: the model's forward
  pass over the prompts with ``use_cache=True`` and ``logits_to_keep=1``
  (the head at the last position only, as ``generate``'s own prefill;
  ``inference_mode``) at 1 and 2 torch threads.
- ``jaxil_generate``: [`jaxil.nn.generate.generate`][jaxil.nn.generate.generate]'s
  compiled program, greedy, ``--new`` tokens per row (no stop token);
  ``hf_generate_t1`` / ``hf_generate_t2``: transformers' ``generate``,
  greedy (``do_sample=False``), ``min_new_tokens = max_new_tokens``, its KV
  cache, at 1 and at 2 torch threads (the peer's speed depends on its
  thread count on a shared machine; the ratio takes its best; a thread
  count whose first timed round is more than 1.5× the other's is not timed
  further (generate only; both prefills are timed, since decode subtracts
  the prefill at the thread count of the best generate),
  ``SLOWER_BY`` of :func:`~benchmarks.token_rollout.time_sides`).
  Both include the prefill; ``decode tokens/s`` is ``B × new`` over the
  generate time minus the same side's prefill time (the peer's at the
  thread count of its best generate). The warm-up outputs of
  the two generates are compared token for token (``greedy_tokens_equal``).
- ``llamacpp_prefill`` / ``llamacpp_generate`` (SmolLM2 at B = 1, where
  ``llama-cpp-python`` imports): llama.cpp on the same GGUF, greedy, 2
  threads. It runs the file's quantized kernels (Q4_1, Q8_0) where the
  other sides run float32, so it is a reference, not a ratio target.
- ``sft`` (``--sft``, once per model at ``--sft-batch`` × ``--sft-len``):
  one full fine-tuning step — next-token cross-entropy over every token,
  its gradient and an AdamW update — jitted in jaxil
  ([`Transformer.logits`][jaxil.nn.transformer.Transformer.logits], optax),
  against ``loss.backward()`` and ``torch.optim.AdamW.step()``.

Also recorded per row: the KV cache's bytes (``2 · L · B · H_kv · C · D`` in
the compute dtype, C = prompt + new − 1), XLA's temporary bytes of the
generate program, and, for SmolLM2, how close decode comes to the
machine: at B ≥ 64 the FLOP/s (2 × the parameters in the matrix products
+ attention, per token) as a fraction of a 1024² float32 ``jnp.dot`` timed
in the same run, and at B = 1 the weight bytes read per second as a
fraction of a streaming read (a jitted sum over 512 MB) timed in the same
run. For SmolLM2 (``argmax``): the milliseconds of a greedy choice over
``[B, 49152]`` logits, ``jnp.argmax`` against
[`greedy_tokens`][jaxil.nn.generate.greedy_tokens]. ``--rss`` measures the
peak resident memory of a child process that loads SmolLM2 and generates at
B = 64 (jaxil alone).

    python benchmarks/decode_engine.py                          # every model, B = 1 … 512
    python benchmarks/decode_engine.py --quick                  # tiny models, B = 1, 8
    python benchmarks/decode_engine.py --models smollm2 --batches 1 64 --new 32

Writes ``benchmarks/results/decode_engine-<host>-<date>.json`` and prints a
table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxil.nn.generate import Sampling, attention_block, greedy_tokens, make_generate
from jaxil.nn.pretrained_params import from_pretrained
from jaxil.nn.transformer import Transformer, TransformerConfig
from jaxil.runs import measure as M

try:
    from benchmarks.side_process import SideProcess
    from benchmarks.token_rollout import SideSpec, Skip, compiled_call, peer_unavailable, time_sides
except ImportError:  # run as a script: its own folder is on sys.path, the repository root is not
    from side_process import SideProcess
    from token_rollout import SideSpec, Skip, compiled_call, peer_unavailable, time_sides

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODELS = ("gpt2-tiny", "llama-tiny", "smollm2")
DEFAULT_BATCHES = (1, 8, 64, 256, 512)
QUICK = {"models": ("gpt2-tiny", "llama-tiny"), "batches": (1, 8), "repeats": 2,
         "target_s": 0.5, "new": 16}
TINY_VOCAB = 512


# -- the models --------------------------------------------------------------------------


def _tiny_hf(kind: str, context: int, out: Path):
    """A random tiny transformers model of ``kind`` saved under ``out``."""
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2-tiny":
        cfg = transformers.GPT2Config(vocab_size=TINY_VOCAB, n_positions=context, n_embd=64,
                                      n_layer=2, n_head=2, activation_function="gelu_new",
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=None, eos_token_id=None)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64,
                                       intermediate_size=256, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=context, rope_theta=10000.0,
                                       tie_word_embeddings=False, bos_token_id=None,
                                       eos_token_id=None)
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(torch.float32).eval()
    model.save_pretrained(out)
    return model


def load_jaxil(name: str, context: int, hf_dir: Optional[Path]) -> tuple[TransformerConfig, Any, str]:
    """``(config, params, source)`` of jaxil's side of a model at this
    context length: SmolLM2 from its GGUF, a tiny model from the peer's saved
    directory ``hf_dir`` (the same weights), or, without one, jaxil's own
    random initialisation."""
    if name == "smollm2":
        from jaxil.pretrained import resolve

        path = resolve("smollm2-135m-instruct")
        config, params = from_pretrained(path, max_context=context)
        return config, params, str(path)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODELS)}")
    if hf_dir is not None:
        config, params = from_pretrained(hf_dir, max_context=context)
        return config, params, "transformers random init (seed 0)"
    arch = dict(vocab_size=TINY_VOCAB, token_width=1, max_context=context, d_model=64,
                num_layers=2, pad_id=None)
    if name == "gpt2-tiny":
        config = TransformerConfig(num_heads=2, tie_head=True, **arch)
    else:
        config = TransformerConfig(num_heads=4, num_kv_heads=2, head_size=16, fused_qkv=False,
                                   norm="rmsnorm", positions="rope", mlp="swiglu",
                                   activation="silu", d_ff=256, qkv_bias=False, out_bias=False,
                                   mlp_bias=False, ln_eps=1e-6, **arch)
    return config, Transformer(config).init(jax.random.key(0)), "jaxil random init"


def load_peer(name: str, context: int, workdir: Path):
    """transformers' side of a model: SmolLM2 from the same GGUF, or a tiny
    random model, saved under ``workdir / name`` for jaxil to load."""
    if name == "smollm2":
        import torch
        import transformers

        from jaxil.pretrained import resolve

        path = resolve("smollm2-135m-instruct")
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODELS)}")
    return _tiny_hf(name, context, workdir / name)


# -- accounting --------------------------------------------------------------------------


def kv_cache_bytes(config: TransformerConfig, batch: int) -> int:
    """Bytes of the decode engine's KV cache for `batch` rows."""
    item = jnp.dtype(config.dtype).itemsize
    return 2 * config.num_layers * batch * config.kv_heads * config.max_context \
        * config.head_dim * item


def matmul_params(config: TransformerConfig) -> int:
    """Parameters a token passes through in matrix products: the blocks'
    projections and the output head (not the embedding lookup, norms or
    biases)."""
    d, f, H, G, D = (config.d_model, config.mlp_width, config.num_heads, config.kv_heads,
                     config.head_dim)
    attn = d * (H + 2 * G) * D + H * D * d
    mlp = (3 if config.mlp == "swiglu" else 2) * d * f
    return config.num_layers * (attn + mlp) + d * config.vocab_size


def decode_flops_per_token(config: TransformerConfig, attended: float) -> float:
    """FLOPs of one decode step per row: ``2 ×`` the matrix-product
    parameters plus attention's two products over ``attended`` slots."""
    return 2.0 * matmul_params(config) \
        + 4.0 * config.num_layers * config.num_heads * config.head_dim * attended


def weight_bytes(params: Any) -> int:
    """Bytes of every parameter (what a B = 1 decode step reads)."""
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(params)))


def stream_read_gbps(megabytes: int = 512, repeats: int = 5) -> float:
    """GB/s of a jitted sum over a float32 array of `megabytes`: the rate
    at which this machine streams memory it does not cache."""
    x = jnp.ones((megabytes * 2 ** 20 // 4,), jnp.float32)
    f, _ = M.compile_ahead(jnp.sum, x)
    t = M.time_call(f, x, warmup=1, repeats=repeats)
    return x.nbytes / t.median_s / 1e9


# -- the sides ---------------------------------------------------------------------------


def jaxil_prefill(config: TransformerConfig) -> Callable:
    """``(params, prompts [B, T]) -> (logits [B, V], lengths [B])``: the
    prompts into an empty cache in one pass attending to themselves (what
    `generate` does before decoding)."""
    net = Transformer(config)

    def run(params, prompts):
        logits, cache = net.decode(params, prompts, net.empty_cache(prompts.shape[:1]),
                                   fresh=True)
        return logits, cache.length

    return run


def sft_step(config: TransformerConfig, tx: optax.GradientTransformation) -> Callable:
    """``(params, opt_state, tokens [B, T]) -> (params, opt_state, loss)``:
    next-token cross-entropy over every position, one AdamW update."""
    net = Transformer(config)

    def loss_fn(params, tokens):
        logits = net.logits(params, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


class Peer:
    """transformers' side of one model: prefill, generate and an SFT step."""

    def __init__(self, model):
        import torch

        self.torch, self.model = torch, model
        self.threads_before = torch.get_num_threads()

    def prefill(self, prompts: np.ndarray, threads: int) -> Callable:
        torch = self.torch
        ids = torch.as_tensor(prompts, dtype=torch.long)

        def run():
            torch.set_num_threads(threads)
            with torch.inference_mode():
                # Logits at the last position only, as `generate`'s own prefill
                # (without it the head runs over every position: at SmolLM2's
                # B = 512 a [512, 32, 49152] float32 array, 3.2 GB).
                return self.model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[:, -1]

        return run

    def generate(self, prompts: np.ndarray, new: int, threads: int) -> Callable:
        torch = self.torch
        from transformers import GenerationConfig

        ids = torch.as_tensor(prompts, dtype=torch.long)
        mask = torch.ones_like(ids)
        gen = GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new,
                               use_cache=True, pad_token_id=0, eos_token_id=None,
                               bos_token_id=None, temperature=None, top_p=None, top_k=None)

        def run():
            torch.set_num_threads(threads)
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask,
                                          generation_config=gen)
            return out[:, ids.shape[1]:].numpy()

        return run

    def sft(self, tokens: np.ndarray, lr: float) -> Callable:
        torch = self.torch
        ids = torch.as_tensor(tokens, dtype=torch.long)
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)

        def run():
            torch.set_num_threads(2)
            self.model.train()
            opt.zero_grad(set_to_none=True)
            logits = self.model(input_ids=ids[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            self.model.eval()
            return float(loss.detach())

        return run


def llamacpp_unavailable() -> Optional[str]:
    """Why llama.cpp cannot run here (None when it can)."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a missing or broken install is a reason
        return f"llama-cpp-python not importable ({type(e).__name__}: {str(e)[:120]})"
    return None


class LlamaCpp:
    """llama.cpp (`llama-cpp-python`) on the same GGUF, one sequence at a
    time: a reference row (it runs the file's quantized kernels, Q4_1 and
    Q8_0, where the other sides run float32)."""

    def __init__(self, path: str, context: int, threads: int = 2):
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=context, n_threads=threads,
                         n_threads_batch=threads, n_batch=512, verbose=False)

    def prefill(self, prompts: np.ndarray) -> Callable:
        def run():
            for row in prompts:
                self.llm.reset()
                self.llm.eval(row.tolist())
            return np.zeros(())
        return run

    def generate(self, prompts: np.ndarray, new: int) -> Callable:
        def run():
            out = []
            for row in prompts:
                toks = []
                for t in self.llm.generate(row.tolist(), temp=0.0, top_k=1, repeat_penalty=1.0,
                                           reset=True):
                    toks.append(t)
                    if len(toks) == new:
                        break
                out.append(toks)
            return np.asarray(out)
        return run


# -- the processes -----------------------------------------------------------------------
#
# Each engine runs in a process of its own (benchmarks.side_process): jaxil in
# one, transformers in another, llama.cpp in a third, started afresh for each
# model; the parent only orders the timings. These functions run in those
# processes; `state` holds the loaded model.


def proc_probe(state: dict) -> dict[str, Any]:
    """What this machine can run besides jaxil: the peer's and llama.cpp's
    versions, or the reason each is skipped."""
    out: dict[str, Any] = {"peer": {"skipped": peer_unavailable()},
                           "llamacpp": {"skipped": llamacpp_unavailable()}}
    if out["peer"]["skipped"] is None:
        import torch
        import transformers

        out["peer"].update(torch=torch.__version__, transformers=transformers.__version__,
                           threads_before=torch.get_num_threads())
    if out["llamacpp"]["skipped"] is None:
        import llama_cpp

        out["llamacpp"]["version"] = llama_cpp.__version__
    return out


def proc_limits(state: dict) -> dict[str, Any]:
    return machine_limits()


def proc_argmax(state: dict, *, batches: list[int], vocab: int, repeats: int,
                seed: int) -> list[dict[str, Any]]:
    return [measure_argmax(b, vocab, repeats, seed) for b in batches]


def proc_load(state: dict, *, engine: str, name: str, context: int, workdir: str,
              block: Optional[int] = None, attended: float = 0.0) -> dict[str, Any]:
    """Load ``name`` into this process for ``engine`` ("jaxil", "hf" or
    "llamacpp"); for jaxil, the facts the parent's accounting needs."""
    if engine == "hf":
        import transformers

        transformers.logging.set_verbosity_error()
        state["peer"] = Peer(load_peer(name, context, Path(workdir)))
        return {}
    if engine == "llamacpp":
        from jaxil.pretrained import resolve

        state["cpp"] = LlamaCpp(str(resolve("smollm2-135m-instruct")), context)
        return {}
    hf_dir = Path(workdir) / name
    config, params, source = load_jaxil(name, context, hf_dir if (hf_dir / "config.json").exists()
                                        else None)
    state.update(config=config, params=params)
    return {"source": source,
            "num_params": int(sum(np.asarray(x).size for x in jax.tree.leaves(params))),
            "matmul_params": matmul_params(config), "weight_bytes": weight_bytes(params),
            "layers": config.num_layers, "d_model": config.d_model,
            "heads": config.num_heads, "kv_heads": config.kv_heads,
            "vocab": config.vocab_size, "max_context": config.max_context,
            "block": attention_block(config, block),
            "kv_cache_bytes_per_row": kv_cache_bytes(config, 1),
            "decode_flops_per_token": decode_flops_per_token(config, attended)}


def proc_prepare(state: dict, info: dict[str, Any], *, side: str, tokens: list,
                 new: int = 1, seed: int = 0, block: Optional[int] = None,
                 lr: float = 1e-5) -> Callable[[], Any]:
    """The call of one side, in the process that holds its engine:
    ``jaxil_prefill`` / ``jaxil_generate`` / ``jaxil_sft``,
    ``hf_prefill_t{n}`` / ``hf_generate_t{n}`` (n torch threads) /
    ``hf_sft``, ``llamacpp_prefill`` / ``llamacpp_generate``. ``tokens`` are
    the prompts (the SFT batch for ``*_sft``)."""
    ids = np.asarray(tokens, np.int32)
    engine, what = side.split("_", 1)
    if engine == "jaxil":
        config, params = state["config"], state["params"]
        if what == "prefill":
            return compiled_call(jaxil_prefill(config), (params, jnp.asarray(ids)), info, "fp32")
        if what == "generate":
            run = make_generate(config, new, Sampling(), (), -1, attention_block(config, block))
            return compiled_call(run, (params, jnp.asarray(ids),
                                       jnp.full((ids.shape[0],), ids.shape[1], jnp.int32),
                                       jax.random.key(seed)), info, "fp32")
        tx = optax.adamw(lr, weight_decay=0.0)
        return compiled_call(sft_step(config, tx), (params, jax.jit(tx.init)(params),
                                                    jnp.asarray(ids)), info, "fp32")
    info["compile_s"] = None
    if engine == "llamacpp":
        cpp = state["cpp"]
        return cpp.prefill(ids) if what == "prefill" else cpp.generate(ids, new)
    peer = state["peer"]
    if what == "sft":
        return peer.sft(ids, lr)
    what, threads = what.rsplit("_t", 1)
    if what == "prefill":
        return peer.prefill(ids, int(threads))
    return peer.generate(ids, new, int(threads))


# -- the parent --------------------------------------------------------------------------


def _sides(procs: dict[str, SideProcess], why: dict[str, str]):
    """``spec(name, count, keep=None, **kwargs)``: a SideSpec (``count``
    tokens per call) whose call is
    prepared and timed in the process of its engine (the name's prefix),
    skipped with ``why[engine]`` when that engine has no process."""

    def spec(name: str, count: int, keep: Optional[Callable] = None,
             group: Optional[str] = None, **kwargs) -> SideSpec:
        engine = name.split("_", 1)[0]

        def prepare(info):
            if engine not in procs:
                raise Skip(why.get(engine) or f"{engine} unavailable")
            return procs[engine].prepare(name, "proc_prepare", info, keep_output=keep is not None,
                                         side=name, **kwargs)

        return SideSpec(name, count, prepare, keep, group)

    return spec


def measure_point(name: str, batch: int, *, procs: dict[str, SideProcess], why: dict[str, str],
                  facts: dict[str, Any], prompt: int, new: int, repeats: int, target_s: float,
                  max_call_s: float, history: dict, deadline: float, block: Optional[int],
                  seed: int, llamacpp: bool = False, log=print) -> dict[str, Any]:
    """One model at one batch: prefill and generate on both sides (and on
    llama.cpp, when asked, as a reference), each in its engine's process."""
    rng = np.random.default_rng(seed + batch)
    prompts = rng.integers(1, facts["vocab"], size=(batch, prompt)).astype(np.int32)
    row: dict[str, Any] = {"model": name, "batch": batch, "prompt": prompt, "new": new,
                           "block": facts["block"],
                           "kv_cache_bytes": facts["kv_cache_bytes_per_row"] * batch}
    outputs: dict[str, np.ndarray] = {}

    def keep(side):
        def check(info, out):
            outputs[side] = np.asarray(out)
        return check

    spec = _sides(procs, why)
    p = prompts.tolist()
    specs = [spec("jaxil_prefill", batch * prompt, tokens=p),
             # Both prefill thread counts are always timed: decode subtracts the
             # prefill at the thread count of the peer's best generate.
             spec("hf_prefill_t1", batch * prompt, tokens=p),
             spec("hf_prefill_t2", batch * prompt, tokens=p),
             spec("jaxil_generate", batch * new, keep("jaxil_generate"), tokens=p, new=new,
                  seed=seed, block=block),
             spec("hf_generate_t1", batch * new, keep("hf_generate_t1"), group="hf_generate",
                  tokens=p, new=new),
             spec("hf_generate_t2", batch * new, keep("hf_generate_t2"), group="hf_generate",
                  tokens=p, new=new)]
    if llamacpp and "llamacpp" in procs:
        specs += [spec("llamacpp_prefill", batch * prompt, tokens=p),
                  spec("llamacpp_generate", batch * new, keep("llamacpp_generate"), tokens=p,
                       new=new)]
    row["sides"] = sides = time_sides(specs, batch, repeats=repeats, target_s=target_s,
                                      max_call_s=max_call_s, history=history, deadline=deadline)
    for engine, proc in procs.items():  # free the programs and buffers of this batch
        for s in specs:
            if s.name.startswith(engine + "_"):
                proc.request("drop", side=s.name)
    if "jaxil_generate" in outputs:
        for hf in ("hf_generate_t1", "hf_generate_t2"):
            if hf in outputs:
                row["greedy_tokens_equal"] = bool(np.array_equal(outputs["jaxil_generate"],
                                                                 outputs[hf]))
                row["greedy_tokens_agree"] = float(np.mean(outputs["jaxil_generate"]
                                                           == outputs[hf]))
                break
    tps = {k: v.get("tokens_per_s") for k, v in sides.items() if not v.get("skipped")}
    secs = {k: v.get("call_s") for k, v in sides.items() if not v.get("skipped")}
    row.update({f"{k}_tokens_per_s": v for k, v in tps.items()})
    # The peer at its best thread count: generate's, and prefill's own.
    for what in ("generate", "prefill"):
        opts = [k for k in (f"hf_{what}_t1", f"hf_{what}_t2") if k in tps]
        if opts:
            best = max(opts, key=lambda k: tps[k])
            row[f"hf_{what}_threads"] = int(best[-1])
            row[f"hf_{what}_tokens_per_s"] = tps[best]
    # Decode = generate minus the same side's prefill (the peer's at the
    # thread count of its best generate); None when the difference is
    # within the timing noise (under 5 % of generate).
    pairs = [("jaxil", "jaxil_prefill", "jaxil_generate")]
    if "hf_generate_threads" in row:
        t = row["hf_generate_threads"]
        pairs.append(("hf", f"hf_prefill_t{t}", f"hf_generate_t{t}"))
    if "llamacpp_generate" in secs:
        pairs.append(("llamacpp", "llamacpp_prefill", "llamacpp_generate"))
        if "jaxil_generate" in outputs and "llamacpp_generate" in outputs:
            row["llamacpp_greedy_tokens_agree"] = float(np.mean(
                outputs["jaxil_generate"] == outputs["llamacpp_generate"]))
    for side, pre, gen in pairs:
        if pre in secs and gen in secs and secs[gen] - secs[pre] > 0.05 * secs[gen]:
            row[f"{side}_decode_tokens_per_s"] = batch * new / (secs[gen] - secs[pre])
    for what in ("generate", "decode", "prefill"):
        a = row.get(f"jaxil_{what}_tokens_per_s")
        b = row.get(f"hf_{what}_tokens_per_s")
        row[f"{what}_ratio"] = a / b if a and b else None
    if "jaxil_generate" in sides and not sides["jaxil_generate"].get("skipped"):
        row["xla_temp_bytes"] = sides["jaxil_generate"].get("xla_temp_bytes")
    log(f"  {name} B={batch}: " + ", ".join(
        f"{k} {M.si(v['tokens_per_s'])} tok/s" if not v.get("skipped") else f"{k} skipped"
        for k, v in sides.items())
        + (f"; decode jaxil/hf {row['decode_ratio']:.2f}" if row.get("decode_ratio") else ""),
        flush=True)
    return row




def measure_sft(name: str, *, procs: dict[str, SideProcess], why: dict[str, str],
                facts: dict[str, Any], batch: int, length: int, repeats: int, target_s: float,
                seed: int) -> dict[str, Any]:
    """One full fine-tuning step on both sides (same tokens, AdamW, lr 1e-5),
    each in its engine's process."""
    tokens = np.random.default_rng(seed).integers(1, facts["vocab"],
                                                  size=(batch, length)).astype(np.int32).tolist()
    spec = _sides(procs, why)
    n = batch * (length - 1)
    specs = [spec("jaxil_sft", n, tokens=tokens), spec("hf_sft", n, tokens=tokens)]
    sides = time_sides(specs, batch, repeats=repeats, target_s=target_s, max_call_s=1e9,
                       history={}, deadline=float("inf"))
    for engine, proc in procs.items():
        for s in specs:
            if s.name.startswith(engine + "_"):
                proc.request("drop", side=s.name)
    row = {"model": name, "batch": batch, "length": length, "sides": sides}
    a, b = (sides[k].get("tokens_per_s") for k in ("jaxil_sft", "hf_sft"))
    row.update(jaxil_sft_tokens_per_s=a, hf_sft_tokens_per_s=b,
               sft_ratio=a / b if a and b else None)
    return row


def measure_argmax(batch: int, vocab: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    """Milliseconds of a greedy choice over `[batch, vocab]` float32 logits:
    `jnp.argmax` against [`greedy_tokens`][jaxil.nn.generate.greedy_tokens]
    (block maxima, then `argmax` inside the winning block), which `generate`
    uses; medians, compiled ahead."""
    x = jax.random.normal(jax.random.key(seed), (batch, vocab), jnp.float32)
    row: dict[str, Any] = {"batch": batch, "vocab": vocab}
    for side, fn in (("jnp_argmax", lambda a: jnp.argmax(a, axis=-1)),
                     ("greedy_tokens", greedy_tokens)):
        f, _ = M.compile_ahead(fn, x)
        row[f"{side}_ms"] = M.time_call(f, x, warmup=1, repeats=max(repeats, 5)).median_s * 1e3
    row["speedup"] = row["jnp_argmax_ms"] / row["greedy_tokens_ms"]
    return row


def machine_limits() -> dict[str, Any]:
    """A 1024² float32 matmul's GFLOP/s and a streaming read's GB/s, now."""
    rows = M.matmul_rates({"square_1024": (1024, 1024, 1024)}, repeats=7, target_s=2.0)
    return {"matmul_gflops": rows[0]["gflops"], "stream_read_gbps": stream_read_gbps()}


def rss_child(batch: int, prompt: int, new: int) -> dict[str, Any]:
    """Peak resident memory of a fresh process that loads SmolLM2 and
    generates `new` tokens for `batch` rows (jaxil only)."""
    code = ("import json, resource, sys; sys.path.insert(0, %r); import decode_engine as d; "
            "print(json.dumps(d._rss_run(%d, %d, %d)))"
            % (str(Path(__file__).resolve().parent), batch, prompt, new))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=900)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss_bytes() -> int:
    """This process's peak resident memory: `VmHWM` of `/proc/self/status`
    where there is one (it starts anew at `exec`, where `ru_maxrss` keeps
    the forking parent's peak), else `ru_maxrss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_run(batch: int, prompt: int, new: int) -> dict[str, Any]:
    from jaxil.pretrained import resolve

    config, params = from_pretrained(resolve("smollm2-135m-instruct"), max_context=prompt + new - 1)
    after_load = peak_rss_bytes()
    prompts = np.random.default_rng(0).integers(1, config.vocab_size, size=(batch, prompt))
    run = make_generate(config, new, Sampling(), (), -1, attention_block(config))
    jax.block_until_ready(run(params, jnp.asarray(prompts, jnp.int32),
                              jnp.full((batch,), prompt, jnp.int32), jax.random.key(0)))
    return {"batch": batch, "prompt": prompt, "new": new,
            "peak_rss_bytes": peak_rss_bytes(),
            "peak_rss_after_load_bytes": after_load,
            "kv_cache_bytes": kv_cache_bytes(config, batch), "weight_bytes": weight_bytes(params)}


# -- the run -----------------------------------------------------------------------------


def measure(models: Sequence[str], batches: Sequence[int], *, prompt: int, new: int,
            repeats: int, target_s: float, max_call_s: float, budget_s: Optional[float],
            block: Optional[int], sft: bool, sft_batch: int, sft_len: int, rss: bool,
            llamacpp: bool = True, seed: int = 0, log=print) -> dict[str, Any]:
    t0 = time.perf_counter()
    deadline = t0 + budget_s if budget_s else float("inf")
    here = Path(__file__).resolve()
    with SideProcess("probe", here) as probe:
        found = probe.setup("proc_probe")
        limits = probe.setup("proc_limits")
    payload: dict[str, Any] = {
        "benchmark": "decode_engine", "machine": M.machine_info(),
        "versions": M.library_versions(), "load_before": M.loadavg(),
        "config": {"models": list(models), "batches": list(batches), "prompt": prompt,
                   "new": new, "repeats": repeats, "target_s": target_s, "block": block,
                   "seed": seed},
        "processes": "each engine in a process of its own, timed one at a time",
        "peer": found["peer"], "rows": [], "sft": [], "models": {}, "limits": limits}
    if not llamacpp:
        found["llamacpp"] = {"skipped": "not asked for (--no-llamacpp)"}
    payload["llamacpp"] = found["llamacpp"]
    why = {"hf": payload["peer"]["skipped"], "llamacpp": payload["llamacpp"]["skipped"]}
    log(f"machine: {limits['matmul_gflops']:.1f} GFLOP/s (1024² fp32 dot), "
        f"{limits['stream_read_gbps']:.1f} GB/s (streaming read)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            t_load = time.perf_counter()
            context = prompt + new - 1
            with contextlib.ExitStack() as stack:
                procs: dict[str, SideProcess] = {}
                if why["hf"] is None:  # first: it writes the tiny models jaxil loads
                    procs["hf"] = stack.enter_context(SideProcess("transformers", here))
                    procs["hf"].setup("proc_load", engine="hf", name=name, context=context,
                                      workdir=tmp)
                procs["jaxil"] = stack.enter_context(SideProcess("jaxil", here))
                facts = procs["jaxil"].setup("proc_load", engine="jaxil", name=name,
                                             context=context, workdir=tmp, block=block,
                                             attended=prompt + new / 2)
                if name == "smollm2" and why["llamacpp"] is None:
                    procs["llamacpp"] = stack.enter_context(SideProcess("llama.cpp", here))
                    procs["llamacpp"].setup("proc_load", engine="llamacpp", name=name,
                                            context=prompt + new, workdir=tmp)
                payload["models"][name] = {k: v for k, v in facts.items()
                                           if k not in ("block", "kv_cache_bytes_per_row",
                                                        "decode_flops_per_token")}
                payload["models"][name]["load_s"] = time.perf_counter() - t_load
                log(f"{name}: {facts['num_params']:,} parameters ({facts['source']})",
                    flush=True)
                history: dict = {}
                if name == "smollm2":
                    payload["argmax"] = procs["jaxil"].setup(
                        "proc_argmax", batches=list(batches), vocab=facts["vocab"],
                        repeats=repeats, seed=seed)
                    log("  greedy choice over the vocabulary, ms (jnp.argmax / greedy_tokens): "
                        + ", ".join(f"B={r['batch']} {r['jnp_argmax_ms']:.2f}/"
                                    f"{r['greedy_tokens_ms']:.2f}" for r in payload["argmax"]),
                        flush=True)
                for b in batches:
                    row = measure_point(name, b, procs=procs, why=why, facts=facts,
                                        prompt=prompt, new=new, repeats=repeats,
                                        target_s=target_s, max_call_s=max_call_s,
                                        history=history, deadline=deadline, block=block,
                                        seed=seed, log=log, llamacpp=b == 1)
                    dec = row.get("jaxil_decode_tokens_per_s")
                    if dec:
                        row["decode_gflops"] = dec * facts["decode_flops_per_token"] / 1e9
                        row["decode_flops_fraction"] = row["decode_gflops"] / \
                            limits["matmul_gflops"]
                        row["weight_gbps"] = dec / b * facts["weight_bytes"] / 1e9
                        row["weight_bandwidth_fraction"] = row["weight_gbps"] / \
                            limits["stream_read_gbps"]
                    payload["rows"].append(row)
                if sft and time.perf_counter() < deadline:
                    # Within the positions the model was built with (GPT-2's are learned).
                    r = measure_sft(name, procs=procs, why=why, facts=facts, batch=sft_batch,
                                    length=min(sft_len, facts["max_context"]), repeats=repeats,
                                    target_s=target_s, seed=seed)
                    payload["sft"].append(r)
                    log(f"  {name} SFT B={sft_batch} T={sft_len}: jaxil "
                        f"{M.si(r['jaxil_sft_tokens_per_s'] or 0)} tok/s, transformers "
                        f"{M.si(r['hf_sft_tokens_per_s'] or 0)} tok/s", flush=True)
    if rss and "smollm2" in models:
        payload["rss"] = rss_child(64, prompt, new)
        log(f"SmolLM2 B=64 peak RSS: {payload['rss']}", flush=True)
    payload["load_after"] = M.loadavg()
    payload["wall_s"] = time.perf_counter() - t0
    return payload


COLUMNS = [
    ("model", "model", "{}"),
    ("batch", "B", "{}"),
    ("jaxil_prefill_tokens_per_s", "jaxil prefill", "{:,.0f}"),
    ("hf_prefill_tokens_per_s", "hf prefill", "{:,.0f}"),
    ("jaxil_decode_tokens_per_s", "jaxil decode", "{:,.0f}"),
    ("hf_decode_tokens_per_s", "hf decode", "{:,.0f}"),
    ("decode_ratio", "decode jaxil/hf", "{:.2f}"),
    ("generate_ratio", "generate jaxil/hf", "{:.2f}"),
    ("prefill_ratio", "prefill jaxil/hf", "{:.2f}"),
    ("hf_generate_threads", "hf threads", "{}"),
    ("greedy_tokens_equal", "same tokens", "{}"),
    ("kv_cache_bytes", "KV bytes", "{:,}"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=None)
    p.add_argument("--batches", nargs="+", type=int, default=None)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per row")
    p.add_argument("--new", type=int, default=None, help="new tokens per row (default 64)")
    p.add_argument("--block", type=int, default=None,
                   help="the decode step's attention block (default: generate's choice)")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny models, B = 1 and 8")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--target-s", type=float, default=None)
    p.add_argument("--max-call-s", type=float, default=300.0)
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--no-sft", action="store_true", help="skip the fine-tuning step")
    p.add_argument("--sft-batch", type=int, default=4)
    p.add_argument("--sft-len", type=int, default=128,
                   help="tokens per SFT row (at most the model's context, prompt + new - 1)")
    p.add_argument("--rss", action="store_true",
                   help="also the peak RSS of a SmolLM2 B = 64 child process")
    p.add_argument("--no-llamacpp", action="store_true",
                   help="leave out llama.cpp's reference row (SmolLM2, B = 1; needs llama-cpp-python)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--name", default="decode_engine")
    args = p.parse_args(argv)
    defaults = {"models": MODELS, "batches": DEFAULT_BATCHES, "repeats": 3, "target_s": 3.0,
                "new": 64}
    for k, v in (QUICK if args.quick else defaults).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.batches) < 1 or args.prompt < 1 or args.new < 1:
        p.error("--batches, --prompt and --new must be positive")
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    m = M.machine_info()
    print(f"decode engine on {m['cpu_model']} ({m['cpus_usable']} CPUs), jax {jax.__version__}, "
          f"load {M.loadavg()}", flush=True)
    payload = measure(args.models, args.batches, prompt=args.prompt, new=args.new,
                      repeats=args.repeats, target_s=args.target_s, max_call_s=args.max_call_s,
                      budget_s=args.budget_s, block=args.block, sft=not args.no_sft,
                      sft_batch=args.sft_batch, sft_len=args.sft_len, rss=args.rss,
                      llamacpp=not args.no_llamacpp, seed=args.seed)
    payload["config"]["quick"] = args.quick
    path = M.write_json(args.name, payload, args.out_dir or RESULTS_DIR)
    print()
    print(M.format_table(payload["rows"], COLUMNS))
    if payload["peer"]["skipped"]:
        print(f"peer skipped: {payload['peer']['skipped']}")
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
