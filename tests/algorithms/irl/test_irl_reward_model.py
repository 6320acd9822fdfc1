"""Reward models (jaxil.algorithms.irl.reward_model) and the trajectory-score maths
(jaxil.losses.trajectory), against float64 numpy references."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil import losses as L
from jaxil.data.sampling import Transitions
from jaxil.algorithms.irl.reward_model import (
    RewardData,
    RewardModel,
    RewardModelConfig,
    StepBatch,
    analytic_reward,
    init_params,
    pad_transitions,
    source_roles,
)
from jaxil.nn.policy import PolicyNet
from helpers.fast_compile import fast_call  # XLA level 0: compiling is most of these tests

N, O, S, A = 3, 5, 7, 4
SPEC = EnvSpec("test:rm", N, O, S, DiscreteActions(A), max_steps=6)
BOX = EnvSpec("test:rm-box", N, O, S, ContinuousActions(2), max_steps=6)


def _f64(x):
    return np.asarray(x, np.float64)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _relu(x):
    return np.maximum(x, 0.0)


def _np_mlp(p, x):
    """float64 forward of a jaxil.nn.nets.MLP with ReLU."""
    names = sorted(k for k in p if k.startswith("hidden_"))
    for k in names:
        x = _relu(x @ _f64(p[k]["kernel"]) + _f64(p[k]["bias"]))
    return x @ _f64(p["out"]["kernel"]) + _f64(p["out"]["bias"])


def _np_reward(params, spec, cfg, obs, actions, state):
    """float64 reference of r(s, a): local logits of obs ⊕ one-hot(a) ⊕ id,
    mixed by |W2 relu(W1 s)| and the bias head."""
    obs, state = _f64(obs), _f64(state)
    onehot = np.eye(spec.num_actions)[np.asarray(actions)] if spec.discrete else _f64(actions)
    x = np.concatenate([obs, onehot], -1)
    lp = params["local"]["params"]
    if cfg.shared:
        ids = np.broadcast_to(np.eye(N), x.shape[:-1] + (N,))
        local = _np_mlp(lp["mlp"], np.concatenate([x, ids], -1))[..., 0]
    else:
        local = np.stack([_np_mlp(jax.tree.map(lambda a: a[i], lp["agents"]), x[..., i, :])[..., 0]
                          for i in range(N)], -1)
    if cfg.mixing == "none":
        return local
    if cfg.mixing == "sum":
        return local.sum(-1)
    mp = params["mixer"]["params"]
    h = _relu(state @ _f64(mp["trunk"]["kernel"]) + _f64(mp["trunk"]["bias"]))
    w = np.abs(h @ _f64(mp["weights"]["kernel"]) + _f64(mp["weights"]["bias"]))
    b = (h @ _f64(mp["bias"]["kernel"]) + _f64(mp["bias"]["bias"]))[..., 0]
    return (w * local).sum(-1) + b


def _batch(seed, b, spec=SPEC):
    """``b`` random steps, drawn in numpy (an eager ``jax.random`` draw
    compiles for seconds at every new shape)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(b, N, O)).astype(np.float32)
    if spec.discrete:
        act = rng.integers(0, A, (b, N)).astype(np.int32)
    else:
        act = rng.uniform(-1, 1, (b, N, 2)).astype(np.float32)
    return StepBatch(obs, act, rng.normal(size=(b, S)).astype(np.float32))


def _random_params(model, seed):
    """Random float32 parameters in the tree of ``model.init`` (its shapes
    from ``jax.eval_shape``, nothing compiled): kernels N(0, 1/fan_in),
    biases N(0, 0.1²), biases nonzero unlike at init. The maths tests read
    the network off whatever parameters it gets (the numpy references take
    the same ones); ``RewardModel.init`` itself is compiled in
    test_bad_input_gets_one_line_errors and the training test."""
    rng = np.random.default_rng(seed)

    def draw(path, x):
        kernel = "kernel" in jax.tree_util.keystr(path)
        scale = 1.0 / np.sqrt(x.shape[-2]) if kernel else 0.1
        return (scale * rng.normal(size=x.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(model.init, jax.random.PRNGKey(0)))


CONFIGS = [
    RewardModelConfig(mixing="hyper", hidden=(16, 8), mixer_hidden=8),
    RewardModelConfig(mixing="sum", hidden=(16,)),
    RewardModelConfig(mixing="none", hidden=(16,)),  # independent per-agent nets
    RewardModelConfig(mixing="none", hidden=(16,), shared=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda x: f"{x.mixing}-shared{x.shared}")
def test_step_reward_matches_numpy(cfg):
    """step_reward (jitted; the network is not eager-tested, its maths is in
    the numpy reference) is the mixed local logit: fails if the mixer weights
    lose their abs, the bias is dropped, the action one-hot is left out, or
    the per-agent mode mixes (wrong shape) or sums."""
    rm = RewardModel(SPEC, cfg)
    params = _random_params(rm, 0)
    b = _batch(1, 11)

    def flat_and_leading(params, obs, actions, state):  # one compiled program for both calls
        return (rm.step_reward(params, obs, actions, state),
                # leading dims [E, T, ...]
                rm.step_reward(params, obs[:10].reshape(2, 5, N, O), actions[:10].reshape(2, 5, N),
                               state[:10].reshape(2, 5, S)))

    got, got2 = fast_call(flat_and_leading, params, b.obs, b.actions, b.global_state)
    want = _np_reward(params, SPEC, cfg, b.obs, b.actions, b.global_state)
    assert got.shape == ((11, N) if cfg.mixing == "none" else (11,))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    # leading dims [E, T, ...] work and agree with the flat call
    np.testing.assert_allclose(np.asarray(got2).reshape(got[:10].shape), got[:10], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=lambda c: c.mixing)
def test_loss_matches_numpy(cfg):
    """The discriminator loss without penalty: mean softplus(−r) on positives
    + mean softplus(r) on negatives (summed over agents per agent). Fails if
    the labels are swapped (positives scored as negatives), the penalty is
    added when off, or the per-agent losses are averaged."""
    cfg = RewardModelConfig(**{**cfg.__dict__, "grad_penalty": False})
    rm = RewardModel(BOX, cfg)
    params = _random_params(rm, 2)
    pos, neg = _batch(3, 9, BOX), _batch(4, 13, BOX)
    loss, m = fast_call(rm.loss, params, pos, neg, jax.random.PRNGKey(5), 0.1)
    rp = _np_reward(params, BOX, cfg, pos.obs, pos.actions, pos.global_state)
    rn = _np_reward(params, BOX, cfg, neg.obs, neg.actions, neg.global_state)
    want = np.sum(np.mean(_softplus(-rp), 0) + np.mean(_softplus(rn), 0))
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(m["accuracy"], 0.5 * ((rp > 0).mean() + (rn < 0).mean()), atol=1e-6)
    assert float(m["grad_penalty"]) == 0.0


@pytest.mark.parametrize("mixing", ["hyper", "none"])
def test_loss_gradient_penalty_is_the_shared_penalty(mixing):
    """With the penalty, loss = disc loss + gp_coef × the jaxil.losses penalty
    on (obs ⊕ action[, state]) inputs, positives in the expert slot: fails if
    the coefficient is ignored, the penalty sees other inputs or another key,
    or the per-agent model takes the joint (cross-agent) penalty."""
    cfg = RewardModelConfig(mixing=mixing, hidden=(8,), mixer_hidden=4)
    rm = RewardModel(SPEC, cfg)
    params = _random_params(rm, 0)
    pos, neg = _batch(1, 8), _batch(2, 8)
    key = jax.random.PRNGKey(9)
    x = lambda b: jnp.concatenate([b.obs, jax.nn.one_hot(b.actions, A)], -1)  # noqa: E731

    def both(params, pos, neg):
        loss, m = rm.loss(params, pos, neg, key, 0.3)
        if mixing == "none":
            gp = L.agent_gradient_penalty(lambda z: rm.net.local_values(params, z), x(pos),
                                          x(neg), key)
        else:
            gp = L.gradient_penalty(lambda z: rm.net(params, *z), (x(pos), pos.global_state),
                                    (x(neg), neg.global_state), key)
        return loss, m, gp

    loss, m, gp = fast_call(both, params, pos, neg)
    assert float(gp) > 0
    np.testing.assert_allclose(m["grad_penalty"], gp, rtol=1e-6)
    np.testing.assert_allclose(loss, _f64(m["disc_loss"]) + 0.3 * _f64(gp), rtol=1e-6)


@pytest.mark.slow  # 100 vmapped updates with the gradient penalty: ~30 s on a busy CPU
def test_update_learns_to_separate_and_is_vmappable():
    """update_n on two separable sources drives the accuracy up and the reward
    of positives above negatives, for two seeds vmapped at once; padded
    steps (weight 0) are never drawn. Fails if the gradient ascends the loss,
    the optimiser state is not threaded, the labels are swapped, or the
    sampler ignores the weights."""
    rm = RewardModel(SPEC, RewardModelConfig(hidden=(32,), mixer_hidden=8, batch_size=64))

    def trans(seed, k, shift):
        b = jax.tree.map(jnp.asarray, _batch(seed, k))  # indexed by traced draws
        z = lambda *s: jnp.zeros(s)  # noqa: E731
        return Transitions(obs=b.obs + shift, global_state=b.global_state, avail=z(k, N, A) > 0,
                           actions=b.actions, reward=z(k), next_obs=b.obs,
                           next_global_state=b.global_state, next_avail=z(k, N, A) > 0,
                           done=z(k) > 0, init_obs=b.obs, init_global_state=b.global_state,
                           init_avail=z(k, N, A) > 0, traj_index=jnp.zeros(k, jnp.int32),
                           step=jnp.zeros(k, jnp.int32))

    pos = trans(1, 200, 2.0)
    neg, w = pad_transitions(trans(2, 150, -2.0), 200)
    assert w.sum() == 150 and w[150:].sum() == 0
    neg = neg.replace(obs=neg.obs.at[150:].set(1e3) if hasattr(neg.obs, "at")
                      else np.where(np.arange(200)[:, None, None] >= 150, 1e3, neg.obs))
    data = RewardData(pos, jnp.ones(200), jax.tree.map(jnp.asarray, neg), jnp.asarray(w))
    _, drawn = jax.jit(rm.sample)(jax.random.PRNGKey(5), data)
    assert float(jnp.max(drawn.obs)) < 100.0  # padding never drawn
    states = jax.vmap(lambda k: rm.init_state(k, rm.default_hparams(lr=3e-3)))(
        jax.random.split(jax.random.PRNGKey(0), 2))
    run = jax.jit(jax.vmap(lambda s: rm.update_n(s, data, 100)))
    new, metrics, health = run(states)
    assert new.step.tolist() == [100, 100]
    assert np.all(np.asarray(health.params_finite)) and np.all(np.asarray(health.first_bad) == 100)
    assert np.all(np.asarray(metrics["accuracy"]) > 0.95)
    reward = jax.jit(jax.vmap(rm.step_reward, in_axes=(0, None, None, None)))
    r_pos = reward(new.params, pos.obs, pos.actions, pos.global_state)
    r_neg = reward(new.params, neg.obs[:150], neg.actions[:150], neg.global_state[:150])
    assert np.all(np.asarray(r_pos.mean(1)) > np.asarray(r_neg.mean(1)) + 1.0)


@pytest.mark.parametrize("jit", [False, True])
def test_discounted_score_matches_numpy(jit):
    """Σ_t γ^t m_t v_t over valid steps, team and per agent: fails on an
    off-by-one discount (γ^{t+1}), a missing mask, or NaN padding leaking."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=(4, 6, N)).astype(np.float32)
    lengths = np.array([6, 3, 1, 0])
    mask = np.arange(6)[None] < lengths[:, None]
    v_pad = np.where(mask[..., None], v, np.nan).astype(np.float32)
    g = 0.9
    fn = jax.jit(L.discounted_score) if jit else L.discounted_score
    want = np.array([[sum(g ** t * float(v[b, t, i]) for t in range(lengths[b]))
                      for i in range(N)] for b in range(4)])
    np.testing.assert_allclose(fn(v_pad, mask, g), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fn(v_pad[..., 0], mask, jnp.float32(g)), want[:, 0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(fn(v_pad[..., 0], mask, 1.0), (np.nan_to_num(v_pad[..., 0])).sum(1),
                               rtol=1e-5, atol=1e-6)


def test_discounted_score_rejects_bad_shapes():
    """A mask of another length is refused: fails if shapes broadcast silently."""
    with pytest.raises(AssertionError):
        L.discounted_score(jnp.zeros((2, 5)), jnp.ones((2, 4)), 0.9)


def _episodes(seed, e, t, spec):
    """Random padded episodes (numpy) with ragged lengths and random legal actions."""
    rng = np.random.default_rng(seed)
    avail = rng.uniform(size=(e, t + 1, N, A)) < 0.7
    avail[..., 0] = True
    actions = np.array([[[rng.choice(np.flatnonzero(avail[i, j, k])) for k in range(N)]
                         for j in range(t)] for i in range(e)], np.int32)
    lengths = rng.integers(1, t + 1, size=e)
    mask = np.arange(t)[None] < lengths[:, None]
    actions = np.where(mask[..., None], actions, 0).astype(np.int32)

    class Ep:
        pass

    ep = Ep()
    ep.obs = rng.normal(size=(e, t + 1, N, O)).astype(np.float32)
    ep.global_state = rng.normal(size=(e, t + 1, S)).astype(np.float32)
    ep.avail_actions, ep.actions, ep.mask = avail, actions, mask
    return ep


def test_analytic_reward_is_the_brute_force_log_ratio():
    """r_c(τ) = Σ_t Σ_i log π_SFT − log π_0 over valid steps, against a python
    loop over episodes, steps and agents of each policy's log_prob: fails if
    the ratio is inverted, padding steps count, an agent is dropped, or the
    observations are shifted by one step."""
    pi = PolicyNet(SPEC, (16,))
    p_sft, p_0 = _random_params(pi, 1), _random_params(pi, 2)
    ep = _episodes(0, 5, 6, SPEC)
    got, *heads = fast_call(lambda a, b: (analytic_reward(pi.policy(), a, pi.policy(), b, ep),
                                          pi.head(a, ep.obs), pi.head(b, ep.obs)), p_sft, p_0)
    logits = {"sft": _f64(heads[0]), "init": _f64(heads[1])}  # raw network outputs
    avail, actions, mask = (np.asarray(x) for x in (ep.avail_actions, ep.actions, ep.mask))

    def lp(which, e, t, i):  # masked softmax log-probability, by hand
        z = np.where(avail[e, t, i], logits[which][e, t, i], -np.inf)
        return z[actions[e, t, i]] - np.logaddexp.reduce(z)

    want = np.zeros(5)
    for e in range(5):
        for t in range(6):
            if mask[e, t]:
                for i in range(N):
                    want[e] += lp("sft", e, t, i) - lp("init", e, t, i)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(want).max() > 0.1  # the policies differ, so the test can fail


@pytest.mark.parametrize("jit", [False, True])
def test_log_ratio_score_matches_numpy(jit):
    """log_ratio_score: masked sum over time and agents; -inf on padding is
    ignored. Fails if padding is multiplied (NaN) or the sign is flipped."""
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 4, N)), rng.normal(size=(3, 4, N))
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], bool)
    a_pad = np.where(mask[..., None], a, -np.inf).astype(np.float32)
    fn = jax.jit(L.log_ratio_score) if jit else L.log_ratio_score
    want = ((a - b) * mask[..., None]).sum((1, 2))
    np.testing.assert_allclose(fn(a_pad, b.astype(np.float32), mask), want, rtol=1e-5, atol=1e-5)


class StepBatchEp(NamedTuple):
    obs: jax.Array
    actions: jax.Array
    global_state: jax.Array
    mask: jax.Array


def test_trajectory_scores_sum_step_rewards():
    """trajectory_scores = discounted sum of step_reward on obs[:, :T]: fails
    if the final observation (index T) is scored or the mask is ignored."""
    rm = RewardModel(SPEC, RewardModelConfig(hidden=(8,), mixer_hidden=4))
    params = _random_params(rm, 0)
    ep = _episodes(1, 4, 6, SPEC)
    got = fast_call(lambda p, o, a, s, m: rm.trajectory_scores(p, StepBatchEp(o, a, s, m), 0.95),
                    params, ep.obs, ep.actions, ep.global_state, ep.mask)
    r = _np_reward(params, SPEC, rm.config, ep.obs[:, :6], ep.actions, ep.global_state[:, :6])
    want = (r * (0.95 ** np.arange(6))[None] * np.asarray(ep.mask)).sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bad_input_gets_one_line_errors():
    """Unknown sources/mixing and wrong shapes are refused with a message:
    fails if they pass silently (and init_params differs from the class's)."""
    with pytest.raises(ValueError, match="unknown reward source"):
        source_roles("demo-demo")
    assert source_roles("init-sft") == ("init", "sft")
    with pytest.raises(ValueError, match="mixing"):
        RewardModelConfig(mixing="qmix")
    with pytest.raises(ValueError, match="hidden"):
        RewardModelConfig(hidden=(0,))
    cfg = RewardModelConfig(hidden=(8,))
    rm = RewardModel(SPEC, cfg)
    # init_params(key, spec, config) is RewardModel(...).init(key) (both in one compiled program)
    params, by_function = fast_call(lambda k: (rm.init(k), init_params(k, SPEC, cfg)),
                                    jax.random.PRNGKey(3))
    chex.assert_trees_all_equal(by_function, params)
    with pytest.raises(AssertionError):
        rm.step_reward(params, jnp.zeros((2, N, O + 1)), jnp.zeros((2, N), jnp.int32),
                       jnp.zeros((2, S)))
    with pytest.raises(ValueError, match="lr"):
        rm.check_hparams(rm.default_hparams(lr=-1.0))


# ----------------------------------------------------------------------------- CLI


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    """Out-of-range counts and a directory that is no reward-model run get a
    one-line error and a non-zero exit: fails if they reach the training."""
    from jaxil.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["irl", "reward-model", "--dataset", "x.npz", "--out", str(tmp_path / "r"),
              "--updates", "0"])
    assert e.value.code == 2
    assert "must be in [1, inf)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["irl", "reward-model", "--dataset", "x", "--out", "o", "--source", "demo-sft"])
    assert "invalid choice" in capsys.readouterr().err
    assert main(["irl", "bon", "--reward", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "holds no run.json" in err and len(err.strip().splitlines()) == 1
    assert main(["irl", "reward-model", "--dataset", "x.npz", "--out", str(tmp_path / "r"),
                 "--updates", "10", "--eval-every", "4"]) == 1
    assert "multiple of --eval-every" in capsys.readouterr().err


@pytest.mark.slow  # builds a dataset, trains π_SFT and two reward models, runs best-of-N
def test_cli_reward_model_resume_reproduces_and_bon_runs(tmp_path, capsys):
    """A run stopped after one chunk and resumed with --resume ends with the
    same checkpoint and metrics as the uninterrupted run; bon reads it. Fails
    if the resumed run reinitialises the model, redraws the source rollouts,
    or replays the wrong keys."""
    import json as _json

    from jaxil.runs.checkpoint import Checkpointer
    from jaxil.cli.main import main
    from jaxil.collect import recipes

    data = tmp_path / "demos.npz"
    recipes.build("mpe-simple_spread/medium", out_path=data, counts={"medium": 6},
                  measure_episodes=0, progress=False)
    common = ["irl", "reward-model", "--dataset", str(data), "--seeds", "2", "--eval-every", "3",
              "--hidden", "16", "--sft-hidden", "16", "--sft-updates", "10", "--rollouts", "4",
              "--eval-episodes", "4", "--batch-size", "32", "--no-progress"]
    assert main(common + ["--updates", "6", "--out", str(tmp_path / "full")]) == 0
    assert main(common + ["--updates", "3", "--out", str(tmp_path / "cut")]) == 0
    assert main(common + ["--updates", "6", "--out", str(tmp_path / "cut"), "--resume"]) == 0
    rows = lambda d: (tmp_path / d / "metrics.jsonl").read_text().splitlines()  # noqa: E731
    assert rows("full") == rows("cut") and len(rows("full")) == 4
    a = Checkpointer(tmp_path / "full" / "checkpoints")
    b = Checkpointer(tmp_path / "cut" / "checkpoints")
    chex.assert_trees_all_equal(a.manager.restore(6), b.manager.restore(6))
    a.close(), b.close()
    assert main(common + ["--updates", "6", "--out", str(tmp_path / "cut"), "--resume",
                          "--source", "sft-demo"]) == 1
    assert "source" in capsys.readouterr().err
    assert main(["irl", "bon", "--reward", str(tmp_path / "full"), "--start-states", "2",
                 "--rollouts", "4"]) == 0
    doc = _json.loads((tmp_path / "full" / "bon.json").read_text())
    assert doc["ns"] == [1, 2, 4] and len(doc["per_seed"]) == 2
    assert set(doc["per_seed"][0]["rewards"]) == {"init-sft", "analytic"}


def test_reward_model_trained_on_a_source_pair_rewards_the_positives():
    """``source_data("init-demo", …)`` and 200 fused ``update_n`` steps (no
    gradient penalty): the learned reward is higher on the demonstrations
    (the positives: a_i = argmax o_i[:A]) than on π_0's rollouts (uniform
    actions). Kills, at the call sites of the loss (which
    test_loss_matches_numpy checks by value only): 'gradient ascent on the
    loss' (``p - u`` in ``RewardModel.update``), 'positive and negative
    batches swapped in update_n', and 'the sources' roles swapped in
    source_data'. (The vmapped learning test above is slow.)"""
    from helpers.data import OMAPL_SPEC, _omapl_episodes
    from jaxil.data import Dataset
    from jaxil.data.sampling import flatten_transitions
    from jaxil.algorithms.irl.sources import source_data

    rng = np.random.default_rng(0)
    demos = Dataset.from_episodes(_omapl_episodes(rng, np.ones(16)), OMAPL_SPEC, tier="expert",
                                  source="rule", seed=0, expert=True)
    init = jax.tree.map(lambda x: x[None], _omapl_episodes(rng, np.zeros(16)))  # one seed
    data = jax.tree.map(lambda x: x[0], source_data("init-demo", OMAPL_SPEC, demos,
                                                    {"init": init}))
    # A summed team reward (the lines killed are shared by every mixing): the
    # hypernetwork mixer's program compiles ~1.6x longer. Margin ~7 (> 1.0).
    rm = RewardModel(OMAPL_SPEC, RewardModelConfig(mixing="sum", hidden=(32,), batch_size=64,
                                                   grad_penalty=False))
    pos = flatten_transitions(demos)
    neg = flatten_transitions(Dataset.from_episodes(jax.tree.map(lambda x: x[0], init), OMAPL_SPEC,
                                                    tier="poor", source="init", seed=0))

    def run(key):
        state, _, _ = rm.update_n(rm.init_state(key, rm.default_hparams(lr=1e-2)), data, 200)
        def r(t):
            return rm.step_reward(state.params, t.obs, t.actions, t.global_state).mean()

        return r(pos), r(neg)

    r_pos, r_neg = map(float, fast_call(run, jax.random.PRNGKey(0)))
    assert r_pos > r_neg + 1.0, (r_pos, r_neg)
