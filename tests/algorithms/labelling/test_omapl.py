"""O-MAPL: the implicit reward against a numpy reference, the target update,
and learning by learning (a ranking recovered from preferences alone)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.algorithms.offline import OMAPLConfig, PreferenceData, make_learner, update_n
from jaxil.algorithms.offline.omapl import _Nets
from jaxil.algorithms.labelling.label import fit_preferences, label_metrics, top_labels
from jaxil.data.preferences import pair_segments, sample_query_pairs, segment_returns

from helpers.fast_compile import fast_call
from helpers.data import OMAPL_CSPEC as CSPEC, OMAPL_N as N, OMAPL_SPEC as SPEC
from helpers.data import omapl_dataset as _dataset


@functools.lru_cache(maxsize=None)
def _init(learner):
    """``learner.init(PRNGKey(0))``, compiled once per learner (XLA level 0:
    fast_compile.py) and shared by the tests that start from it."""
    return fast_call(learner.init, jax.random.PRNGKey(0))


def _gt_prefs(ds, pairs):
    rx, ry = segment_returns(ds, pairs)
    return np.where(rx > ry, 1.0, np.where(rx < ry, 0.0, 0.5)).astype(np.float32)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_implicit_reward_matches_numpy_reference(jit):
    """r_t = Σ_i w_i(s_t)Q_i(o_i,a_i) + b(s_t) − γ(1−d_t)(Σ_i
    w̄_i(s_{t+1})V̄_i(o_{t+1}) + b̄(s_{t+1})), zero on padding; recomputed in
    float64 from each network's raw output."""
    ds = _dataset(1, 4, 4)
    cfg = OMAPLConfig(hidden=(16,), mixer_hidden=8, batch_size=4)
    learner = make_learner("omapl", SPEC, hidden=(16,), mixer_hidden=8, batch_size=4)
    state = _init(learner)
    # make the targets differ from the online nets
    params = dict(state.params, target=jax.tree.map(lambda x: x * 1.3 + 0.01, state.params["target"]))
    pairs = sample_query_pairs(ds, 6, None, seed=0)
    seg, _ = pair_segments(ds, pairs)
    nets = _Nets(SPEC, cfg)
    fn = jax.jit(nets.implicit_rewards) if jit else nets.implicit_rewards
    got = np.asarray(fn(params, 0.9, jax.tree.map(jnp.asarray, seg)))

    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    qs = f64(nets.q.apply(params["q"], seg.obs[:, :-1]))
    q = np.take_along_axis(qs, seg.actions[..., None], -1)[..., 0]
    w, b = map(f64, nets.mixer.apply(params["mixer"], seg.global_state[:, :-1]))
    tg = params["target"]
    v = f64(nets.v.apply(tg["v"], seg.obs[:, 1:]))[..., 0]
    wn, bn = map(f64, nets.mixer.apply(tg["mixer"], seg.global_state[:, 1:]))
    assert (w >= 0).all() and (wn >= 0).all()
    want = ((w * q).sum(-1) + b - 0.9 * (1 - seg.done) * ((wn * v).sum(-1) + bn)) * seg.mask
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.all(got[~seg.mask] == 0)


def test_update_trains_online_nets_and_soft_updates_targets():
    ds = _dataset(2, 6, 10)
    pairs = sample_query_pairs(ds, 20, 4, seed=1)
    data = PreferenceData.from_pairs(ds, pairs, _gt_prefs(ds, pairs))
    learner = make_learner("omapl", SPEC, hidden=(16,), mixer_hidden=8, batch_size=4)
    s0 = _init(learner)
    s0 = s0.replace(hparams=s0.hparams.replace(tau=jnp.float32(0.25)))
    s1, m = fast_call(lambda s, d: update_n(learner, s, d, 1), s0, data)
    assert all(np.isfinite(float(v)) for v in m.values())
    for k in ("q", "mixer", "v"):
        old_t, new_on, new_t = (jax.tree.leaves(x) for x in
                                (s0.params["target"][k], s1.params[k], s1.params["target"][k]))
        for a, b, c in zip(old_t, new_on, new_t):
            np.testing.assert_allclose(np.asarray(c), 0.75 * np.asarray(a) + 0.25 * np.asarray(b),
                                       rtol=1e-5, atol=1e-7)
    for k in ("q", "mixer", "v", "policy"):
        assert any(not np.array_equal(a, b) for a, b in
                   zip(jax.tree.leaves(s0.params[k]), jax.tree.leaves(s1.params[k]))), k


def _update_case(edit=lambda batch: batch):
    """One O-MAPL update on a small preference batch (changed by `edit`
    first) whose target networks differ from the online ones (targets =
    1.5·online + 0.1) and β = 0.5, so z spans the clip range: `(learner,
    target, state, batch, metrics)`. The call-site tests below share it,
    and its compiled update."""
    ds = _dataset(2, 6, 10)
    pairs = sample_query_pairs(ds, 20, 4, seed=1)
    data = PreferenceData.from_pairs(ds, pairs, _gt_prefs(ds, pairs))
    learner = make_learner("omapl", SPEC, hidden=(16,), mixer_hidden=8, batch_size=4)
    s0 = _init(learner)
    target = jax.tree.map(lambda x: x * 1.5 + 0.1, s0.params["target"])
    state = s0.replace(params=dict(s0.params, target=target),
                       hparams=s0.hparams.replace(beta=jnp.float32(0.5)))
    batch = edit(learner.sample(jax.random.PRNGKey(3), data))
    _, m = fast_call(learner.update, state, batch)
    return learner, target, state, batch, m


def test_value_step_uses_target_q_and_target_mixer():
    """Kills 'online Q and mixer instead of the targets in O-MAPL's value
    step' (either one): with targets ≠ online networks, the update's value
    loss and largest actor weight equal a float64 recomputation from the
    TARGET Q̄_i and TARGET mixer weights w̄_i and the online V_i (the O-MAPL
    code's ``q_target_values``, ``w_target``), the authors' clip
    (z clipped inside exp only), every valid step of both sides; the
    recomputation with the online Q or the online mixer is far from it.
    β = 0.5 (not 10), so that z spans the clip range instead of staying near 0."""
    learner, target, state, batch, m = _update_case()

    nets = _Nets(SPEC, learner.config)
    x, y, _ = batch
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b], 0), x, y)
    obs, st = both.obs[:, :-1], both.global_state[:, :-1]
    mask = np.asarray(both.mask, bool)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731

    def reference(q_params, mixer_params, clip=10.0, beta=0.5):
        q = np.take_along_axis(f64(nets.q.apply(q_params, obs)), np.asarray(both.actions)[..., None],
                               -1)[..., 0]
        w = f64(nets.mixer.apply(mixer_params, st)[0])
        v = f64(nets.v.apply(state.params["v"], obs))[..., 0]
        z_raw = w * (q - v) / beta
        z = np.clip(z_raw, -clip, clip)
        loss = np.mean(np.exp(z) - z_raw - 1, -1)[mask].mean()
        return loss, np.exp(z)[mask].max()

    want = reference(target["q"], target["mixer"])
    np.testing.assert_allclose([float(m["value_loss"]), float(m["weight_max"])], want, rtol=1e-4)
    for bad in (reference(state.params["q"], target["mixer"]),
                reference(target["q"], state.params["mixer"])):
        assert abs(bad[0] - want[0]) > 1e-2 * abs(want[0]), (bad, want)


def test_preference_data_drops_unanswered_and_rejects_bad_labels():
    ds = _dataset(3, 4, 6)
    pairs = sample_query_pairs(ds, 10, None, seed=0)
    prefs = _gt_prefs(ds, pairs)
    prefs[[1, 4]] = np.nan
    data = PreferenceData.from_pairs(ds, pairs, prefs)
    assert data.num_pairs == 8
    np.testing.assert_array_equal(np.asarray(data.x.traj_index),
                                  np.delete(pairs.traj_x, [1, 4]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        PreferenceData.from_pairs(ds, pairs, np.full(10, 2.0, np.float32))
    with pytest.raises(ValueError, match="none of the queries"):
        PreferenceData.from_pairs(ds, pairs, np.full(10, np.nan, np.float32))
    with pytest.raises(ValueError, match="one per query"):
        PreferenceData.from_pairs(ds, pairs, prefs[:-1])


@pytest.mark.slow  # default-suite time (about 27 s; the O-MAPL update, target and numpy-reference tests stay); run with -m slow
def test_omapl_recovers_the_ranking_from_preferences():
    """From 400 noiseless whole-trajectory preferences, the learned returns
    rank the trajectories (Spearman > 0.8) and their top 30 are mostly the
    30 best by true return (precision ≥ 0.6; chance is 0.25; the returns
    around the cut are close, so exact recovery is not expected). Episode
    lengths vary, so the true top 30 is not the set of skilled trajectories."""
    ds = _dataset(0)
    pairs = sample_query_pairs(ds, 400, None, seed=0)
    fit = fit_preferences(ds, pairs, _gt_prefs(ds, pairs), seeds=2, updates=400, chunk=200,
                          hidden=(32, 32), mixer_hidden=16, batch_size=16, progress=False,
                          hparams=dict(lr_q=1e-3))
    assert fit.scores.shape == (2, ds.num_trajectories)
    assert fit.history[-1]["pair_accuracy"] > 0.8
    best = top_labels(ds.episode_return, top_k=30)
    for s in fit.scores:
        m = label_metrics(top_labels(s, top_k=30), best, s, ds.episode_return)
        assert m["spearman"] > 0.8, m
        assert m["precision"] >= 0.6, m
        assert m["auc"] > 0.9, m


@pytest.mark.slow  # default-suite time (~11 s of compile); run with -m slow
def test_omapl_continuous_actions_update():
    ds = _dataset(4, 6, 10, spec=CSPEC)
    pairs = sample_query_pairs(ds, 16, None, seed=0)
    data = PreferenceData.from_pairs(ds, pairs, _gt_prefs(ds, pairs))
    learner = make_learner("omapl", CSPEC, hidden=(16,), batch_size=4)
    s, m = fast_call(lambda s, d: update_n(learner, s, d, 5), _init(learner), data)
    assert all(np.isfinite(float(v)) for v in m.values())
    a = learner.act(s.params, ds.obs[0, 0], ds.avail_actions[0, 0], jax.random.PRNGKey(1))
    assert a.shape == (N, 2) and np.all(np.abs(np.asarray(a)) <= 1)


def test_preference_loss_scores_the_first_segment_against_the_second_with_its_label():
    """The update's preference loss and pair accuracy equal a float64
    recomputation from the implicit rewards of the same batch: Bradley–Terry on
    R_x − R_y with P(x ≻ y) = label, plus ½·mean r² over the valid steps of
    both sides. Kills, at O-MAPL's call site of preference_loss: the two
    segments swapped (R_y − R_x) and the label inverted; each mutated reference
    is checked to be far off. (These segments have no padding, so the penalty's
    step mask is checked by the loss's own tests only.) Same state and batch as
    the value-step test above (its compiled update is reused through the
    compilation cache)."""
    learner, target, state, batch, m = _update_case()

    x, y, label = batch
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b], 0), x, y)
    nets = _Nets(SPEC, learner.config)
    r = np.asarray(nets.implicit_rewards(state.params, state.hparams.gamma, both), np.float64)
    mask = np.asarray(both.mask, bool)
    label = np.asarray(label, np.float64)
    b = label.shape[0]
    softplus = lambda z: np.logaddexp(0.0, z)  # noqa: E731

    def reference(logit, lab, valid):
        bce = lab * softplus(-logit) + (1 - lab) * softplus(logit)
        return bce.mean() + float(state.hparams.reg_coef) * np.mean(r[valid] ** 2)

    logit = r[:b].sum(-1) - r[b:].sum(-1)
    want = reference(logit, label, mask)
    np.testing.assert_allclose(float(m["preference_loss"]), want, rtol=1e-4)
    hard = label != 0.5
    np.testing.assert_allclose(float(m["pair_accuracy"]),
                               np.mean((logit[hard] > 0) == (label[hard] > 0.5)), rtol=1e-6)
    assert hard.any()
    for bad in (reference(-logit, label, mask), reference(logit, 1 - label, mask)):
        assert abs(bad - want) > 1e-3 * abs(want) + 1e-4, (bad, want)


def test_actor_loss_is_the_weighted_likelihood_under_the_legal_masks():
    """The update's actor loss equals −Σ_b m_b Σ_i ω_bi log π_i(a_bi | o_bi)
    / Σ_b m_b over every valid step of both segments, with ω the Gumbel
    weights of the TARGET Q and mixer and log π the policy's masked
    log-probability under each step's legal actions (here about a third of
    the actions are made unavailable, never the recorded one; the other
    O-MAPL data are all legal). Kills the actor's log-probabilities scored
    without the segments' ``avail`` (another softmax) or with the masks
    read one step late (``avail[:, 1:]``); both references are checked to
    be far off. (These segments have no padding: the step mask is checked
    by agent_weighted_bc_loss's own test only.) Same state and batch shapes
    as the value-step test (its compiled update is reused)."""
    from jaxil.losses import gumbel_weights

    rng = np.random.default_rng(7)

    def masked(seg):
        avail = rng.random(seg.avail.shape) < 0.6
        acts = np.asarray(seg.actions)
        np.put_along_axis(avail[:, :-1], acts[..., None], True, -1)
        return seg.replace(avail=jnp.asarray(avail & np.asarray(seg.avail)))

    learner, target, state, batch, m = _update_case(
        lambda b: (masked(b[0]), masked(b[1]), b[2]))

    nets = _Nets(SPEC, learner.config)
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b], 0), batch[0], batch[1])
    obs, st = both.obs[:, :-1], both.global_state[:, :-1]
    q = np.take_along_axis(np.asarray(nets.q.apply(target["q"], obs)),
                           np.asarray(both.actions)[..., None], -1)[..., 0]
    w = np.asarray(nets.mixer.apply(target["mixer"], st)[0])
    v = np.asarray(nets.v.apply(state.params["v"], obs))[..., 0]
    flat = lambda a: a.reshape(-1, N)  # noqa: E731
    omega = np.asarray(gumbel_weights(flat(q), flat(v), flat(w), 0.5, learner.config.value_clip),
                       np.float64).reshape(q.shape)
    policy = learner.policy(False)
    mask = np.asarray(both.mask, bool)

    def reference(avail):
        logp = np.asarray(policy.log_prob(state.params, obs, avail, both.actions), np.float64)
        return -(omega * logp).sum(-1)[mask].sum() / mask.sum()

    want = reference(both.avail[:, :-1])
    np.testing.assert_allclose(float(m["actor_loss"]), want, rtol=1e-4)
    for bad in (reference(jnp.ones_like(both.avail[:, :-1])), reference(both.avail[:, 1:])):
        assert abs(bad - want) > 1e-2 * abs(want), (bad, want)
