"""Fine-tuning throughput: tokens/s of supervised fine-tuning (SFT) of the
transformer policy on token episodes, K updates fused in one ``lax.scan``
against K separate calls, and a PyTorch training step of Hugging Face GPT-2
on the same sequences.

For each transformer size (``--sizes``, :data:`jaxil.nn.transformer.SIZES`,
built for ``tokens:repair`` by :func:`jaxil.algorithms.lm.sft.make_student`:
V = 57, context C = ``env.max_context`` = 162) and each batch of B episodes
(``--batches``), in one run, side by side:

- ``update``: one jitted SFT update, as :func:`~jaxil.algorithms.lm.sft.sft_program`
  takes it: ``jax.value_and_grad`` of :func:`~jaxil.algorithms.lm.sft.sft_loss`
  (one teacher-forced pass per episode and agent over its packed context),
  then global-norm clipping and Adam (the optimiser of
  :class:`~jaxil.algorithms.lm.sft.SFTConfig`: learning rate 1e-3, clip 1),
  written as :func:`jaxil.runs.updates.fused_updates` with K = 1. The
  minibatch is the B episodes, given (``sft_program`` draws it from the
  demonstrations with replacement, a gather left out here).
- ``fused``: K such updates in one ``lax.scan`` (``fused_updates`` with K =
  ``--k``, as the run engine runs a chunk); ``separate``: the compiled
  ``update`` called K times from Python, the state passed on, waited for
  once after the K-th (so dispatch may overlap the previous call: the
  favourable case for separate calls). ``fused/separate`` is the saving.
- ``peer``: one training step of Hugging Face ``transformers``
  ``GPT2LMHeadModel`` on PyTorch (zero grads, forward with ``labels``,
  backward, ``clip_grad_norm_`` to the same norm, ``torch.optim.Adam`` with
  the same learning rate), a GPT-2 built locally with the same dimensions as
  :mod:`benchmarks.token_rollout`'s peer (random weights, nothing
  downloaded), on the same sequences: the packed contexts ``[B·N, C]``
  (attention mask: the non-PAD slots) with ``labels`` set only where the SFT
  loss counts a token (the slot after the one whose logits score it, since
  GPT-2 shifts its labels by one). On CUDA when torch sees a GPU
  (``--peer-device``), else on the CPU with ``torch.set_num_threads`` = the
  CPUs this process may use. ``torch`` and ``transformers`` are imported at
  run time (``--peer-path`` adds folders holding them to ``sys.path``);
  without them the peer's columns are empty and the JSON says why.

Tokens. SFT trains on whole episodes: each agent's tokens of every step
(prompt, its own commands, tool output) are packed left into its
``max_context`` slots, PAD after (``TransformerPolicy._chunks``), and one
teacher-forced pass runs over all C slots; the loss reads the logits at the
last stored token of each step. Two counts per update: ``loss tokens`` (the
agent tokens the loss counts: valid steps, tokens the grammar forces left
out, :func:`jaxil.losses.sequence.agent_token_mask`) and ``context tokens``
(the non-PAD tokens of the packed contexts, what the pass runs over);
``context_slots`` = B × N × C is what it costs. ``tokens/s`` = loss tokens ×
updates per call / median seconds; ``ctx tokens/s`` the same with context
tokens. Both sides count the same tokens of the same batch, so
``jaxil/peer`` is the ratio of their step times.

Data (``--data``): ``expert`` (default) episodes of the scripted expert on
``tokens:repair`` at its default knobs
(:func:`~jaxil.algorithms.lm.sft.collect_demos`), collected once for the
largest batch, the first B for each; ``random``: random tokens that fill the
contexts (:func:`random_demos`, every step valid and counted).

Held equal: the sequences, the model's dimensions (MLP 4d, tanh GELU,
LayerNorm ε 1e-5), float32 weights, activations and optimiser state,
full-float32 products (``--precision fp32``; ``tf32`` allows TF32 on both),
the optimiser's settings, and the CPU threads. Not equal: GPT-2 ties its
output head to the token embedding (the same FLOPs, V·d fewer parameters to
update); its cross-entropy is over the whole vocabulary where jaxil's
categorical is masked to the legal tokens; jaxil's health check of the
update (finite loss and parameters) has no counterpart.

Timing as in :mod:`benchmarks.token_rollout`
(:func:`~benchmarks.token_rollout.time_sides`): compiled ahead (``compile s``),
one warm-up call, then the sides alternate for up to ``--repeats`` rounds
(fewer for slow calls, about ``--target-s`` seconds per side); medians of wall
and process CPU seconds, each call ended by ``jax.block_until_ready`` (the peer
returns the loss as a Python float). A side predicted to take longer than
``--max-call-s`` per call, or whose buffers would not fit in memory, is skipped
with the reason; so is everything past ``--budget-s``.

    python benchmarks/token_finetune.py                        # tiny, small × B = 8 … 512
    python benchmarks/token_finetune.py --quick                # under a minute: tiny, B = 8, K = 4
    python benchmarks/token_finetune.py --peer-path /opt/torchlib /opt/hflib --parts update peer

Writes ``benchmarks/results/token_finetune-<host>-<date>.json`` (machine,
library versions, settings, load average, every row) and prints a table.
:func:`measure` is the same run as a function.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxil.envs.experts import scripted_expert

from jaxil import envs
from jaxil.algorithms.lm import sft
from jaxil.losses.sequence import agent_token_mask
from jaxil.nn.transformer import PAD, TransformerPolicy, config_for_env, obs_tokens
from jaxil.runs import measure as M
from jaxil.runs.updates import fused_updates

try:
    from benchmarks.token_rollout import (
        HFPeer,
        SideSpec,
        Skip,
        compiled_call,
        finish_row,
        peer_unavailable,
        ratio_of,
        time_sides,
    )
except ImportError:  # run as a script: its own folder is on sys.path, the repository root is not
    from token_rollout import (
        HFPeer,
        SideSpec,
        Skip,
        compiled_call,
        finish_row,
        peer_unavailable,
        ratio_of,
        time_sides,
    )

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ENV_ID = "tokens:repair"
DEFAULT_SIZES = ("tiny", "small")
DEFAULT_BATCHES = (8, 32, 128, 512)
DEFAULT_K = 8
PARTS = ("update", "fused", "peer")
SIDES = {"update": ("update",), "fused": ("fused", "separate"), "peer": ("peer",)}
DATA = ("expert", "random")
QUICK = {"sizes": ("tiny",), "batches": (8,), "repeats": 2, "target_s": 0.5, "k": 4}
IGNORE = -100  # the label PyTorch's cross-entropy skips


# -- the batch -----------------------------------------------------------------------------


def expert_demos(env: envs.MultiAgentEnv, key: jax.Array, num: int) -> sft.TokenEpisodes:
    """``num`` episodes of the environment's scripted expert."""
    return sft.collect_demos(env, scripted_expert(env)[0], None, key, num)


def random_demos(env: envs.MultiAgentEnv, key: jax.Array, num: int) -> sft.TokenEpisodes:
    """``num`` episodes of random non-PAD tokens shaped as ``env``'s, that
    fill each agent's context: every step valid, ``clip(⌊C / T⌋, 1, K)``
    tokens per step (``T = spec.max_steps``), every token but PAD legal,
    random actions."""
    spec = env.spec
    T, n, K, V, C = spec.max_steps, spec.num_agents, env.token_width, spec.num_actions, env.max_context
    per_step = min(K, max(1, C // T))

    @jax.jit
    def draw(key):
        k_obs, k_act = jax.random.split(key)
        toks = jax.random.randint(k_obs, (num, T, n, per_step), 1, V)
        obs = jnp.concatenate([toks, jnp.full((num, T, n, K - per_step), PAD)], -1)
        return sft.TokenEpisodes(
            obs=obs.astype(jnp.float32), avail=jnp.broadcast_to(jnp.arange(V) != PAD, (num, T, n, V)),
            actions=jax.random.randint(k_act, (num, T, n), 1, V).astype(jnp.int32),
            mask=jnp.ones((num, T), bool), won=jnp.zeros((num,), jnp.float32),
            episode_return=jnp.zeros((num,), jnp.float32), env_id=spec.env_id)

    return draw(key)


def loss_mask(batch: sft.TokenEpisodes) -> np.ndarray:
    """``bool [E, T, N]``: the agent tokens :func:`sft.sft_loss` counts (valid
    steps; tokens the grammar forces left out)."""
    n = batch.actions.shape[-1]
    per_episode = jax.vmap(lambda valid, avail: agent_token_mask(valid, n, avail))
    return np.asarray(jax.jit(per_episode)(batch.mask, batch.avail))


def packed_contexts(obs: np.ndarray, token_width: int, max_context: int) -> tuple[np.ndarray, np.ndarray]:
    """What the teacher-forced pass of :class:`TransformerPolicy` runs over.

    Args:
      obs: ``[E, T, N, O]`` observations (token ids in the first
        ``token_width`` columns).

    Returns:
      ``(contexts int32 [E, N, C], at int32 [E, T, N])``: each agent's
      non-PAD tokens packed left into ``C = max_context`` slots (PAD after,
      tokens past ``C`` dropped), and the slot whose logits score step
      ``t``'s action (the last stored token at or before the step's chunk;
      -1 before the first token).
    """
    toks = np.asarray(obs_tokens(jnp.asarray(obs), token_width))  # [E, T, N, K]
    E, T, N, K = toks.shape
    toks = toks.transpose(0, 2, 1, 3).reshape(E, N, T * K)
    real = toks != PAD
    pos = np.cumsum(real, axis=-1) - 1
    kept = real & (pos < max_context)
    contexts = np.full((E, N, max_context), PAD, np.int32)
    e, n, _ = np.nonzero(kept)
    contexts[e, n, pos[kept]] = toks[kept]
    at = np.cumsum(kept, axis=-1).reshape(E, N, T, K)[..., -1] - 1
    return contexts, at.transpose(0, 2, 1).astype(np.int32)


def shifted_labels(actions: np.ndarray, mask: np.ndarray, at: np.ndarray,
                   max_context: int) -> np.ndarray:
    """``int64 [E, N, C]`` labels for a causal LM that shifts them by one
    (logits at slot ``p`` score ``labels[p + 1]``, as GPT-2's loss): step
    ``t``'s action at slot ``at + 1`` where ``mask`` counts it, :data:`IGNORE`
    elsewhere. Tokens scored before any context (``at = -1``) or from the
    last slot have no such slot and are left out."""
    E, _, N = actions.shape
    labels = np.full((E, N, max_context), IGNORE, np.int64)
    ok = mask & (at >= 0) & (at + 1 < max_context)
    e, t, n = np.nonzero(ok)
    labels[e, n, at[e, t, n] + 1] = actions[e, t, n]
    return labels


# -- the jaxil programs --------------------------------------------------------------------


def sft_update(student: TransformerPolicy, tx: optax.GradientTransformation) -> Callable:
    """``(state, key, batch) -> (state, {"loss"})``: one Adam step on
    :func:`sft.sft_loss` of ``batch`` (the update of :func:`sft.sft_program`
    on a given minibatch)."""

    def update(state: sft.SFTState, key: jax.Array, batch: sft.TokenEpisodes):
        del key  # the minibatch is given
        loss, grads = jax.value_and_grad(lambda p: sft.sft_loss(student, p, batch))(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return (state.replace(params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state), {"loss": loss})

    return update


def update_programs(student: TransformerPolicy, tx: optax.GradientTransformation,
                    k: int) -> dict[str, Callable]:
    """``{"update", "fused"}``: ``(state, batch) -> (state, metrics, health)``,
    :func:`fused_updates` of :func:`sft_update` with 1 and ``k`` updates."""
    update = sft_update(student, tx)

    def program(n):
        return lambda state, batch: fused_updates(
            lambda s, key: update(s, key, batch), state, n)

    return {"update": program(1), "fused": program(k)}


def initial_state(student: TransformerPolicy, tx: optax.GradientTransformation,
                  seed: int) -> sft.SFTState:
    """The :class:`sft.SFTState` an SFT run with ``seed`` starts from."""

    @jax.jit
    def init(key):
        k_init, k_run = jax.random.split(key)
        params = student.init(k_init)
        return sft.SFTState(params=params, opt_state=tx.init(params), key=k_run)

    return init(jax.random.PRNGKey(seed))


# -- the peer ------------------------------------------------------------------------------


def peer_train_step(peer: HFPeer, contexts: np.ndarray, labels: np.ndarray, learning_rate: float,
                    max_grad_norm: float) -> Callable[[], float]:
    """A call that takes one training step of ``peer.model`` on ``contexts
    [S, C]`` with ``labels [S, C]`` (:func:`shifted_labels`) and returns the
    loss once the device is done."""
    torch = peer.torch
    model = peer.model.train()
    ids = torch.as_tensor(contexts, dtype=torch.long, device=peer.device)
    attention = (ids != PAD).long()
    targets = torch.as_tensor(labels, dtype=torch.long, device=peer.device)
    opt = torch.optim.Adam(model.parameters(), lr=learning_rate)

    def run():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=attention, labels=targets).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        if peer.device == "cuda":
            torch.cuda.synchronize()
        return loss.item()

    return run


def add_peer_path(paths: Sequence[str]) -> list[str]:
    """Append ``paths`` (folders holding ``torch`` / ``transformers``) to
    ``sys.path`` after this environment's own packages; returns them."""
    out = []
    for p in paths:
        p = os.path.abspath(p)
        if not os.path.isdir(p):
            raise ValueError(f"--peer-path {p} is not a folder; give the folders that hold the "
                             "torch and transformers packages")
        if p not in sys.path:
            sys.path.append(p)
        out.append(p)
    importlib.invalidate_caches()
    return out


# -- one size, one batch -------------------------------------------------------------------


def measure_point(size: str, batch: sft.TokenEpisodes, *, student: TransformerPolicy,
                  sft_config: sft.SFTConfig, tx: optax.GradientTransformation,
                  state: sft.SFTState, peer, sides: Sequence[str], k: int, repeats: int,
                  target_s: float, max_call_s: float, history: dict, precision: str,
                  deadline: float, log=print) -> dict[str, Any]:
    """The row of one size and batch of episodes: every side of ``sides``
    timed alternately (see the module docstring); ``tx`` is ``sft_config``'s
    optimiser, ``state`` the initial :class:`sft.SFTState`."""
    cfg = student.config
    B, C = batch.num_episodes, cfg.max_context
    mask = loss_mask(batch)
    contexts, at = packed_contexts(np.asarray(batch.obs), cfg.token_width, C)
    labels = shifted_labels(np.asarray(batch.actions), mask, at, C)
    loss_tokens = int(mask.sum())
    ctx_tokens = int((contexts != PAD).sum())
    row: dict[str, Any] = {
        "size": size, "batch": B, "agents": int(contexts.shape[1]), "k": k,
        "loss_tokens": loss_tokens, "context_tokens": ctx_tokens,
        "context_slots": int(contexts.size), "context_fill": ctx_tokens / contexts.size,
        "peer_label_tokens": int((labels != IGNORE).sum()), "sides": {}}
    progs = update_programs(student, tx, k)
    compiled: dict[str, Any] = {}

    def jaxil_call(name, info):
        if name not in compiled:
            compiled[name] = compiled_call(progs[name], (state, batch), info, precision)
        else:
            info["compile_s"] = None  # compiled for the update side
        return compiled[name]

    def prepare(name):
        def run(info):
            if name == "peer" and peer is None:
                raise Skip("peer unavailable")
            info["updates"] = 1 if name in ("update", "peer") else k
            info["context_tokens"] = ctx_tokens * info["updates"]
            if name == "peer":
                info["compile_s"] = None
                N = contexts.shape[1]
                return peer_train_step(peer, contexts.reshape(B * N, C), labels.reshape(B * N, C),
                                       sft_config.learning_rate, sft_config.max_grad_norm)
            if name != "separate":
                return jaxil_call(name, info)
            one = jaxil_call("update", info).func

            def separate():
                s = state
                for _ in range(k):
                    s, _, _ = one(s, batch)
                return s

            return separate

        return run

    after_k: dict[str, Any] = {}  # the parameters after the warm-up's K updates

    def check(name):
        def run(info, out):
            if name == "separate":
                after_k[name] = out.params
                return
            loss = out if name == "peer" else float(out[1]["loss"])
            info["warmup_loss"] = loss  # the warm-up call's (last) update
            if not math.isfinite(loss):
                raise RuntimeError(f"{size} B={B} {name}: the warm-up's loss is {loss}")
            if name == "fused":
                after_k[name] = out[0].params

        return run

    specs = [SideSpec(name, loss_tokens * (1 if name in ("update", "peer") else k), prepare(name),
                      check(name)) for name in sides]
    row["sides"] = time_sides(specs, B, repeats=repeats, target_s=target_s, max_call_s=max_call_s,
                              history=history, deadline=deadline)
    if len(after_k) == 2:  # both did the same K updates from the same state
        row["fused_separate_max_param_diff"] = float(max(jax.tree.leaves(jax.tree.map(
            lambda a, b: jnp.max(jnp.abs(a - b)), after_k["fused"], after_k["separate"]))))
    for info in row["sides"].values():
        if not info.get("skipped"):
            info["updates_per_s"] = info["updates"] / info["call_s"]
    finish_row(row, size, B, _ratios, log)
    return row


def _ratios(row: dict[str, Any]) -> None:
    row["jaxil_over_peer"] = ratio_of(row, "update", "peer")
    row["fused_over_peer"] = ratio_of(row, "fused", "peer")
    row["fused_over_separate"] = ratio_of(row, "fused", "separate")


# -- the run -------------------------------------------------------------------------------


def measure(sizes: Sequence[str] = DEFAULT_SIZES, batches: Sequence[int] = DEFAULT_BATCHES, *,
            parts: Sequence[str] = PARTS, env_id: str = ENV_ID,
            env_kwargs: dict[str, Any] | None = None, model_overrides: dict[str, Any] | None = None,
            data: str = "expert", k: int = DEFAULT_K,
            repeats: int = 5, target_s: float = 2.0, max_call_s: float = 60.0,
            budget_s: float | None = None, precision: str = "fp32", peer_device: str = "auto",
            torch_threads: int | None = None, peer_path: Sequence[str] = (), seed: int = 0,
            log=print) -> dict[str, Any]:
    """The whole benchmark as a function: ``{"machine", "versions",
    "config", "peer", "definitions", "rows", "load", "wall_s"}`` (what
    :func:`main` writes as JSON). ``env_kwargs`` are the environment's knobs
    (default: its defaults); ``model_overrides`` replace fields of every
    size's :class:`~jaxil.nn.transformer.TransformerConfig` (e.g. fewer
    layers for a smoke test); ``budget_s`` bounds the run (what is left when
    it is spent is recorded as skipped)."""
    if precision not in ("fp32", "tf32"):
        raise ValueError(f"precision {precision!r}: choose fp32 or tf32 (float32 weights on both sides)")
    if data not in DATA:
        raise ValueError(f"data {data!r}: choose one of {', '.join(DATA)}")
    if k < 1:
        raise ValueError(f"k (updates per fused call) must be >= 1, got {k}")
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise ValueError(f"batches must be positive, got {batches}")
    t0 = time.perf_counter()
    deadline = t0 + (budget_s if budget_s is not None else math.inf)
    load = {"start": M.loadavg()}
    peer_path = add_peer_path(peer_path)
    env = envs.make(env_id, **(env_kwargs or {}))
    C = env.max_context
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = int(torch_threads or cpus)
    sides = [s for p in PARTS if p in parts for s in SIDES[p]]

    peer_reason = peer_unavailable() if "peer" in parts else "not requested (--parts)"
    device = peer_device
    if peer_reason is None and device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    peer_info: dict[str, Any] = {"skipped": peer_reason, "device": device if peer_reason is None else None}

    t_data = time.perf_counter()
    make = expert_demos if data == "expert" else random_demos
    pool = jax.block_until_ready(make(env, jax.random.PRNGKey(seed + 1), batches[-1]))
    data_s = time.perf_counter() - t_data
    sft_cfg = sft.SFTConfig()
    config = {"env": env_id, "env_kwargs": dict(env_kwargs or {}),
              "model_overrides": dict(model_overrides or {}), "data": data,
              "data_s": data_s, "sizes": list(sizes), "batches": batches, "parts": list(parts),
              "k": k, "repeats": repeats, "target_s": target_s, "max_call_s": max_call_s,
              "budget_s": budget_s, "context": C, "max_steps": env.spec.max_steps,
              "agents": env.spec.num_agents, "token_width": env.token_width,
              "learning_rate": sft_cfg.learning_rate, "max_grad_norm": sft_cfg.max_grad_norm,
              "precision": precision,
              "jax_matmul_precision": {"fp32": "float32", "tf32": "tensorfloat32"}[precision],
              "peer_device": device, "peer_path": peer_path, "cpus_usable": cpus,
              "torch_threads": threads, "seed": seed,
              "episodes_won": float(np.mean(np.asarray(pool.won)))}
    rows: list[dict[str, Any]] = []
    for size in sizes:
        sft_size = sft.SFTConfig(size=size)
        student = (TransformerPolicy(config_for_env(env, size, **model_overrides))
                   if model_overrides else sft.make_student(env, sft_size))
        cfg = student.config
        tx = sft._optimizer(sft_size)
        state = initial_state(student, tx, seed)
        peer = None
        if peer_reason is None:
            try:
                peer = HFPeer(cfg, device, threads, tf32=precision == "tf32", seed=seed)
                peer_info.update(peer.info())
            except Exception as e:  # noqa: BLE001 - recorded, never a traceback
                peer_reason = peer_info["skipped"] = f"building the peer failed: {type(e).__name__}: {e}"
        history: dict[str, tuple[int, float]] = {}
        log(f"{size}: d={cfg.d_model}, {cfg.num_layers} layers, {cfg.num_heads} heads, "
            f"{cfg.num_params():,} parameters, V={cfg.vocab_size}, C={C}, K={k}", flush=True)
        for b in batches:
            row = measure_point(size, pool.take(slice(0, b)), student=student,
                                sft_config=sft_size, tx=tx, state=state, peer=peer, sides=sides, k=k, repeats=repeats,
                                target_s=target_s, max_call_s=max_call_s, history=history,
                                precision=precision, deadline=deadline, log=log)
            row.update(d_model=cfg.d_model, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                       num_params=cfg.num_params())
            if peer is not None:
                row["hf_num_params"] = peer.num_params
            rows.append(row)
            jax.clear_caches()  # one point's executables in memory at a time
        del peer
    load["end"] = M.loadavg()
    versions = M.library_versions()
    versions.update({name: peer_info.get(name) for name in ("torch", "transformers")})
    return {
        "machine": M.machine_info(),
        "versions": versions,
        "config": config,
        "peer": peer_info,
        "definitions": {
            "update": "one jitted SFT update: value_and_grad of sft_loss over the B episodes, "
                      "global-norm clip, Adam (fused_updates with K = 1)",
            "fused": "K updates in one jitted lax.scan (fused_updates, as a run-engine chunk)",
            "separate": "the compiled update called K times from Python, the state passed on, "
                        "waited for once after the last",
            "peer": "one training step of transformers GPT2LMHeadModel (same dimensions, random "
                    "weights) on the packed contexts [B*N, C], labels where the loss counts a "
                    "token: zero_grad, forward with labels, backward, clip_grad_norm_, Adam",
            "loss_tokens": "agent tokens the SFT loss counts in one update (valid steps; tokens "
                           "the grammar forces left out)",
            "context_tokens": "non-PAD tokens of the packed contexts in one update (what the "
                              "teacher-forced pass runs over)",
            "context_slots": "B * N * C, the positions the teacher-forced pass computes",
            "tokens_per_s": "loss_tokens * updates per call / median call seconds",
            "context_tokens_per_s": "context_tokens * updates per call / median call seconds",
            "peer_label_tokens": "labels the peer's loss counts (loss tokens scored before any "
                                 "context or from the last slot have no label slot)",
            "jaxil_over_peer": "update tokens/s / peer tokens/s (one step each)",
            "fused_over_peer": "fused tokens/s / peer tokens/s",
            "fused_over_separate": "fused tokens/s / separate tokens/s (the dispatch saving)",
            "fused_separate_max_param_diff": "largest difference of a parameter after the K "
                                             "updates of the fused and the separate warm-up "
                                             "calls (the same updates: float rounding only)",
        },
        "rows": rows,
        "load": load,
        "wall_s": time.perf_counter() - t0,
    }


COLUMNS = [
    ("size", "size", "{}"),
    ("batch", "B", "{}"),
    ("loss_tokens", "loss tok", "{}"),
    ("context_tokens", "ctx tok", "{}"),
    ("update_tokens_per_s", "update tok/s", "{:.0f}"),
    ("update_context_tokens_per_s", "ctx tok/s", "{:.0f}"),
    ("fused_tokens_per_s", "fused tok/s", "{:.0f}"),
    ("separate_tokens_per_s", "separate", "{:.0f}"),
    ("fused_over_separate", "fused/sep", "{:.2f}"),
    ("peer_tokens_per_s", "peer tok/s", "{:.0f}"),
    ("jaxil_over_peer", "jaxil/peer", "{:.2f}"),
    ("fused_over_peer", "fused/peer", "{:.2f}"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", choices=("tiny", "mini", "small", "base"), default=None,
                   help=f"transformer sizes (default: {' '.join(DEFAULT_SIZES)})")
    p.add_argument("--batches", nargs="+", type=int, default=None,
                   help=f"episodes per update (default: {' '.join(map(str, DEFAULT_BATCHES))})")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="what to time (fused: fused and separate)")
    p.add_argument("--data", choices=DATA, default="expert",
                   help="the episodes: the scripted expert's or random tokens filling the context")
    p.add_argument("--k", type=int, default=None,
                   help=f"updates per fused call (default {DEFAULT_K})")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny, B = 8, K = 4, 2 repeats (under a minute)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds at most (default 5)")
    p.add_argument("--target-s", type=float, default=None,
                   help="about this many seconds of timed calls per side (default 2)")
    p.add_argument("--max-call-s", type=float, default=60.0,
                   help="skip a side whose call is predicted to take longer (default %(default)s)")
    p.add_argument("--budget-s", type=float, default=None, help="bound on the whole run")
    p.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                   help="matmul precision on both sides (GPU only; CPUs compute fp32 either way)")
    p.add_argument("--peer-device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the transformers peer runs (auto: CUDA when torch sees a GPU)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch CPU threads (default: the CPUs this process may use, as XLA)")
    p.add_argument("--peer-path", nargs="+", default=[], metavar="DIR",
                   help="folders holding torch and transformers, appended to sys.path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None, help="where the JSON goes (default benchmarks/results)")
    p.add_argument("--name", default="token_finetune", help="JSON file name prefix")
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batches or ()):
        p.error("--batches must be positive")
    if args.k is not None and args.k < 1:
        p.error("--k must be >= 1")
    defaults = {"sizes": DEFAULT_SIZES, "batches": DEFAULT_BATCHES, "repeats": 5, "target_s": 2.0,
                "k": DEFAULT_K}
    for key, v in (QUICK if args.quick else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, v)
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    m = M.machine_info()
    print(f"jaxil token fine-tuning on {m['cpu_model']} ({m['cpus_usable']} CPUs, backend "
          f"{m['backend']}), jax {jax.__version__}, load {M.loadavg()}", flush=True)
    try:
        payload = measure(args.sizes, args.batches, parts=args.parts, data=args.data, k=args.k,
                          repeats=args.repeats, target_s=args.target_s, max_call_s=args.max_call_s,
                          budget_s=args.budget_s, precision=args.precision,
                          peer_device=args.peer_device, torch_threads=args.torch_threads,
                          peer_path=args.peer_path, seed=args.seed)
    except ValueError as e:
        if "--peer-path" in str(e):
            sys.exit(f"token_finetune: {e}")
        raise
    payload["config"]["quick"] = args.quick
    path = M.write_json(args.name, payload, args.out_dir or RESULTS_DIR)
    print()
    print(M.format_table(payload["rows"], COLUMNS))
    if payload["peer"]["skipped"]:
        print(f"peer skipped: {payload['peer']['skipped']}")
    for r in payload["rows"]:
        for name, s in r["sides"].items():
            if s.get("skipped") and not (name == "peer" and payload["peer"]["skipped"]):
                print(f"skipped: {r['size']} B={r['batch']} {name}: {s['skipped']}")
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
