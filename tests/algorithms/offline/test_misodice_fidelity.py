"""MisoDICE / INDD faithful to DemoDICE and the MisoDICE paper.

Each test names the mutation of the learner it kills; each was checked by
applying the mutation to a copy of the code and watching the test fail.
The data (``fidelity_dataset`` in helpers_data.py) are real trajectories
(``Dataset`` → ``flatten_transitions``) of unequal lengths, half ending
terminal, so ``done`` and ``init_obs`` carry information that a wrong mask
or a wrong s0 source loses.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import losses as L
from jaxil.algorithms.offline import DiceConfig, make_learner
from jaxil.algorithms.offline.base import check_hparams
from jaxil.algorithms.offline.dice import _Mixed
from jaxil.nn.policy import PolicyNet, encode_actions

from helpers.fast_compile import fast_call, fast_compile
from helpers.data import FIDELITY_DATA as DATA, FIDELITY_DS as DS, FIDELITY_N as N
from helpers.data import FIDELITY_SPEC as SPEC, FIDELITY_T as T


# ----------------------------------------------------------------------------- compiled once


def _fast_jit(fn):
    """``fn`` compiled at XLA level 0 (helpers.fast_compile) once per argument
    types: ``jax.jit``'s cache, without the default level's compile times."""
    compiled = {}

    def call(*args):
        key = (jax.tree.structure(args), tuple(jax.typeof(x) for x in jax.tree.leaves(args)))
        if key not in compiled:
            compiled[key] = fast_compile(fn, *args)
        return compiled[key](*args)

    return call


@functools.lru_cache(maxsize=None)
def _learner(algo, **cfg):
    """``(learner, init, sample, update)``, its functions compiled once per
    process (the learning rates and γ are traced: every test below that
    uses the same learner reuses its programs)."""
    learner = make_learner(algo, SPEC, hidden=(16,), mixer_hidden=8, batch_size=64, **cfg)
    return learner, _fast_jit(learner.init), _fast_jit(learner.sample), _fast_jit(learner.update)


# ----------------------------------------------------------------------------- s0 source


def test_dice_s0_batch_is_uniform_over_trajectories():
    """Kills 'wrong s0 source' in ``DiceLearner.sample``: the s0 batch drawn by
    ``sample_transitions`` (rows past step 0), or as the ``init_obs`` of
    uniform transitions (length-weighted, jaxil before), or left out. Every
    s0 is some trajectory's step 0, and trajectories are drawn uniformly:
    the long ones (12 steps) as often as the short ones (1–3), not ~5×
    as often. ``init_sampling="transition"`` keeps the old, length-weighted
    draw (the union batch's own ``init_obs``)."""
    learner = make_learner("misodice", SPEC, hidden=(8,), mixer_hidden=4, batch_size=2048)
    batch = fast_call(learner.sample, jax.random.PRNGKey(0), DATA)
    u, s0 = batch.union, batch.init
    s0 = jax.tree.map(np.asarray, s0)
    assert (s0.step == 0).all()
    np.testing.assert_array_equal(s0.init_obs, DS.obs[s0.traj_index, 0])
    np.testing.assert_array_equal(s0.init_global_state, DS.global_state[s0.traj_index, 0])
    long_ = DS.length == T

    def ratio(traj):  # mean draws per long trajectory / per short one
        counts = np.bincount(traj, minlength=DS.num_trajectories)
        return counts[long_].mean() / counts[~long_].mean()

    assert 0.85 < ratio(s0.traj_index) < 1.18, ratio(s0.traj_index)
    expected_old = T / DS.length[~long_].mean()
    assert ratio(np.asarray(u.traj_index)) > 0.8 * expected_old  # the union batch: length-weighted
    old = make_learner("misodice", SPEC, hidden=(8,), mixer_hidden=4, batch_size=2048,
                       init_sampling="transition")
    # (no s0 batch: the batch's structure, decided when the sampler is traced)
    assert jax.eval_shape(old.sample, jax.random.PRNGKey(0), DATA).init is None


# ----------------------------------------------------------------------------- numpy reference


@functools.lru_cache(maxsize=None)
def _raw_outputs(spec, cfg):
    """The raw network outputs the numpy reference starts from, each compiled
    once per shape (eagerly, every flax layer compiles op by op): a
    ``_Mixed`` net's local values and its mixer's ``(w, b)`` (zeros without
    a hypernetwork), the policy's log-probabilities, the action encoding."""
    net, pi = _Mixed(spec, cfg), PolicyNet(spec, cfg.hidden, cfg.shared)

    def net_out(p, x, st):
        local = net.local_values(p, x)
        if cfg.mixing == "hyper":
            w, b = net.mixer.apply(p["mixer"], st)
            return local, w, b
        return local, jnp.zeros(()), jnp.zeros(())

    return dict(net=_fast_jit(net_out), log_prob=_fast_jit(pi.log_prob),
                encode=_fast_jit(lambda a: encode_actions(spec, a)))


def _np_reference(spec, cfg, params, hp, batch, mutation=None):
    """The DICE losses of one update in float64 numpy from each network's raw
    output; ``mutation`` recomputes them as a mutated learner would."""
    e, u, s0 = batch.expert, batch.union, batch.init
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    raw = _raw_outputs(spec, cfg)
    per_agent = cfg.mixing == "none"

    def team(p, x, st):  # the discriminator and ν are two _Mixed nets of one architecture
        local, w, b = map(f64, raw["net"](p, x, st))  # local [B, N]; the mixer's w, b
        if cfg.mixing == "hyper":
            return (w * local).sum(-1) + b
        return local.sum(-1) if cfg.mixing == "sum" else local

    def x_in(b):
        return np.concatenate([b.obs, f64(raw["encode"](b.actions))], -1)

    softplus = lambda x: np.logaddexp(0.0, x)  # noqa: E731
    l_e = team(params["disc"], x_in(e), e.global_state)
    l_u = team(params["disc"], x_in(u), u.global_state)
    d_loss = np.sum(np.mean(softplus(-l_e), 0) + np.mean(softplus(l_u), 0))
    def to_reward(logit):
        if cfg.reward == "bounded":
            sig = 1 / (1 + np.exp(-logit))
            return -np.log(1 / (sig + 1e-3) - 1 + 1e-3)
        return logit

    reward = to_reward(l_u)
    if mutation == "reward_sign":
        reward = -reward
    gamma, alpha = float(hp.gamma), float(hp.alpha)
    init = u if s0 is None else s0
    if mutation == "s0_from_union":
        init = u
    init_obs, init_gs = init.init_obs, init.init_global_state
    if mutation == "s0_is_obs":
        init_obs, init_gs = u.obs, u.global_state
    def advantage(b, r):
        done = f64(b.done)
        if mutation == "no_done":
            done = np.zeros_like(done)
        if mutation == "done_inverted":
            done = 1 - done
        if per_agent:
            done = done[:, None]
        return (r + gamma * (1 - done) * team(params["nu"], b.next_obs, b.next_global_state)
                - team(params["nu"], b.obs, b.global_state))

    nu_0 = team(params["nu"], init_obs, init_gs)
    adv = advantage(u, reward)
    x = adv / (1 + alpha)
    mx = x.max(0)
    lme = mx + np.log(np.mean(np.exp(x - mx), 0))
    nu_loss = np.sum((1 - gamma) * nu_0.mean(0) + (1 + alpha) * lme)
    pb, rho = u, np.ones(x.shape[:1] + (1,) * (x.ndim - 1))
    if cfg.policy_sampling == "stratified":
        # B//2 D_E samples then D_U samples; ρ = d_U/q for q = ½ D_E + ½ D_U
        bsz = len(x)
        h = bsz // 2
        e_h, u_r = (jax.tree.map(lambda a, sl=sl: np.asarray(a)[sl], b)
                    for b, sl in ((e, slice(0, h)), (u, slice(0, bsz - h))))
        pb = jax.tree.map(lambda a, b: np.concatenate([a, b]), e_h, u_r)
        x = np.concatenate([advantage(e_h, to_reward(l_e[:h])), adv[:bsz - h]]) / (1 + alpha)
        k_all, k_e = DATA.union.reward.shape[0], float(np.sum(DATA.expert))
        flag = np.concatenate([np.ones(h), DS.expert[np.asarray(u_r.traj_index)]])
        lam = h / bsz
        rho = 1 / (lam * flag * k_all / k_e + 1 - lam)
        if mutation == "ratio_ignored":
            rho = np.ones_like(rho)
        if mutation == "ratio_inverted":
            rho = 1 / rho
        rho = rho.reshape(x.shape[:1] + (1,) * (x.ndim - 1))
        mx = x.max(0)
    w = rho * np.exp(x - mx) / np.mean(rho * np.exp(x - mx), 0)
    logp = f64(raw["log_prob"](params["policy"], pb.obs, pb.avail, pb.actions))  # [B, N]
    pi_loss = -np.mean((w * logp).sum(-1)) if per_agent else -np.mean(w * logp.sum(-1))
    out = {}
    if cfg.policy_sampling == "stratified":
        out["weight_expert_half"] = np.mean(w[:len(w) // 2].sum(0) / w.sum(0))
    ess = np.mean(w.sum(0) ** 2 / (len(w) * (w ** 2).sum(0)))
    return dict(out, disc_loss=d_loss, nu_loss=nu_loss, policy_loss=pi_loss, weight_max=w.max(),
                weight_ess=ess,
                reward_union=reward.mean())


MUTATIONS = ("reward_sign", "no_done", "done_inverted", "s0_from_union", "s0_is_obs")


@pytest.mark.parametrize("algo,cfg", [
    ("misodice", {}),
    # the other variants cost ~20 s of compile each: -m slow
    pytest.param("indd", dict(reward="bounded", nu_grad_penalty=True, policy_sampling="stratified"),
                 marks=pytest.mark.slow),
    pytest.param("misodice", dict(policy_sampling="stratified"), marks=pytest.mark.slow),
], ids=["misodice", "indd-bounded-nugp-stratified", "misodice-stratified"])
def test_dice_update_matches_numpy_reference(algo, cfg):
    """One update's discriminator, ν and policy losses and weights equal a
    float64 numpy recomputation from the networks' raw outputs, with the
    batch's own s0 batch and ``done`` mask (half the union batch terminal).

    Kills, in the learner's loss: the discriminator reward's sign flipped;
    ``done`` ignored or inverted in e = R + γ(1−done)ν(s') − ν(s); ν(s0)
    read off the union batch (length-weighted) or off its observations
    instead of the s0 batch; for ``indd-bounded-nugp-stratified`` also the raw logit in
    place of the bounded reward. The reference under each mutation is
    checked to be far (> 100× the tolerance) from the correct one. INDD
    defaults to independent per-agent networks here (``shared`` unset).

    Also INDD's penalties: the discriminator's is the within-agent
    :func:`agent_gradient_penalty` (kills 'INDD's interpolates mix agents',
    the flattened B·N form jaxil had, which gives another value), and the ν
    penalty is :func:`nu_gradient_penalty` on the learner's inputs.

    With ``policy_sampling="stratified"`` the policy batch is the first half
    of the D_E batch and then the D_U batch, its weights importance-corrected
    by ρ = d_U/q: kills the ratio left out (plain weights on the mixed
    batch), inverted, or applied to the wrong half, the D_E half's
    advantage read off the D_U batch, and the policy trained on the D_U
    batch alone."""
    learner, init, sample, update = _learner(algo, **cfg)
    config = learner.config
    hp = learner.default_hparams().replace(gamma=jnp.float32(0.5), lr_disc=jnp.float32(3e-3),
                                           lr_critic=jnp.float32(3e-3))
    state = init(jax.random.PRNGKey(0), hp)
    for i in range(15):  # away from the initialisation: rewards and values of size
        state, _ = update(state, sample(jax.random.PRNGKey(10 + i), DATA))
    batch = sample(jax.random.PRNGKey(99), DATA)
    u = batch.union.replace(done=jnp.asarray(np.random.default_rng(0).random(64) < 0.5))
    e = batch.expert.replace(done=jnp.asarray(np.random.default_rng(1).random(64) < 0.5))
    batch = batch.replace(expert=e, union=u)
    log_ratio, key = batch.log_ratio, batch.penalty_key
    _, m = update(state, batch)
    params = state.params
    want = _np_reference(SPEC, config, params, state.hparams, batch)
    tol = dict(rtol=2e-4, atol=2e-5)
    for k, v in want.items():
        np.testing.assert_allclose(float(m[k]), v, err_msg=k, **tol)
    strat = config.policy_sampling == "stratified"
    assert (log_ratio is not None) == strat
    for mut in (MUTATIONS + (("reward_logit",) if config.reward == "bounded" else ())
                + (("ratio_ignored", "ratio_inverted") if strat else ())):
        if mut == "reward_logit":
            bad = _np_reference(SPEC, DiceConfig(**dict(vars(config), reward="logit")), params,
                                state.hparams, batch)
        else:
            bad = _np_reference(SPEC, config, params, state.hparams, batch, mut)
        gap = max(abs(bad[k] - want[k]) / (tol["atol"] + tol["rtol"] * abs(want[k])) for k in want)
        assert gap > 100, (mut, gap)

    # penalties: the learner calls the right functions on the right inputs
    disc, nu = _Mixed(SPEC, config), _Mixed(SPEC, config)
    x_in = lambda b: jnp.concatenate([b.obs, encode_actions(SPEC, b.actions)], -1)  # noqa: E731
    gp_key, nu_key = jax.random.split(key) if config.nu_grad_penalty else (key, None)
    if config.mixing == "none":
        assert not config.shared and all(x.shape[0] == N for x in jax.tree.leaves(params["disc"]))

        @jax.jit
        def penalties(params, e, u):
            gp = L.agent_gradient_penalty(lambda x: disc.local_values(params["disc"], x),
                                          x_in(e), x_in(u), gp_key)
            nu_gp = L.nu_gradient_penalty(lambda x: nu.local_values(params["nu"], x), u.obs, e.obs,
                                          u.next_obs, e.next_obs, nu_key, agent_axis=True)
            return gp, nu_gp

        gp, nu_gp = penalties(params, e, u)
        np.testing.assert_allclose(float(m["grad_penalty"]), float(gp), rtol=1e-4)
        np.testing.assert_allclose(float(m["nu_grad_penalty"]), float(nu_gp), rtol=1e-4)
        assert float(nu_gp) > 0
        # nu_gp_coef reaches ν's gradient and nothing else (kills 'ν penalty left out of the loss').
        big = state.replace(hparams=state.hparams.replace(nu_gp_coef=jnp.float32(10.0)))
        off = state.replace(hparams=state.hparams.replace(nu_gp_coef=jnp.float32(0.0)))
        p_big, p_off = update(big, batch)[0].params, update(off, batch)[0].params
        same = lambda k: all(np.array_equal(a, b) for a, b in  # noqa: E731
                             zip(jax.tree.leaves(p_big[k]), jax.tree.leaves(p_off[k])))
        assert same("disc") and same("policy") and not same("nu")
    else:  # (MisoDICE's joint penalty is unchanged: tests/losses/test_losses.py)
        assert config.shared and "nu_grad_penalty" not in m


# ----------------------------------------------------------------------------- defaults


def test_indd_defaults_to_independent_networks_and_new_switches_validate():
    """INDD = independent DemoDICE learners, one parameter set per agent (the
    MisoDICE authors' independent baselines: IIPL in vietbt/OMAPL keeps one
    network per agent); MisoDICE and VDN keep shared networks with an agent
    id. ``shared`` stays a switch. The new switches and ``nu_gp_coef`` are
    validated."""
    assert make_learner("indd", SPEC).config.shared is False
    assert make_learner("indd", SPEC, shared=True).config.shared is True
    assert make_learner("misodice", SPEC).config.shared is True
    assert make_learner("misodice_vdn", SPEC).config.shared is True
    assert DiceConfig(mixing="none") == DiceConfig(mixing="none", shared=False)
    assert DiceConfig().init_sampling == "trajectory" and DiceConfig().reward == "logit"
    assert not DiceConfig().nu_grad_penalty
    with pytest.raises(ValueError, match="init_sampling"):
        DiceConfig(init_sampling="episode")
    with pytest.raises(ValueError, match="reward"):
        DiceConfig(reward="clipped")
    hp = make_learner("misodice", SPEC).default_hparams()
    assert float(hp.nu_gp_coef) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="nu_gp_coef"):
        check_hparams("misodice", hp.replace(nu_gp_coef=jnp.float32(-1.0)))


def test_policy_sampling_validates_and_keeps_old_run_identities():
    """``policy_sampling`` is validated, defaults to the paper's D_U batch,
    and enters the run identity only when it is not the default: runs made
    before the switch keep their identity (and resume), a stratified run
    cannot resume as a D_U one or the other way round. Kills the field left
    out of the identity, or always written into it."""
    from jaxil.algorithms.offline.train import config_identity

    assert DiceConfig().policy_sampling == "union"
    with pytest.raises(ValueError, match="policy_sampling"):
        DiceConfig(policy_sampling="expert")
    with pytest.raises(ValueError, match="batch_size"):
        DiceConfig(policy_sampling="stratified", batch_size=1)
    plain = config_identity(make_learner("misodice", SPEC, hidden=(8,)), SPEC)
    strat = config_identity(make_learner("misodice", SPEC, hidden=(8,),
                                         policy_sampling="stratified"), SPEC)
    assert "policy_sampling" not in plain
    assert strat.pop("policy_sampling") == "stratified" and strat == plain


# ----------------------------------------------------------------------------- direction


@pytest.mark.parametrize("algo,cfg", [
    ("misodice", {}),
    ("indd", dict(reward="bounded", nu_grad_penalty=True, policy_sampling="stratified")),
], ids=["misodice", "indd-bounded-nugp-stratified"])
def test_dice_update_descends_the_nu_loss(algo, cfg):
    """Ten updates on one fixed batch, the discriminator (whose logit is ν's
    reward) all but frozen, lower L_ν = (1−γ)E[ν(s0)] + (1+α)log E[exp(e/(1+α))]
    by a clear margin. Kills 'ν objective's sign flipped in the DICE update'
    (``total = … − nu_loss …``: the numpy reference above checks the value of
    L_ν, not the direction the update takes it; ascent raises it). Same
    learners as ``test_dice_update_matches_numpy_reference`` (the learning
    rates are traced), so the compiled update is reused."""
    learner, init, sample, update = _learner(algo, **cfg)
    hp = learner.default_hparams().replace(gamma=jnp.float32(0.5), lr_disc=jnp.float32(1e-7),
                                           lr_critic=jnp.float32(3e-3))
    state = init(jax.random.PRNGKey(0), hp)
    batch = sample(jax.random.PRNGKey(1), DATA)
    first = float(update(state, batch)[1]["nu_loss"])
    for _ in range(10):
        state, _ = update(state, batch)
    last = float(update(state, batch)[1]["nu_loss"])
    assert last < first - 0.1, (first, last)


def test_dice_policy_weights_favour_the_demonstrations():
    """INDD with a stratified policy batch (half of it from D_E), the
    discriminator trained fast and ν held still: over 50 updates the share of
    the policy weight on the D_E half rises (~0.18 -> ~0.33: the discriminator's
    reward favours the demonstrations and ω = exp(e/(1+α)) follows it); it
    falls (to ~0.09) when the weights are computed from −e. Kills 'DICE policy
    weights exp(−e/(1+α))' in INDD's per-agent weights and in the stratified
    policy batch, whose numpy-reference cases above are slow. Same learner as
    the INDD case of ``test_dice_update_descends_the_nu_loss`` (compiled once)."""
    learner, init, sample, update = _learner("indd", reward="bounded", nu_grad_penalty=True,
                                             policy_sampling="stratified")
    hp = learner.default_hparams().replace(gamma=jnp.float32(0.5), lr_disc=jnp.float32(1e-2),
                                           lr_critic=jnp.float32(1e-6))
    state = init(jax.random.PRNGKey(0), hp)
    held_out = [sample(jax.random.PRNGKey(1000 + i), DATA) for i in range(4)]

    def share(s):  # mean share of the policy weight on the D_E half
        return np.mean([float(update(s, b)[1]["weight_expert_half"]) for b in held_out])

    before = share(state)
    for i in range(50):
        state, _ = update(state, sample(jax.random.PRNGKey(10 + i), DATA))
    after = share(state)
    assert after > before + 0.08, (before, after)
