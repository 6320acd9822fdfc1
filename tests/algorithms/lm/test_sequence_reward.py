"""Sequence reward models over token episodes (:mod:`jaxil.algorithms.lm.reward`):
the loss and the episode scores against float64 numpy references, the
analytic reward ``r_c = log π_SFT(τ) − log π_0(τ)`` against a token-by-token
sum along the KV-cache step path, masks one token off giving other numbers,
and a reward model that learns to rank the scripted expert's episodes above
random play (while a negated loss drives the held-out loss up).

The episodes are ``tokens:arith`` with two operations (``CALC``, ``CALC``,
``SUBMIT``: 13 tokens for the expert), of the scripted expert and of the
uniformly random legal policy, from one compiled collector.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil import losses as L
from jaxil.algorithms.lm import reward as R
from jaxil.algorithms.lm import sft
from jaxil.envs.experts import scripted_expert
from jaxil.envs.policies import Policy, as_policy, random_policy
from jaxil.envs.tokens import EOT
from helpers.fast_compile import fast_call, fast_compile  # XLA level 0: compiling dominates

NUM_TRAIN, NUM_HELDOUT = 64, 32
CFG = R.SequenceRewardConfig(batch_episodes=8, learning_rate=1e-3)
UPDATES = 60


def _softplus(x):
    return np.logaddexp(0.0, x)


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=2)


@pytest.fixture(scope="module")
def episodes(env):
    """``(expert, random)`` TokenEpisodes, ``NUM_TRAIN + NUM_HELDOUT`` each:
    one compiled collector whose boolean ``params`` picks the scripted
    expert's token or a uniformly random legal one."""
    expert, rand = as_policy(scripted_expert(env)[0]), random_policy(env.spec)

    def act(use_expert, obs, avail, key, carry):
        a, carry = expert.act(None, obs, avail, key, carry)
        return jnp.where(use_expert, a, rand(None, obs, avail, key)), carry

    mixed = Policy(expert.init, act)
    n = NUM_TRAIN + NUM_HELDOUT
    collect = fast_compile(lambda p, k: envs.run_episodes(env, mixed, p, k, n),
                           jnp.bool_(True), jax.random.PRNGKey(0))
    ex = sft.from_episodes(env, collect(jnp.bool_(True), jax.random.PRNGKey(0)))
    rn = sft.from_episodes(env, collect(jnp.bool_(False), jax.random.PRNGKey(1)))
    return ex, rn


def _sharp(params, factor):
    """``params`` with every kernel and embedding scaled by ``factor``:
    sharper distributions than at init, so log π moves by far more than
    rounding when a mask or an alignment is wrong."""
    def scale(path, x):  # numpy parameters stay numpy (no eager op to compile)
        name = jax.tree_util.keystr(path)
        return x * np.float32(factor) if ("kernel" in name or "embed" in name) else x
    return jax.tree_util.tree_map_with_path(scale, params)


def _mixed_batch(episodes, k=6):
    """The first ``k`` expert and the first ``k`` random episodes, concatenated
    (in numpy: eager slices and concatenations compile op by op)."""
    ex, rn = episodes
    return jax.tree.map(lambda a, b: np.concatenate([np.asarray(a)[:k], np.asarray(b)[:k]]),
                        ex, rn)


@pytest.fixture(scope="module")
def sharp_params(env):
    """``seed -> _sharp(init(PRNGKey(seed)), 3)``: random sharp weights of the
    transformer that the SFT student and the reward models (of every read)
    share, from one init compiled once (XLA level 0; ``init`` jits a new
    lambda at the default level on every call, ~9 s each on 2 cores)."""
    student = sft.make_student(env, sft.SFTConfig())
    for read in R.READS:  # one architecture: the reward models' parameters are the student's
        assert R.SequenceRewardModel(env, R.SequenceRewardConfig(read=read)).net.config \
            == student.config
    init = fast_compile(student.init, jax.random.PRNGKey(0))
    return lambda seed: _sharp(jax.device_get(init(jax.random.PRNGKey(seed))), 3.0)


# -- the loss ---------------------------------------------------------------------------

@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_sequence_reward_loss_matches_float64_numpy(jit):
    """``sequence_reward_loss`` on random rewards and masks (batches of
    different sizes, NaN and inf where the mask is off) equals the float64
    reference ``mean softplus(−S_pos) + mean softplus(S_neg)`` with ``S`` the
    masked sum over steps and agents. Kills: a multiplied mask (NaN from
    the padding), swapped labels, a mean over tokens instead of the sum, a
    sum over one axis only, and scores averaged across the two batches."""
    rng = np.random.default_rng(0)
    B, B2, T, N = 5, 7, 9, 2
    r_p, r_n = 0.7 * rng.normal(size=(B, T, N)), 0.7 * rng.normal(size=(B2, T, N))
    m_p, m_n = rng.uniform(size=(B, T, N)) < 0.6, rng.uniform(size=(B2, T, N)) < 0.6
    s_p, s_n = (r_p * m_p).sum((1, 2)), (r_n * m_n).sum((1, 2))
    want = _softplus(-s_p).mean() + _softplus(s_n).mean()
    junk_p = np.where(m_p, r_p, np.nan).astype(np.float32)
    junk_n = np.where(m_n, r_n, np.inf).astype(np.float32)
    fn = jax.jit(R.sequence_reward_loss) if jit else R.sequence_reward_loss
    got = fn(junk_p, m_p, junk_n, m_n)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
    assert abs(want - (_softplus(s_p).mean() + _softplus(-s_n).mean())) > 0.1  # labels matter


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_log_ratio_score_sums_the_tokens_of_a_per_agent_mask(jit):
    """``log_ratio_score`` (the sum behind ``analytic_reward``) with a
    ``[B, T, N]`` token mask equals the float64 masked sum of the
    differences, ignoring -inf where the mask is off; a ``[B, T]`` step mask
    still counts every agent of a valid step. Kills a token mask read as a
    step mask (or broadcast over the wrong axis) and a multiplied mask."""
    rng = np.random.default_rng(1)
    B, T, N = 4, 6, 3
    a, b = rng.normal(size=(B, T, N)), rng.normal(size=(B, T, N))
    tokens = rng.uniform(size=(B, T, N)) < 0.5
    steps = rng.uniform(size=(B, T)) < 0.7
    fn = jax.jit(L.log_ratio_score) if jit else L.log_ratio_score
    a_pad = np.where(tokens, a, -np.inf).astype(np.float32)
    np.testing.assert_allclose(fn(a_pad, b.astype(np.float32), tokens),
                               np.where(tokens, a - b, 0.0).sum((1, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fn(a.astype(np.float32), b.astype(np.float32), steps),
                               np.where(steps[..., None], a - b, 0.0).sum((1, 2)),
                               rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def scores_case(env, episodes, sharp_params):
    """``(batch, {read: SequenceRewardModel(read).scores}, chunk logits)`` on
    one mixed batch and one set of sharp random weights: the three reads'
    scores and the teacher-forced logits in one compiled program."""
    models = {read: R.SequenceRewardModel(env, R.SequenceRewardConfig(read=read))
              for read in R.READS}
    params = sharp_params(3)
    batch = _mixed_batch(episodes)
    scores, logits = fast_call(
        lambda p, b: ({read: rm.scores(p, b) for read, rm in models.items()},
                      jax.vmap(models["token"].net.chunk_logits, in_axes=(None, 0))(p, b.obs)),
        params, batch)
    return batch, scores, logits


@pytest.mark.parametrize("read", R.READS)
def test_scores_sum_the_head_at_each_emitted_token(scores_case, read):
    """``SequenceRewardModel.scores`` of expert and random episodes, on
    random sharp weights, equals a numpy sum of the teacher-forced head
    output at the emitted token, ``logits[t, i, a_t]``, over the valid steps
    (``read="token"``), over the ``<eot>`` tokens only (``"turn"``) or at
    the last valid step only (``"last"``), and not the sum with the tokens
    read one step late. Kills: reading the output of the next step
    (``logits[t+1]``, the context after the token), counting padding steps,
    a turn read that counts every token, and a last read one step off."""
    batch, scores, logits = scores_case
    got = scores[read]
    logits, acts = np.asarray(logits, np.float64), np.asarray(batch.actions)
    valid = np.asarray(batch.mask)[..., None]
    reads = {"turn": valid & (acts == EOT), "token": np.broadcast_to(valid, acts.shape),
             "last": (np.arange(valid.shape[1])[None, :, None]
                      == (valid.sum(1, keepdims=True) - 1)) & valid}[read]
    picked = np.take_along_axis(logits, acts[..., None], -1)[..., 0]  # [E, T, N]
    want = np.where(reads, picked, 0.0).sum((1, 2))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
    late = np.take_along_axis(logits[:, 1:], acts[:, :-1, :, None], -1)[..., 0]
    late = np.where(reads[:, :-1], late, 0.0).sum((1, 2))
    assert np.all(np.abs(late - want) > 1e-2)
    if read == "last":
        assert (reads.sum((1, 2)) == 1).all()
    else:
        assert reads.sum() < valid.sum() if read == "turn" else reads.sum() == valid.sum()


# -- the analytic reward ------------------------------------------------------------------

def _token_by_token(policy, batch):
    """``params -> [E, T, N]`` float64 log π(a_t) along the KV-cache step path:
    ``step_log_probs`` one step at a time (a ``lax.scan`` over the steps),
    the cache carried; compiled once (XLA level 0) for every parameter set."""
    E, T, N = batch.actions.shape
    step = jax.vmap(policy.step_log_probs, in_axes=(None, 0, 0, 0))

    def path(params, obs, avail):
        carry = jax.vmap(lambda k: policy.init_carry(k, N))(
            jax.random.split(jax.random.PRNGKey(0), E))

        def one(carry, inputs):
            log_p, carry = step(params, *inputs, carry)
            return carry, log_p

        _, log_p = jax.lax.scan(one, carry, (jnp.swapaxes(obs, 0, 1), jnp.swapaxes(avail, 0, 1)))
        return jnp.swapaxes(log_p, 0, 1)  # [E, T, N, V]

    acts = np.asarray(batch.actions)
    compiled = {}

    def log_probs(params):
        if not compiled:
            compiled["path"] = fast_compile(path, params, batch.obs, batch.avail)
        log_p = np.asarray(compiled["path"](params, batch.obs, batch.avail), np.float64)
        return np.take_along_axis(log_p, acts[..., None], -1)[..., 0]

    return log_probs


@pytest.fixture(scope="module")
def analytic_case(env, episodes, sharp_params):
    """Two sharp random parameter sets of one student, a mixed batch, the
    ``analytic_reward`` of it, the per-token log-ratios along the step path
    and the agent-token mask (valid steps with more than one legal token),
    built in numpy."""
    student = sft.make_student(env, sft.SFTConfig())
    p_sft, p_0 = sharp_params(1), sharp_params(2)
    batch = _mixed_batch(episodes)
    got = np.asarray(fast_call(lambda a, b, e: R.analytic_reward(student, a, b, e),
                               p_sft, p_0, batch))
    token_by_token = _token_by_token(student, batch)
    diff = token_by_token(p_sft) - token_by_token(p_0)
    mask = np.asarray(batch.mask)[..., None] & (np.asarray(batch.avail).sum(-1) > 1)
    return got, diff, mask


def test_analytic_reward_equals_a_token_by_token_sum_on_the_kv_cache(analytic_case):
    """``analytic_reward`` (teacher-forced ``episode_scores``) equals
    ``Σ log π_SFT(a_t) − log π_0(a_t)`` accumulated token by token along the
    KV-cache step path (``step_log_probs`` fed one step at a time), over the
    valid steps with a choice, for expert and random episodes on random
    sharp weights. Kills: teacher forcing that reads another step's
    context, the two parameter sets swapped (the sign), and the sum over
    other tokens than SFT's loss mask."""
    got, diff, mask = analytic_case
    want = np.where(mask, diff, 0.0).sum((1, 2))
    assert np.abs(want).min() > 0.5  # the policies differ on every episode
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_masks_one_token_off_change_the_analytic_reward(analytic_case):
    """The token-by-token sum with the mask one token off — the last
    counted token dropped, the first one dropped, or the whole mask shifted
    one step later — differs from ``analytic_reward`` on every episode by
    far more than the tolerance of the equality test above, so that test
    would catch each of these off-by-one masks."""
    got, diff, mask = analytic_case
    E = mask.shape[0]
    flat = mask.reshape(E, -1)
    idx = np.arange(flat.shape[1])
    last = flat.shape[1] - 1 - np.argmax(flat[:, ::-1], 1)
    first = np.argmax(flat, 1)
    variants = {
        "last dropped": flat & (idx[None] != last[:, None]),
        "first dropped": flat & (idx[None] != first[:, None]),
        "one step later": np.concatenate([np.zeros((E, 1), bool), flat[:, :-1]], 1),
    }
    d = diff.reshape(E, -1)
    for name, m in variants.items():
        off = np.where(m, np.nan_to_num(d, nan=0.0, posinf=0.0, neginf=0.0), 0.0).sum(1)
        assert np.all(np.abs(off - got) > 1e-2), name


# -- learning ------------------------------------------------------------------------------

def _auc(pos, neg):
    pos, neg = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(np.mean(pos > neg) + 0.5 * np.mean(pos == neg))


def _heldout_loss(s_pos, s_neg):
    """The logistic loss of held-out scores, in float64 numpy (independent
    of the module's loss, which one test replaces)."""
    return float(_softplus(-np.asarray(s_pos, np.float64)).mean()
                 + _softplus(np.asarray(s_neg, np.float64)).mean())


def _train_and_rank(env, episodes):
    """A reward model trained ``UPDATES`` fused updates on the training
    expert (positive) and random (negative) episodes: ``(AUC of the held-out
    scores, held-out loss before, after, the last update's metrics, state)``."""
    ex, rn = episodes
    rm = R.SequenceRewardModel(env, CFG)
    data = R.RewardEpisodes.build(env, ex.take(slice(0, NUM_TRAIN)), rn.take(slice(0, NUM_TRAIN)))
    state = rm.init_state(jax.random.PRNGKey(4))
    held_ex, held_rn = ex.take(slice(NUM_TRAIN, None)), rn.take(slice(NUM_TRAIN, None))
    score = fast_compile(lambda p, a, b: (rm.scores(p, a), rm.scores(p, b)),
                         state.params, held_ex, held_rn)
    before = _heldout_loss(*score(state.params, held_ex, held_rn))
    state, metrics, _ = fast_call(lambda s, d: rm.update_n(s, d, UPDATES), state, data)
    s_p, s_n = score(state.params, held_ex, held_rn)
    return _auc(s_p, s_n), before, _heldout_loss(s_p, s_n), metrics, state


@pytest.mark.slow
def test_reward_model_ranks_held_out_expert_episodes_above_random_play(env, episodes):
    """Trained for 60 fused updates on 64 expert (positive) and 64 random
    (negative) episodes, the reward model scores held-out expert episodes
    above held-out random ones (AUC > 0.9) and its held-out logistic loss
    falls below half the initial one. Kills: a loss that does not reach
    the parameters, swapped labels (AUC near 0), sampling that draws one
    source for both batches, scores that ignore the episode's tokens."""
    auc, before, after, metrics, state = _train_and_rank(env, episodes)
    assert int(state.step) == UPDATES
    assert auc > 0.9, auc
    assert after < 0.5 * before, (before, after)
    assert float(metrics["score_positive"]) > float(metrics["score_negative"])


@pytest.mark.slow
def test_negated_reward_loss_drives_the_held_out_loss_up(env, episodes, monkeypatch):
    """The same run with :func:`sequence_reward_loss` negated (gradient
    ascent) drives the held-out logistic loss far above its initial value
    (the real run lowers it). Kills a flipped objective.
    (Its ranking need not flip: ascent saturates on the positives,
    ``∂/∂S softplus(−S) = −σ(−S) → 0`` once their scores are positive, while
    raising every token's reward lifts the longer expert episodes most.)"""
    real = R.sequence_reward_loss
    monkeypatch.setattr(R, "sequence_reward_loss", lambda *a: -real(*a))
    _, before, after, metrics, _ = _train_and_rank(env, episodes)
    assert after > before + 5.0, (before, after)
    assert float(metrics["accuracy"]) <= 0.5


def _two_runs(episodes, lo, hi):
    """RewardEpisodes stacked [2]: expert (positive) vs random episodes
    ``lo:hi``, the same for both runs."""
    ex, rn = episodes
    one = R.RewardEpisodes(positive=ex.take(slice(lo, hi)), negative=rn.take(slice(lo, hi)))
    return jax.tree.map(lambda x: jnp.stack([x, x]), one)


@pytest.mark.slow
def test_a_stopped_reward_model_run_resumes_to_the_uninterrupted_rows(env, episodes, tmp_path):
    """Two reward models (seeds 0 and 1) as one engine run, stopped after
    its first chunk and resumed, give the uninterrupted run's rows exactly;
    the held-out accuracy rises over the run and the seeds differ. Kills: a
    resume that restarts the minibatch keys or the Adam state, runs that
    share one seed, an evaluation of stale parameters."""
    import dataclasses
    cfg = dataclasses.replace(CFG, num_updates=20, eval_every=10)
    data, held = _two_runs(episodes, 0, NUM_TRAIN), _two_runs(episodes, NUM_TRAIN, None)
    args = (env, data, cfg, [0, 1], ["expert-random"] * 2, None, held)
    full = R.train_reward_model(*args)
    R.train_reward_model(*args, out_dir=tmp_path / "r", stop_after_chunks=1)
    resumed = R.train_reward_model(*args, out_dir=tmp_path / "r", resume=True)
    assert resumed.rows == full.rows
    acc = {(r["update"], r["seed"]): r["eval_accuracy"] for r in full.rows}
    assert acc[(20, 0)] > acc[(0, 0)] and acc[(0, 0)] != acc[(0, 1)]
    assert full.summary["points"][0]["source"] == "expert-random"
    with pytest.raises(ValueError, match="differ"):
        R.train_reward_model(env, data, dataclasses.replace(cfg, learning_rate=3e-3), [0, 1],
                             ["expert-random"] * 2, None, held, out_dir=tmp_path / "r",
                             resume=True)


def test_stacked_sources_are_source_major_with_each_roles_seed(episodes):
    """Entry ``j`` of the stacked data is source ``j // S`` of seed ``j % S``:
    its positives and negatives are that source's roles of that seed, and
    the labels name the sources. Kills a seed-major order (labels misaligned
    with the data), swapped roles, and seeds mixed between entries."""
    ex, _ = episodes
    S = 3
    def role(code):  # [S] stacked episodes whose actions encode (role, seed); numpy
        eps = jax.tree.map(lambda x: np.asarray(x)[:2], ex)
        return jax.tree.map(lambda x: np.stack([x] * S), eps).replace(
            actions=np.broadcast_to((code * 10 + np.arange(S))[:, None, None, None],
                                    (S,) + eps.actions.shape).astype(np.int32))
    roles = {"init": role(1), "sft": role(2), "demo": role(3)}
    data, labels = R.stacked_sources(["init-sft", "sft-demo"], roles)
    assert labels == ["init-sft"] * S + ["sft-demo"] * S
    pos = np.asarray(data.positive.actions)[:, 0, 0, 0]
    neg = np.asarray(data.negative.actions)[:, 0, 0, 0]
    np.testing.assert_array_equal(pos, [20, 21, 22, 30, 31, 32])
    np.testing.assert_array_equal(neg, [10, 11, 12, 20, 21, 22])
    with pytest.raises(ValueError, match="different numbers of seeds"):
        R.stacked_sources(["init-sft"], {"init": role(1), "sft": jax.tree.map(
            lambda x: x[:2], role(2))})


# -- errors ------------------------------------------------------------------------------------

def test_bad_settings_and_sources_raise_one_line_errors(env, episodes):
    """A reward model refuses, in one line: a non-token environment, an
    unknown read, episodes of another configuration, starting parameters of
    another architecture, and a source whose episodes are missing. Kills
    shape errors surfacing deep inside jit instead."""
    ex, rn = episodes
    with pytest.raises(ValueError, match="not a token environment.*reward model"):
        R.SequenceRewardModel(envs.make("mpe:simple_spread"))
    with pytest.raises(ValueError, match="read must be one of"):
        R.SequenceRewardConfig(read="episode")
    with pytest.raises(ValueError, match="field `obs` has shape"):
        R.RewardEpisodes.build(envs.make("tokens:arith", num_ops=3), ex, rn)
    with pytest.raises(ValueError, match="positive episodes come from"):
        R.RewardEpisodes.build(env, ex.replace(env_id="tokens:repair"), rn)
    with pytest.raises(ValueError, match="positive multiple of eval_every"):
        R.SequenceRewardConfig(num_updates=10, eval_every=4)
    with pytest.raises(ValueError, match="stacked with one entry per run"):
        R.reward_program(env, R.RewardEpisodes(ex, rn), CFG, [0], ["a"])
    rm = R.SequenceRewardModel(env, CFG)
    other = R.SequenceRewardModel(env, R.SequenceRewardConfig(size="mini"))
    with pytest.raises(ValueError, match="do not fit"):
        rm.init_state(jax.random.PRNGKey(0), jax.eval_shape(other.init, jax.random.PRNGKey(0)))
    with pytest.raises(ValueError, match=r"needs episodes of \['sft'\]"):
        R.source_episodes("init-sft", {"init": rn, "demo": ex})
    pair = R.source_episodes("sft-demo", {"sft": rn, "demo": ex})
    assert pair.positive is ex and pair.negative is rn


def test_the_reward_models_loss_scores_the_positive_batch_as_positive(env, episodes,
                                                                     sharp_params):
    """``SequenceRewardModel.loss(params, positive, negative)`` is the
    logistic loss with the POSITIVE episodes' scores as the positives,
    ``mean softplus(−S(τ⁺)) + mean softplus(S(τ⁻))`` over the model's own
    episode scores, and its metrics name the two batches the same way
    (float64 reference on random sharp weights; the reference with the
    batches swapped is checked to be far off). Kills the positive and
    negative batches (or their read masks) swapped at the call of
    sequence_reward_loss, which the loss's own numpy test cannot see and
    only the slow ranking test did."""
    rm = R.SequenceRewardModel(env, CFG)
    params = sharp_params(4)
    ex, rn = episodes
    pos = jax.tree.map(lambda a: np.asarray(a)[:4], ex)
    neg = jax.tree.map(lambda a: np.asarray(a)[:4], rn)
    (loss, metrics), s_p, s_n = fast_call(
        lambda p, a, b: (rm.loss(p, a, b), rm.scores(p, a), rm.scores(p, b)), params, pos, neg)
    s_p, s_n = np.asarray(s_p, np.float64), np.asarray(s_n, np.float64)
    want = _softplus(-s_p).mean() + _softplus(s_n).mean()
    swapped = _softplus(-s_n).mean() + _softplus(s_p).mean()
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    assert abs(swapped - want) > 1e-2 * abs(want), (want, swapped)
    np.testing.assert_allclose([float(metrics["score_positive"]), float(metrics["score_negative"])],
                               [s_p.mean(), s_n.mean()], rtol=1e-4)
