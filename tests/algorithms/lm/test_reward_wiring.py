"""What a sequence reward model
([`jaxil.algorithms.lm.reward`][jaxil.algorithms.lm.reward]) passes into its
loss and hands to RL and best-of-N, in the default suite.

The loss, the scores and the analytic reward have their own tests against
numpy, and the runs that learn are slow. Here: the per-token form RL reads
([`token_rewards_of`][jaxil.algorithms.lm.reward.token_rewards_of]) on
`tokens:arith` episodes of random play; one update of the model (which
batch is the positive one, and that it descends the loss); and, with the
update and the loss replaced by recorders (nothing of the transformer
compiled), what `update_n` and
[`reward_program`][jaxil.algorithms.lm.reward.reward_program] feed them:
which source, which run's data, how many updates, which parameters.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import reward as R
from jaxil.algorithms.lm import sft
from jaxil.envs.policies import random_policy

from helpers.fast_compile import fast_call
from helpers.params import sharp as _sharp

ENV = envs.make("tokens:arith", num_ops=1)
CFG = R.SequenceRewardConfig(read="turn", batch_episodes=3, learning_rate=1e-4,
                             num_updates=4, eval_every=2)


@pytest.fixture(scope="module")
def case():
    """`(model, sharp random parameters, 8 episodes of random play)`."""
    rm = R.SequenceRewardModel(ENV, CFG)
    params = _sharp(fast_call(rm.init, jax.random.PRNGKey(0)))
    eps = jax.device_get(sft.from_episodes(ENV, fast_call(
        lambda k: envs.run_episodes(ENV, random_policy(ENV.spec), None, k, 8),
        jax.random.PRNGKey(1))))
    return rm, params, eps


def test_token_rewards_of_gives_rl_the_models_own_reads(case):
    """RL's per-token reward reads the model's own read mask (here one read
    per turn, at its `<eot>`) and sums to the model's episode scores.
    Kills `token_rewards_of` handing RL another mask (every valid token,
    the loss mask of the policy's choices) or rewards read at other
    tokens than the scores'."""
    rm, params, eps = case
    (r, reads), scores = fast_call(lambda p, e: (R.token_rewards_of(rm)(p, e), rm.scores(p, e)),
                                   params, eps)
    want = np.asarray(eps.mask)[..., None] & (np.asarray(eps.actions) == eps.eot)
    np.testing.assert_array_equal(np.asarray(reads), want)
    assert 0 < want.sum() < np.asarray(eps.mask).sum()  # a turn read is not every token
    np.testing.assert_allclose(np.where(want, np.asarray(r), 0.0).sum((1, 2)), np.asarray(scores),
                               rtol=1e-5, atol=1e-4)


def test_an_update_descends_the_loss_with_the_positive_batch_as_positive(case):
    """`update(state, positive, negative)` reports the loss and the mean
    scores of `loss(params, positive, negative)` (the positive batch's
    mean score as `score_positive`) and lowers that loss. Kills the two
    batches swapped at the gradient (training the model to prefer the
    negatives, which only the slow ranking test saw), and a step that does
    not descend the loss."""
    rm, params, eps = case
    pos, neg = eps.take(slice(0, 4)), eps.take(slice(4, 8))
    state = rm.init_state(jax.random.PRNGKey(2), params=params)

    def step(s, p, n):
        new, metrics = rm.update(s, p, n)
        return new.step, metrics, rm.loss(s.params, p, n), rm.loss(new.params, p, n)[0]

    steps, metrics, (before, m_before), after = jax.device_get(fast_call(step, state, pos, neg))
    assert int(steps) == 1
    for k in ("loss", "score_positive", "score_negative"):
        np.testing.assert_allclose(metrics[k], m_before[k], rtol=1e-5, atol=1e-5)
    assert abs(m_before["score_positive"] - m_before["score_negative"]) > 0.1
    assert after < before - 1e-3 * abs(before), (before, after)


def _coded(code, e=5):
    """`e` tiny episodes whose every token is `code` (names the source)."""
    return sft.TokenEpisodes(obs=np.zeros((e, 2, 1, 1), np.float32),
                             avail=np.ones((e, 2, 1, 3), bool),
                             actions=np.full((e, 2, 1), code, np.int32),
                             mask=np.ones((e, 2), bool), won=np.zeros(e, np.float32),
                             episode_return=np.zeros(e, np.float32))


def _recording_update(self, state, positive, negative):
    """An update that records the sources it got: `loss` = mean positive
    token + 1000 · mean negative token, `accuracy` = its batch size."""
    metrics = dict(loss=jnp.mean(positive.actions) + 1000.0 * jnp.mean(negative.actions),
                   accuracy=jnp.float32(positive.actions.shape[0]))
    return state.replace(step=state.step + 1), metrics


def test_update_n_samples_each_batch_from_its_own_source(case, monkeypatch):
    """`update_n(state, data, k)` runs k updates, each on a positive batch
    of `batch_episodes` drawn from `data.positive` and a negative batch
    from `data.negative`, in that order. Kills `sample` drawing both
    batches from one source or returning them swapped, `update_n` passing
    them swapped, and a wrong number of updates."""
    rm = case[0]
    monkeypatch.setattr(rm, "update", lambda *a: _recording_update(rm, *a))
    data = jax.tree.map(jnp.asarray, R.RewardEpisodes(positive=_coded(1), negative=_coded(2, e=7)))
    state = R.SequenceRewardState(params=jnp.zeros(1), opt_state=(), step=jnp.int32(0),
                                  key=jax.random.PRNGKey(0))
    new, metrics, _ = rm.update_n(state, data, 3)
    assert int(new.step) == 3
    assert float(metrics["loss"]) == 1.0 + 2000.0
    assert int(metrics["accuracy"]) == CFG.batch_episodes


def test_reward_program_routes_each_runs_data_held_out_episodes_and_start(monkeypatch):
    """Run r of `reward_program` starts from `init_params[r]` (π_SFT's, as
    AfD starts its reward model), a chunk trains it `eval_every` updates
    on its own source's positives and negatives, and the evaluation scores
    its own held-out positives and negatives, in that order, with the
    run's current parameters. Kills a program that ignores `init_params`,
    trains on the held-out episodes (or evaluates on the training ones),
    swaps the two sources or the runs, or runs another number of
    updates."""
    monkeypatch.setattr(R.SequenceRewardModel, "update", _recording_update)

    def loss(self, params, positive, negative):
        first = jax.tree.leaves(params)[0]
        value = (jnp.mean(positive.actions) + 1000.0 * jnp.mean(negative.actions)
                 + 1e6 * jnp.mean(first))
        return value, dict(loss=value, accuracy=jnp.float32(0.0))

    monkeypatch.setattr(R.SequenceRewardModel, "loss", loss)
    rm = R.SequenceRewardModel(ENV, CFG)
    shapes = jax.eval_shape(rm.init, jax.random.PRNGKey(0))
    init_params = jax.tree.map(lambda s: np.stack([np.full(s.shape, v, s.dtype)
                                                   for v in (1.0, 2.0)]), shapes)
    stack = lambda *xs: jax.tree.map(lambda *a: np.stack(a), *xs)  # noqa: E731
    data = stack(R.RewardEpisodes(_coded(1), _coded(2)), R.RewardEpisodes(_coded(11), _coded(12)))
    held = stack(R.RewardEpisodes(_coded(3), _coded(4)), R.RewardEpisodes(_coded(13), _coded(14)))
    program = R.reward_program(ENV, data, CFG, [0, 1], ["a", "b"], init_params, held)
    state = program.init()
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(init_params)):
        np.testing.assert_array_equal(np.asarray(a), b)
    state, metrics, _ = program.chunk(state, 0)
    np.testing.assert_array_equal(np.asarray(state.step), [CFG.eval_every] * 2)
    np.testing.assert_allclose(np.asarray(metrics["loss"]), [1.0 + 2000.0, 11.0 + 12000.0])
    ev = program.evaluate(state.replace(params=jax.tree.map(lambda x: 3.0 * x, state.params)), 1)
    np.testing.assert_allclose(np.asarray(ev["eval_loss"]),
                               [3.0 + 4000.0 + 3e6, 13.0 + 14000.0 + 6e6])
