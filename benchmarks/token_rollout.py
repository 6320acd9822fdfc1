"""Token rollout throughput: tokens/s of the transformer policy with its KV
cache against recomputing the prefix, and against Hugging Face ``generate``.

For each transformer size (``--sizes``, :data:`jaxil.nn.transformer.SIZES`,
built by :func:`~jaxil.nn.transformer.config_for_env` for ``tokens:repair``:
V = 57, context C = ``env.max_context`` = 162) and each batch B of sequences
(``--batches``), in one run, side by side:

- ``decode cached`` / ``decode recompute``: pure decoding, no environment.
  From a one-token prompt (``<bos>``) each of B sequences samples T = C − 1
  new tokens (the whole context), one per step, in one jitted ``lax.scan``:
  through :meth:`Transformer.decode` and its KV cache (``O(C)`` attention per
  token and layer), or re-running :meth:`Transformer.sequence_logits` over
  the whole fixed-length ``[C]`` token buffer every step (``O(C²)``, the
  recompute baseline of :meth:`TransformerPolicy.recompute_policy`). Tokens
  are sampled from the masked categorical (``<pad>`` never drawn) with the
  same keys on both paths, so they decode the same tokens (to float32
  rounding; :func:`decoders` with ``deterministic=True`` is tested greedy).
- ``rollout cached`` / ``rollout recompute``: the environment in the loop:
  ``envs.rollout`` of ``tokens:repair`` with B auto-resetting environments
  for ``spec.max_steps`` steps (one jitted scan; env steps, the grammar mask,
  tool outputs entering the context, resets of the carry), acting with
  :meth:`TransformerPolicy.policy` (KV cache) or
  :meth:`TransformerPolicy.recompute_policy`. ``tokens/s`` counts the
  agents' generated tokens (B × N × steps); ``ctx tokens/s`` the non-PAD
  tokens entering the contexts (generated, prompt and tool output).
- ``hf cache`` / ``hf no cache``: the peer, Hugging Face ``transformers``
  ``GPT2LMHeadModel.generate`` on PyTorch, on a GPT-2 built locally with the
  same dimensions (``GPT2Config(vocab_size=V, n_positions=C, n_embd=d,
  n_layer, n_head)``, MLP 4d, tanh GELU, LayerNorm ε 1e-5; random weights,
  nothing downloaded), B prompts of one token, ``do_sample=True, top_k=0,
  top_p=1`` (plain sampling, as jaxil's), ``<pad>`` suppressed, no EOS,
  ``max_new_tokens`` = T, ``use_cache=True`` and ``False``; on CUDA when
  torch sees a GPU (``--peer-device``), else on the CPU. ``torch`` and
  ``transformers`` are imported at run time; without them the peer's
  columns are empty and the JSON says why.

The two are not the same loop, and that is the point of the comparison:
``generate`` runs a Python loop that launches the model's kernels (and its
logits processors) once per token, while jaxil's whole decode or rollout is
one compiled ``lax.scan``. What is held equal: batch, number of new tokens,
model dimensions, float32 weights and activations, full-float32 matrix
products on both sides (``--precision fp32``: ``jax.default_matmul_precision
("float32")``, ``torch.backends.cuda.matmul.allow_tf32 = False``; ``tf32``
allows TF32 on both), and the CPU threads (``torch.set_num_threads`` = the
CPUs this process may use, which is what XLA's CPU thread pool takes; both
counts are recorded). Not equal: GPT-2 ties its output head to the token
embedding (jaxil's is untied; the same FLOPs), jaxil's recompute runs the
fixed ``[C]`` buffer every step (a compiled loop needs static shapes)
where ``use_cache=False`` re-runs the growing prefix, about half the work.

Timing: every call is compiled ahead (``compile s``), run once as a
warm-up, then the sides alternate (each round times every side once, so all
see the same machine load) for up to ``--repeats`` rounds, fewer for slow
calls (about ``--target-s`` seconds per side); medians of wall and process
CPU seconds, each call ended by ``jax.block_until_ready`` (torch:
``cuda.synchronize``). ``tokens/s`` = B × T / median seconds. Ratios:
``cached/recompute`` (decode and rollout) and ``jaxil/hf`` (decode cached
over ``hf cache``; recompute over ``hf no cache``).

A side whose call would take longer than ``--max-call-s`` (predicted from
its time at the previous batch, scaled by the batch) or whose buffers would
not fit in memory is skipped with the reason; so is everything past
``--budget-s``.

    python benchmarks/token_rollout.py                       # tiny, small × B = 1 … 4096
    python benchmarks/token_rollout.py --quick               # seconds: tiny, B = 1, 8, 2 repeats
    python benchmarks/token_rollout.py --sizes small --batches 64 512 --parts decode peer

Writes ``benchmarks/results/token_rollout-<host>-<date>.json`` (machine,
library versions, settings, load average, every row) and prints a table.
:func:`measure` is the same run as a function (for the accelerator suite);
:func:`time_sides`, the alternating timing of one point's sides, is shared
with :mod:`benchmarks.token_finetune`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxil import envs
from jaxil.nn import distributions as D
from jaxil.nn.transformer import PAD, Transformer, TransformerPolicy, config_for_env
from jaxil.runs import measure as M
from jaxil.runs.precision import matmul_precision

try:  # one Skip for sides timed here and in a process of their own
    from benchmarks.side_process import Skip
except ImportError:  # run as a script: its own folder is on sys.path, the repository root is not
    from side_process import Skip

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ENV_ID = "tokens:repair"
DEFAULT_SIZES = ("tiny", "small")
DEFAULT_BATCHES = (1, 8, 64, 512, 4096)
PARTS = ("decode", "rollout", "peer")
SIDES = {
    "decode": ("decode_cached", "decode_recompute"),
    "rollout": ("rollout_cached", "rollout_recompute"),
    "peer": ("hf_cache", "hf_nocache"),
}
QUICK = {"sizes": ("tiny",), "batches": (1, 8), "repeats": 2, "target_s": 0.5}


# -- the jaxil programs ------------------------------------------------------------------


def _sample(key: jax.Array, logits: jax.Array, deterministic: bool) -> jax.Array:
    """One token per row of ``logits [B, V]`` from the masked categorical
    (``<pad>`` never legal), as the policy's ``act`` draws."""
    avail = jnp.broadcast_to(jnp.arange(logits.shape[-1]) != PAD, logits.shape)
    if deterministic:
        return D.categorical_mode(logits, avail)
    return D.categorical_sample(key, logits, avail)


def decoders(net: Transformer, batch: int, new_tokens: int, prompt_token: int,
             deterministic: bool = False) -> dict[str, Callable[[Any, jax.Array], jax.Array]]:
    """``{"decode_cached", "decode_recompute"}``: pure ``(params, key) ->
    tokens int32 [B, T]`` functions that decode ``T = new_tokens`` tokens
    for ``B = batch`` sequences after the one-token prompt ``prompt_token``,
    one token per step in a ``lax.scan``, drawing step ``t``'s tokens with
    the ``t``-th of ``T`` keys split from ``key`` on both paths.

    ``decode_cached`` feeds each step's tokens to :meth:`Transformer.decode`
    (KV cache); ``decode_recompute`` keeps a ``[B, C]`` token buffer and
    re-runs :meth:`Transformer.sequence_logits` over all ``C`` slots every
    step, reading the row of the last token."""
    C = net.config.max_context
    if not 1 <= new_tokens <= C:
        raise ValueError(f"new_tokens={new_tokens} must be in 1 … max_context={C}: the context "
                         f"holds the prompt token and all but the last generated one")
    full = jax.vmap(net.sequence_logits, in_axes=(None, 0))

    def cached(params, key):
        def body(carry, k):
            cache, tok = carry
            logits, cache = net.decode(params, tok[:, None], cache)
            nxt = _sample(k, logits, deterministic)
            return (cache, nxt), nxt

        start = (net.empty_cache((batch,)), jnp.full((batch,), prompt_token, jnp.int32))
        _, toks = jax.lax.scan(body, start, jax.random.split(key, new_tokens))
        return toks.T

    def recompute(params, key):
        def body(carry, k):
            buf, t = carry  # buf holds t + 1 tokens
            logits = jax.lax.dynamic_index_in_dim(full(params, buf), t, axis=1, keepdims=False)
            nxt = _sample(k, logits, deterministic)
            buf = buf.at[:, t + 1].set(nxt, mode="drop")
            return (buf, t + 1), nxt

        buf = jnp.zeros((batch, C), jnp.int32).at[:, 0].set(prompt_token)
        _, toks = jax.lax.scan(body, (buf, jnp.int32(0)), jax.random.split(key, new_tokens))
        return toks.T

    return {"decode_cached": cached, "decode_recompute": recompute}


def rollouts(env: envs.MultiAgentEnv, student: TransformerPolicy, batch: int,
             steps: int) -> dict[str, Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]]:
    """``{"rollout_cached", "rollout_recompute"}``: ``(params, key) ->
    (actions int32 [steps, B, N], context tokens int32 [])``, ``envs.rollout``
    of ``batch`` auto-resetting environments for ``steps`` steps acting with
    the KV-cache policy or the recompute policy (sampling)."""
    K = student.config.token_width

    def make(policy):
        def run(params, key):
            traj = envs.rollout(env, policy, params, key, batch, steps)
            ctx = jnp.sum(jnp.round(traj.obs[..., :K]) != PAD).astype(jnp.int32)
            return traj.actions, ctx

        return run

    return {"rollout_cached": make(student.policy()),
            "rollout_recompute": make(student.recompute_policy())}


# -- the peer ----------------------------------------------------------------------------


def peer_unavailable() -> str | None:
    """Why the Hugging Face peer cannot run here (None when it can)."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (the peer needs torch and transformers)"
    try:
        import torch  # noqa: F401
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken install is a reason, not a crash
        return f"importing torch / transformers failed: {type(e).__name__}: {str(e)[:300]}"
    return None


class HFPeer:
    """``GPT2LMHeadModel.generate`` at a jaxil :class:`TransformerConfig`'s
    dimensions: random float32 weights, built locally."""

    def __init__(self, config, device: str, threads: int, tf32: bool, seed: int = 0):
        import torch
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel

        transformers.logging.set_verbosity_error()
        self.torch = torch
        self.threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.manual_seed(seed)
        self.device = device
        self.hf_config = GPT2Config(
            vocab_size=config.vocab_size, n_positions=config.max_context, n_embd=config.d_model,
            n_layer=config.num_layers, n_head=config.num_heads,
            n_inner=config.mlp_ratio * config.d_model, activation_function="gelu_new",
            layer_norm_epsilon=config.ln_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=None, eos_token_id=None, pad_token_id=PAD)
        self.model = GPT2LMHeadModel(self.hf_config).to(device=device, dtype=torch.float32).eval()
        self.num_params = sum(p.numel() for p in self.model.parameters())

    def info(self) -> dict[str, Any]:
        import transformers

        t = self.torch
        return {"torch": t.__version__, "transformers": transformers.__version__,
                "device": self.device,
                "cuda_device": t.cuda.get_device_name(0) if self.device == "cuda" else None,
                "torch_threads": t.get_num_threads(), "torch_threads_before": self.threads_before,
                "allow_tf32": t.backends.cuda.matmul.allow_tf32, "num_params": self.num_params,
                "attn_implementation": getattr(self.model.config, "_attn_implementation", None)}

    def generator(self, batch: int, new_tokens: int, prompt_token: int, use_cache: bool) -> Callable:
        """A call that generates ``new_tokens`` for ``batch`` one-token prompts
        and returns the ``[B, 1 + T]`` ids once the device is done."""
        torch = self.torch
        from transformers import GenerationConfig

        ids = torch.full((batch, 1), prompt_token, dtype=torch.long, device=self.device)
        mask = torch.ones_like(ids)
        gen = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                               max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               use_cache=use_cache, suppress_tokens=[PAD], pad_token_id=PAD,
                               eos_token_id=None, bos_token_id=None)

        def run():
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
            if self.device == "cuda":
                torch.cuda.synchronize()
            return out

        return run


# -- timing sides alternately -------------------------------------------------------------


@dataclasses.dataclass
class SideSpec:
    """One program to time at one point.

    ``prepare(info)`` returns a call that runs the program to completion
    (recording facts such as ``compile_s`` in ``info``; raising :class:`Skip`
    when it cannot run), or a
    [`RemoteCall`][benchmarks.side_process.RemoteCall] that times it in a
    process of its own; ``tokens`` is what one call processes; ``check(info,
    out)``, if given, reads the warm-up call's output (and may raise). Sides
    of one ``group`` are alternatives of which only the fastest counts (a
    peer at different thread counts): one whose first timed round took more
    than ``SLOWER_BY`` times the group's fastest is not timed further."""

    name: str
    tokens: int
    prepare: Callable[[dict[str, Any]], Callable[[], Any]]
    check: Callable[[dict[str, Any], Any], None] | None = None
    group: str | None = None


class _Side:
    """One timed program: ``call()`` runs it to completion."""

    def __init__(self, name: str, call: Callable[[], Any], tokens: int, row: dict[str, Any]):
        self.name, self.call, self.tokens, self.row = name, call, tokens, row
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.n = 1
        self.burst = 1

    def time(self, calls: int = 1) -> tuple[float, float, Any]:
        """`(wall s, cpu s, output)` per call of `calls` back-to-back calls
        (timed by the child process for a remote call)."""
        if hasattr(self.call, "time"):
            return self.call.time(calls)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            out = jax.block_until_ready(self.call())
        return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls, out


def _predict(history: dict[str, tuple[int, float]], name: str, batch: int) -> float | None:
    """A side's call seconds at ``batch`` from its time at the last batch
    measured (linear in the batch: an upper bound once the device is full)."""
    if name not in history:
        return None
    b, s = history[name]
    return s * batch / b


def compiled_call(fn: Callable, args: Sequence[Any], info: dict[str, Any],
                  precision: str) -> Callable[[], Any]:
    """``fn(*args)`` compiled ahead under ``precision`` (``compile_s`` and
    XLA's memory analysis into ``info``), as a call of no arguments; raises
    :class:`Skip` when its buffers would not fit in the free memory."""
    with matmul_precision(precision):
        compiled, info["compile_s"] = M.compile_ahead(fn, *args)
    mem = M.xla_memory(compiled)
    info.update(mem)
    reason = M.memory_shortfall(mem)
    if reason:
        raise Skip(reason)
    return functools.partial(compiled, *args)


#: A side of a group whose first timed round is this many times slower
#: than the group's fastest is left out of the later rounds.
SLOWER_BY = 1.5

#: Seconds a timed burst of back-to-back calls lasts (at least one call).
BURST_S = 0.05
MAX_BURST = 200


def time_sides(specs: Sequence[SideSpec], batch: int, *, repeats: int, target_s: float,
               max_call_s: float, history: dict[str, tuple[int, float]],
               deadline: float) -> dict[str, dict[str, Any]]:
    """Every side of ``specs`` prepared, run once as a warm-up, then timed
    alternately (each round times every side once) for up to ``repeats``
    rounds, fewer for calls slower than ``target_s`` / ``repeats``. A timed
    sample is a burst of back-to-back calls lasting about ``BURST_S`` (one
    call when a call is longer), its time divided by the calls. That matters
    for millisecond calls on a 2-core machine: torch's worker threads keep
    spinning for a while after a call and took a core from a single XLA
    call timed next (a tiny Llama's prefill timed 4.4 ms there against
    1.2 ms alone). A pause between the sides does not help: after 0.2-2 s
    idle the same XLA calls ran 30-100 % slower than back to back.

    Returns ``{name: info}``: ``skipped`` (the reason, or None), and for a
    timed side ``call_s`` / ``cpu_s`` (medians), ``tokens``,
    ``tokens_per_s``, ``tokens_per_cpu_s``, ``context_tokens_per_s`` (when
    ``prepare`` or ``check`` recorded ``context_tokens``) and ``timing``. A
    side is skipped past ``deadline``, when its call is predicted (from
    ``history``, which this updates) to take longer than ``max_call_s``,
    when it raises :class:`Skip`, when it runs out of memory, or after its
    first timed round when it is slower than its group's fastest (see
    :class:`SideSpec`)."""
    infos: dict[str, dict[str, Any]] = {}
    live: list[_Side] = []
    for spec in specs:
        info: dict[str, Any] = {}
        infos[spec.name] = info
        if time.perf_counter() > deadline:
            info["skipped"] = "run budget (--budget-s) spent"
            continue
        pred = _predict(history, spec.name, batch)
        if pred is not None and pred > max_call_s:
            info["skipped"] = (f"predicted {pred:.0f} s per call (from B={history[spec.name][0]}) "
                               f"> --max-call-s {max_call_s:.0f}")
            continue
        try:
            side = _Side(spec.name, spec.prepare(info), spec.tokens, info)
            w, c, out = side.time()  # warm-up
            info["warmup_s"] = w
            if spec.check is not None:
                spec.check(info, out)
            del out
            side.n = int(min(repeats, max(1, math.floor(target_s / max(w, 1e-9)))))
            side.burst = int(min(MAX_BURST, max(1, math.ceil(BURST_S / max(w, 1e-9)))))
            info["burst"] = side.burst
            live.append(side)
        except Skip as e:
            info["skipped"] = str(e)
        except Exception as e:
            if M.is_oom(e) or type(e).__name__ == "OutOfMemoryError":
                info["skipped"] = f"out of memory: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            raise
    groups = {spec.name: spec.group for spec in specs}
    for r in range(max((s.n for s in live), default=0)):  # alternate the sides
        for side in live:
            if r < side.n:
                w, c, _ = side.time(side.burst)
                side.walls.append(w)
                side.cpus.append(c)
        if r == 0:  # a group's alternatives: keep timing only those near its fastest
            fastest: dict[str, float] = {}
            for side in live:
                if groups[side.name] is not None:
                    g = groups[side.name]
                    fastest[g] = min(fastest.get(g, math.inf), side.walls[0])
            for side in list(live):
                g = groups[side.name]
                if g is not None and side.walls[0] > SLOWER_BY * fastest[g]:
                    side.row["skipped"] = (
                        f"slower than its group's fastest by more than {SLOWER_BY}x in the "
                        f"first timed round ({side.walls[0]:.3g} s against {fastest[g]:.3g} s)")
                    side.row["first_round_s"] = side.walls[0]
                    live.remove(side)
    for side in live:
        t = M.Timing(side.walls, side.cpus, side.row["warmup_s"])
        s = t.median_s
        side.row.update(skipped=None, call_s=s, cpu_s=t.cpu_median_s, tokens=side.tokens,
                        tokens_per_s=side.tokens / s,
                        tokens_per_cpu_s=side.tokens / max(t.cpu_median_s, 1e-12),
                        timing=t.to_dict())
        if "context_tokens" in side.row:
            side.row["context_tokens_per_s"] = side.row["context_tokens"] / s
        history[side.name] = (batch, s)
    return infos


# -- one size, one batch -----------------------------------------------------------------


def measure_point(size: str, batch: int, *, env, student: TransformerPolicy, params, peer,
                  sides: Sequence[str], new_tokens: int, prompt_token: int, repeats: int,
                  target_s: float, max_call_s: float, history: dict, precision: str,
                  deadline: float, seed: int = 0, log=print) -> dict[str, Any]:
    """The row of one size and batch: every side of ``sides`` timed
    alternately (see the module docstring)."""
    n = env.spec.num_agents
    steps = env.spec.max_steps
    row: dict[str, Any] = {"size": size, "batch": batch, "new_tokens": new_tokens,
                           "rollout_steps": steps, "sides": {}}
    key = jax.random.PRNGKey(seed + 1)
    progs: dict[str, Callable] = {}
    if any(s.startswith("decode") for s in sides):
        progs.update(decoders(student.net, batch, new_tokens, prompt_token))
    if any(s.startswith("rollout") for s in sides):
        progs.update(rollouts(env, student, batch, steps))

    def prepare(name):
        def run(info):
            if not name.startswith("hf"):
                return compiled_call(progs[name], (params, key), info, precision)
            if peer is None:
                raise Skip("peer unavailable")
            info["compile_s"] = None
            return peer.generator(batch, new_tokens, prompt_token, use_cache=name == "hf_cache")

        return run

    def check_hf(info, out):
        info["generated_shape"] = list(out.shape)
        if out.shape[1] != 1 + new_tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - 1} new tokens, not {new_tokens}")

    def check_rollout(info, out):
        info["context_tokens"] = int(out[1])

    specs = [SideSpec(name, batch * (n * steps if name.startswith("rollout") else new_tokens),
                      prepare(name),
                      check_hf if name.startswith("hf") else
                      check_rollout if name.startswith("rollout") else None)
             for name in sides]
    row["sides"] = time_sides(specs, batch, repeats=repeats, target_s=target_s,
                              max_call_s=max_call_s, history=history, deadline=deadline)
    finish_row(row, size, batch, _ratios, log)
    return row


def finish_row(row: dict[str, Any], size: str, batch: int, ratios: Callable[[dict], None],
               log: Callable[..., None]) -> None:
    """Copy each timed side's ``tokens_per_s`` (and ``context_tokens_per_s``
    where measured) into ``row``, add the ``ratios``, and log one line."""
    for name, info in row["sides"].items():
        if not info.get("skipped"):
            row[f"{name}_tokens_per_s"] = info["tokens_per_s"]
            if "context_tokens_per_s" in info:
                row[f"{name}_context_tokens_per_s"] = info["context_tokens_per_s"]
    ratios(row)
    log(f"  {size} B={batch}: " + ", ".join(
        f"{k} {M.si(v['tokens_per_s'])} tok/s" if not v.get("skipped") else f"{k} skipped"
        for k, v in row["sides"].items()), flush=True)


def ratio_of(row: dict[str, Any], a: str, b: str) -> float | None:
    """``row[a_tokens_per_s] / row[b_tokens_per_s]``, None if either is missing."""
    x, y = row.get(f"{a}_tokens_per_s"), row.get(f"{b}_tokens_per_s")
    return x / y if x and y else None


def _ratios(row: dict[str, Any]) -> None:
    ratio = lambda a, b: ratio_of(row, a, b)

    row["decode_cached_over_recompute"] = ratio("decode_cached", "decode_recompute")
    row["rollout_cached_over_recompute"] = ratio("rollout_cached", "rollout_recompute")
    row["hf_cache_over_nocache"] = ratio("hf_cache", "hf_nocache")
    row["jaxil_over_hf_cached"] = ratio("decode_cached", "hf_cache")
    row["jaxil_over_hf_recompute"] = ratio("decode_recompute", "hf_nocache")


# -- the run -----------------------------------------------------------------------------


def measure(sizes: Sequence[str] = DEFAULT_SIZES, batches: Sequence[int] = DEFAULT_BATCHES, *,
            parts: Sequence[str] = PARTS, env_id: str = ENV_ID, repeats: int = 5,
            target_s: float = 2.0, max_call_s: float = 60.0, budget_s: float | None = None,
            new_tokens: int | None = None, precision: str = "fp32", peer_device: str = "auto",
            torch_threads: int | None = None, seed: int = 0, log=print) -> dict[str, Any]:
    """The whole benchmark as a function: ``{"machine", "versions",
    "config", "peer", "definitions", "rows", "load", "wall_s"}`` (what
    :func:`main` writes as JSON). ``budget_s`` bounds the run (what is left
    when it is spent is recorded as skipped)."""
    if precision not in ("fp32", "tf32"):
        raise ValueError(f"precision {precision!r}: choose fp32 or tf32 (float32 weights on both sides)")
    t0 = time.perf_counter()
    deadline = t0 + (budget_s if budget_s is not None else math.inf)
    load = {"start": M.loadavg()}
    env = envs.make(env_id)
    C = env.max_context
    T = C - 1 if new_tokens is None else int(new_tokens)
    prompt_token = int(env.vocab.encode("<bos>")[0])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = int(torch_threads or cpus)
    sides = [s for p in PARTS if p in parts for s in SIDES[p]]

    peer_reason = peer_unavailable() if "peer" in parts else "not requested (--parts)"
    device = peer_device
    if peer_reason is None and device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    peer_info: dict[str, Any] = {"skipped": peer_reason, "device": device if peer_reason is None else None}

    config = {"env": env_id, "sizes": list(sizes), "batches": sorted(set(batches)),
              "parts": list(parts), "repeats": repeats, "target_s": target_s,
              "max_call_s": max_call_s, "budget_s": budget_s, "new_tokens": T, "context": C,
              "prompt": "<bos>", "rollout_steps": env.spec.max_steps, "precision": precision,
              "jax_matmul_precision": {"fp32": "float32", "tf32": "tensorfloat32"}[precision],
              "peer_device": device, "cpus_usable": cpus, "torch_threads": threads, "seed": seed}
    rows: list[dict[str, Any]] = []
    for size in sizes:
        cfg = config_for_env(env, size)
        student = TransformerPolicy(cfg)
        params = student.init(jax.random.PRNGKey(seed))
        peer = None
        if peer_reason is None:
            try:
                peer = HFPeer(cfg, device, threads, tf32=precision == "tf32", seed=seed)
                peer_info.update(peer.info())
            except Exception as e:  # noqa: BLE001 - recorded, never a traceback
                peer_reason = peer_info["skipped"] = f"building the peer failed: {type(e).__name__}: {e}"
        history: dict[str, tuple[int, float]] = {}
        log(f"{size}: d={cfg.d_model}, {cfg.num_layers} layers, {cfg.num_heads} heads, "
            f"{cfg.num_params():,} parameters, V={cfg.vocab_size}, C={C}", flush=True)
        for b in sorted(set(batches)):
            row = measure_point(size, b, env=env, student=student, params=params, peer=peer,
                                sides=sides, new_tokens=T, prompt_token=prompt_token,
                                repeats=repeats, target_s=target_s, max_call_s=max_call_s,
                                history=history, precision=precision, deadline=deadline,
                                seed=seed, log=log)
            row.update(d_model=cfg.d_model, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                       num_params=cfg.num_params())
            if peer is not None:
                row["hf_num_params"] = peer.num_params
            rows.append(row)
            jax.clear_caches()  # one point's executables in memory at a time
        del peer
    load["end"] = M.loadavg()
    versions = M.library_versions()
    versions.update({k: peer_info.get(k) for k in ("torch", "transformers")})
    return {
        "machine": M.machine_info(),
        "versions": versions,
        "config": config,
        "peer": peer_info,
        "definitions": {
            "decode_cached": "lax.scan of Transformer.decode (KV cache updated in place), one token per step, B sequences, "
                             "T = new_tokens after a one-token <bos> prompt, masked-categorical sampling",
            "decode_recompute": "the same with Transformer.sequence_logits over the whole [C] token "
                                "buffer every step (no cache)",
            "rollout_cached": "envs.rollout(tokens:repair, TransformerPolicy.policy(), B envs, "
                              "spec.max_steps steps), jitted",
            "rollout_recompute": "the same with TransformerPolicy.recompute_policy()",
            "hf_cache": "transformers GPT2LMHeadModel.generate, same dimensions, random weights, "
                        "do_sample top_k=0 top_p=1, <pad> suppressed, no EOS, max_new_tokens = T, "
                        "use_cache=True",
            "hf_nocache": "the same with use_cache=False (re-runs the growing prefix)",
            "tokens_per_s": "generated tokens (decode: B * T; rollout: B * agents * steps) / median "
                            "call seconds",
            "context_tokens_per_s": "non-PAD tokens entering the contexts in a rollout / median seconds",
            "jaxil_over_hf_cached": "decode_cached tokens/s / hf_cache tokens/s",
            "jaxil_over_hf_recompute": "decode_recompute tokens/s / hf_nocache tokens/s",
        },
        "rows": rows,
        "load": load,
        "wall_s": time.perf_counter() - t0,
    }


COLUMNS = [
    ("size", "size", "{}"),
    ("batch", "B", "{}"),
    ("decode_cached_tokens_per_s", "decode cached tok/s", "{:.0f}"),
    ("decode_recompute_tokens_per_s", "recompute", "{:.0f}"),
    ("decode_cached_over_recompute", "ratio", "{:.1f}"),
    ("rollout_cached_tokens_per_s", "rollout cached tok/s", "{:.0f}"),
    ("rollout_recompute_tokens_per_s", "recompute", "{:.0f}"),
    ("rollout_cached_over_recompute", "ratio", "{:.1f}"),
    ("hf_cache_tokens_per_s", "hf cache tok/s", "{:.0f}"),
    ("hf_nocache_tokens_per_s", "hf no cache", "{:.0f}"),
    ("jaxil_over_hf_cached", "jaxil/hf", "{:.2f}"),
    ("jaxil_over_hf_recompute", "(no cache)", "{:.2f}"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", choices=("tiny", "mini", "small", "base"), default=None,
                   help=f"transformer sizes (default: {' '.join(DEFAULT_SIZES)})")
    p.add_argument("--batches", nargs="+", type=int, default=None,
                   help=f"sequences per call (default: {' '.join(map(str, DEFAULT_BATCHES))})")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to time")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny, B = 1 and 8, 2 repeats (seconds)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds at most (default 5)")
    p.add_argument("--target-s", type=float, default=None,
                   help="about this many seconds of timed calls per side (default 2)")
    p.add_argument("--max-call-s", type=float, default=60.0,
                   help="skip a side whose call is predicted to take longer (default %(default)s)")
    p.add_argument("--budget-s", type=float, default=None, help="bound on the whole run")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="tokens decoded per sequence (default: max_context - 1, the whole context)")
    p.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                   help="matmul precision on both sides (GPU only; CPUs compute fp32 either way)")
    p.add_argument("--peer-device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the transformers peer runs (auto: CUDA when torch sees a GPU)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch CPU threads (default: the CPUs this process may use, as XLA)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None, help="where the JSON goes (default benchmarks/results)")
    p.add_argument("--name", default="token_rollout", help="JSON file name prefix")
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batches or ()):
        p.error("--batches must be positive")
    defaults = {"sizes": DEFAULT_SIZES, "batches": DEFAULT_BATCHES, "repeats": 5, "target_s": 2.0}
    for k, v in (QUICK if args.quick else defaults).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    m = M.machine_info()
    print(f"jaxil token rollout on {m['cpu_model']} ({m['cpus_usable']} CPUs, backend {m['backend']}), jax {jax.__version__}, load {M.loadavg()}", flush=True)
    payload = measure(args.sizes, args.batches, parts=args.parts, repeats=args.repeats,
                      target_s=args.target_s, max_call_s=args.max_call_s, budget_s=args.budget_s,
                      new_tokens=args.new_tokens, precision=args.precision,
                      peer_device=args.peer_device, torch_threads=args.torch_threads, seed=args.seed)
    payload["config"]["quick"] = args.quick
    path = M.write_json(args.name, payload, args.out_dir or RESULTS_DIR)
    print()
    print(M.format_table(payload["rows"], COLUMNS))
    if payload["peer"]["skipped"]:
        print(f"peer skipped: {payload['peer']['skipped']}")
    for r in payload["rows"]:
        for name, s in r["sides"].items():
            if s.get("skipped") and not (name.startswith("hf") and payload["peer"]["skipped"]):
                print(f"skipped: {r['size']} B={r['batch']} {name}: {s['skipped']}")
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
