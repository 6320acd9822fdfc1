"""O-MAPL: offline multi-agent preference learning (Phase 1 of MisoDICE).

From pairs of trajectory segments and a preference per pair, O-MAPL
(ICML 2025; github.com/vietbt/OMAPL) learns local Q_i(o_i, a_i), V_i(o_i)
and a decentralised policy. One hypernetwork mixer (weights |w(s)| ≥ 0, bias
b(s)) mixes both Q and V, and the implicit team reward is

    r_t = Q_tot(s_t, a_t) − γ(1 − d_t)·V̄_tot(s_{t+1})

(V̄: target V networks and target mixer). Per update, on B pairs of segments:

1. preference (Q and mixer): BCE(Σ_t r^x_t − Σ_t r^y_t, label) + c·E[r²];
2. value (V): Gumbel regression of V_i towards the target Q̄_i through the
   target mixer weights, z_i = clip(w̄_i(Q̄_i − V_i)/β), the clip inside the
   exponential only as in the authors' code (`value_clip_mode="authors"`: a V
   past the clip range is still pulled back; `"flat"` clips the linear term
   too, zero gradient there;
   [`jaxil.losses.gumbel_value_loss`][jaxil.losses.value.gumbel_value_loss]);
3. actor: weighted BC with weights exp(z_i) per agent;
4. soft target update with rate τ.

All steps of both segments (masked past an episode's end) are the samples
of steps 2–3. The learned return Σ_t r_t scores whole trajectories for
labelling (`jaxil.algorithms.labelling.label`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxil.envs.core import EnvSpec
from jaxil.data.sampling import Segments
from jaxil.algorithms.offline.base import (DISCOUNT, NONNEGATIVE, POSITIVE, Learner, LearnerState, Range,
                                 adam, apply_grads, init_opt)
from jaxil.algorithms.offline.bc import _check_common
from jaxil.nn.policy import DEFAULT_BOX, PolicyNet, encode_actions
from jaxil.losses import agent_weighted_bc_loss, gumbel_value_loss, gumbel_weights, preference_loss
from jaxil.nn.mixing import mix
from jaxil.nn.nets import HyperMixer, LocalMLP
from jaxil.data.preferences import pair_segments


#: "authors": z is clipped inside exp only (github.com/vietbt/OMAPL, trainers/omarl.py);
#: "flat": the linear term is clipped too, so the loss is flat outside the clip range.
VALUE_CLIP_MODES = ("authors", "flat")


@dataclasses.dataclass(frozen=True)
class OMAPLConfig:
    hidden: tuple[int, ...] = (256, 256)
    mixer_hidden: int = 64
    shared: bool = True
    batch_size: int = 32  # preference pairs per update
    max_grad_norm: float = 1.0
    value_clip: float = 10.0
    value_clip_mode: str = "authors"  # or "flat" (XQL's form)
    box: str = DEFAULT_BOX["state"]  # the policy's head on box actions (jaxil.nn.policy)

    def __post_init__(self):
        if self.mixer_hidden <= 0:
            raise ValueError(f"mixer_hidden must be positive, got {self.mixer_hidden}")
        if self.value_clip <= 0:
            raise ValueError(f"value_clip must be positive, got {self.value_clip}")
        if self.value_clip_mode not in VALUE_CLIP_MODES:
            raise ValueError(f"value_clip_mode must be one of {VALUE_CLIP_MODES}, got "
                             f"{self.value_clip_mode!r}")
        _check_common(self)


@struct.dataclass
class OMAPLHParams:
    gamma: jax.Array
    beta: jax.Array  # Gumbel temperature (`alpha` = 10 in the authors' code)
    reg_coef: jax.Array  # weight of E[r²]; 0.5 in O-MAPL
    tau: jax.Array  # soft target-update rate
    lr_q: jax.Array
    lr_v: jax.Array
    lr_actor: jax.Array

    RANGES: ClassVar[dict] = dict(
        gamma=DISCOUNT, beta=POSITIVE._replace(why="the Gumbel temperature"),
        reg_coef=NONNEGATIVE, tau=Range(0.0, 1.0, lo_open=True, why="a soft-update rate"),
        lr_q=POSITIVE, lr_v=POSITIVE, lr_actor=POSITIVE)


@struct.dataclass
class PreferenceData:
    """Answered queries on device: both sides `[Q, L(+1), ...]` and the
    probability `label [Q]` that side x is preferred (no NaN)."""

    x: Segments
    y: Segments
    label: jax.Array

    @staticmethod
    def from_pairs(dataset, pairs, prefs) -> "PreferenceData":
        """Device arrays of the queries whose preference is a number (NaN = the
        oracle gave no answer; those queries are dropped)."""
        import numpy as np


        prefs = np.asarray(prefs, np.float32)
        if prefs.shape != (len(pairs),):
            raise ValueError(f"preferences have shape {prefs.shape}; expected ({len(pairs)},), "
                             "one per query")
        keep = np.isfinite(prefs)
        if not keep.any():
            raise ValueError("the oracle answered none of the queries; nothing to learn from")
        if np.any((prefs[keep] < 0) | (prefs[keep] > 1)):
            raise ValueError("preferences must be probabilities in [0, 1]")
        x, y = pair_segments(dataset, pairs.take(np.flatnonzero(keep)))
        return PreferenceData(x=jax.tree.map(jnp.asarray, x), y=jax.tree.map(jnp.asarray, y),
                              label=jnp.asarray(prefs[keep]))

    @property
    def num_pairs(self) -> int:
        return int(self.label.shape[0])


class _Nets:
    """Local Q_i, V_i and the mixer, and the implicit reward they define."""

    def __init__(self, spec: EnvSpec, config: OMAPLConfig):
        n = spec.num_agents
        self.spec = spec
        # Discrete: Q_i(o_i, ·) for every action, gathered at a_i; continuous: Q_i(o_i, a_i).
        self.q = LocalMLP(out_dim=spec.num_actions if spec.discrete else 1, num_agents=n,
                          hidden=config.hidden, shared=config.shared)
        self.v = LocalMLP(out_dim=1, num_agents=n, hidden=config.hidden, shared=config.shared)
        self.mixer = HyperMixer(num_agents=n, hidden=config.mixer_hidden)

    def local_q(self, q_params, obs, actions):
        """`[..., N]` Q_i(o_i, a_i) for the data actions."""
        if self.spec.discrete:
            qs = self.q.apply(q_params, obs)
            return jnp.take_along_axis(qs, actions[..., None].astype(jnp.int32), -1)[..., 0]
        x = jnp.concatenate([obs, encode_actions(self.spec, actions)], -1)
        return self.q.apply(q_params, x)[..., 0]

    def implicit_rewards(self, params, gamma, seg: Segments, target_mix=None):
        """`[B, L]` rewards r_t = Q_tot(s_t,a_t) − γ(1−d_t)·V̄_tot(s_{t+1}),
        zero past the episode's end (`seg.mask`). `target_mix`: the target
        mixer's `(w, b)` on all `L+1` states when the caller has them."""
        obs, nxt = seg.obs[:, :-1], seg.obs[:, 1:]
        w, b = self.mixer.apply(params["mixer"], seg.global_state[:, :-1])
        q_tot = mix(self.local_q(params["q"], obs, seg.actions), w, b)
        tgt = params["target"]
        if target_mix is None:
            w_n, b_n = self.mixer.apply(tgt["mixer"], seg.global_state[:, 1:])
        else:
            w_n, b_n = target_mix[0][:, 1:], target_mix[1][:, 1:]
        v_next = jax.lax.stop_gradient(mix(self.v.apply(tgt["v"], nxt)[..., 0], w_n, b_n))
        not_done = 1.0 - seg.done.astype(jnp.float32)
        return (q_tot - gamma * not_done * v_next) * seg.mask.astype(jnp.float32)


def make_omapl(spec: EnvSpec, config: OMAPLConfig = OMAPLConfig()) -> Learner:
    n = spec.num_agents
    pi = PolicyNet(spec, config.hidden, config.shared, box=config.box)
    nets = _Nets(spec, config)
    q_net, v_net, mixer = nets.q, nets.v, nets.mixer
    local_q, implicit_rewards = nets.local_q, nets.implicit_rewards
    tx = adam(config.max_grad_norm)
    groups = ("q", "mixer", "v", "policy")

    def default_hparams():
        return OMAPLHParams(
            gamma=jnp.float32(0.99), beta=jnp.float32(10.0), reg_coef=jnp.float32(0.5),
            tau=jnp.float32(0.005), lr_q=jnp.float32(3e-4), lr_v=jnp.float32(3e-4),
            lr_actor=jnp.float32(3e-4),
        )

    def init(key, hparams=None):
        hparams = default_hparams() if hparams is None else hparams
        kq, kv, km, kp, ks = jax.random.split(key, 5)
        obs = jnp.zeros((1, n, spec.obs_dim), jnp.float32)
        act = encode_actions(spec, jnp.zeros((1, n) + spec.action.shape,
                                             jnp.int32 if spec.discrete else jnp.float32))
        q_in = obs if spec.discrete else jnp.concatenate([obs, act], -1)
        online = {
            "q": q_net.init(kq, q_in),
            "mixer": mixer.init(km, jnp.zeros((1, spec.state_dim), jnp.float32)),
            "v": v_net.init(kv, obs),
            "policy": pi.init(kp),
        }
        params = dict(online, target={k: online[k] for k in ("q", "mixer", "v")})
        lrs = {"q": hparams.lr_q, "mixer": hparams.lr_q, "v": hparams.lr_v, "policy": hparams.lr_actor}
        opt = {k: init_opt(tx, online[k], lrs[k]) for k in groups}
        return LearnerState(params, opt, hparams, jnp.int32(0), ks)

    def sample(key, data: PreferenceData):
        idx = jax.random.randint(key, (config.batch_size,), 0, data.label.shape[0])
        take = lambda t: jax.tree.map(lambda a: a[idx], t)  # noqa: E731
        return take(data.x), take(data.y), data.label[idx]

    def step_losses(params, hp: OMAPLHParams, seg: Segments, w_tgt):
        """Value and actor losses on every valid step of a segment batch;
        `w_tgt` [B, L, N]: the target mixer's weights at each step."""
        obs = seg.obs[:, :-1]
        q_tgt = local_q(params["target"]["q"], obs, seg.actions)
        v = v_net.apply(params["v"], obs)[..., 0]
        flat = lambda a: a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])  # noqa: E731
        q_tgt, w_tgt, v, mask = flat(q_tgt), flat(w_tgt), flat(v), flat(seg.mask)
        v_loss = gumbel_value_loss(q_tgt, v, w_tgt, hp.beta, config.value_clip, mask,
                                   clip_linear=config.value_clip_mode == "flat")
        weights = gumbel_weights(q_tgt, v, w_tgt, hp.beta, config.value_clip)
        logp = pi.log_prob(params["policy"], flat(obs), flat(seg.avail[:, :-1]), flat(seg.actions))
        actor = agent_weighted_bc_loss(logp, weights, mask)
        return v_loss, actor, weights, mask

    def loss_fn(params, hp: OMAPLHParams, batch):
        x, y, label = batch
        # Both sides of every pair go through the networks together: one pass
        # (larger matmuls, half the ops) instead of one per side.
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b], 0), x, y)
        target_mix = jax.lax.stop_gradient(mixer.apply(params["target"]["mixer"], both.global_state))
        rewards = implicit_rewards(params, hp.gamma, both, target_mix)
        b = label.shape[0]
        r_x, r_y = rewards[:b], rewards[b:]
        pref = preference_loss(r_x.sum(-1), r_y.sum(-1), label, rewards, hp.reg_coef, both.mask)
        v_loss, actor, weights, m = step_losses(params, hp, both, target_mix[0][:, :-1])
        logits = r_x.sum(-1) - r_y.sum(-1)
        hard = label != 0.5
        agree = jnp.sum(((logits > 0) == (label > 0.5)) * hard) / jnp.maximum(jnp.sum(hard), 1)
        metrics = {
            "preference_loss": pref,
            "value_loss": v_loss,
            "actor_loss": actor,
            "pair_accuracy": agree,
            "reward_mean": jnp.sum(rewards) / jnp.maximum(jnp.sum(both.mask), 1),
            "weight_max": jnp.max(weights * m[:, None]),
        }
        return pref + v_loss + actor, metrics

    def update(state: LearnerState, batch):
        online = {k: state.params[k] for k in groups}
        target = state.params["target"]

        def f(p):
            return loss_fn(dict(p, target=target), state.hparams, batch)

        grads, metrics = jax.grad(f, has_aux=True)(online)
        online, opt = apply_grads(tx, online, grads, state.opt_state)
        tau = state.hparams.tau
        target = {k: optax.incremental_update(online[k], target[k], tau) for k in target}
        params = dict(online, target=target)
        return state.replace(params=params, opt_state=opt, step=state.step + 1), metrics

    act, policy = pi.learner_fns()

    return Learner("omapl", config, init, sample, update, act, default_hparams, policy)


def learned_returns(spec: EnvSpec, config: OMAPLConfig, params, gamma, trajectories: Segments):
    """`[M]` learned returns Σ_t r_t of (whole) trajectories; jittable,
    `spec`/`config` static."""
    return _Nets(spec, config).implicit_rewards(params, gamma, trajectories).sum(-1)
