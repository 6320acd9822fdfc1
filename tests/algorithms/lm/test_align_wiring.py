"""What RL against a learned reward
([`jaxil.algorithms.lm.align`][jaxil.algorithms.lm.align]) and `jaxil lm align`
pass into their losses, in the default suite.

The maths (`shaped_returns`, `leave_one_out_advantages`,
`reinforce_loss`) has its own tests against numpy, and the runs that learn
are slow. Here one update of [`align_program`][jaxil.algorithms.lm.align.align_program]
runs for two runs at once, each with its own π_SFT, reward parameters and
KL coefficient, on fixed episodes: the rollout is replaced by a stub that
returns them, stamped with the parameters it was handed, so that the
compiled chunk is the policy's and the reference's teacher-forced scores
and one gradient step. Every number the update reports is checked against
a float64 numpy computation from the same episodes and both networks'
log-probabilities. The command line's wiring is checked with its stages
replaced by recorders (nothing compiled).
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import align as A
from jaxil.algorithms.lm import sft
from jaxil.algorithms.lm.turns import speaking
from jaxil.envs.policies import random_policy

from helpers.fast_compile import fast_call, fast_compile
from helpers.params import sharp as _sharp

ENV = envs.make("tokens:arith", num_ops=1)
M, K = 2, 3  # prompts × rollouts per prompt (M ≠ K: a transposed grouping is seen)
BETAS = (0.3, 3.0)  # the two runs' KL coefficients
W = (1.0, -2.0)  # the two runs' reward parameters
CFG = A.AlignConfig(prompts=M, rollouts_per_prompt=K, learning_rate=1e-3, num_updates=1,
                    eval_every=1, eval_episodes=M * K)
RTOL, ATOL = 1e-4, 1e-3


def token_reward(w, eps):
    """`r = w · (a mod 7 + 1) / 7` read at every speaking token: forced
    tokens are read too, so the reads differ from the loss mask."""
    r = w * ((eps.actions % 7) + 1).astype(jnp.float32) / 7.0
    reads = jax.vmap(lambda a, v: speaking(a, v, wait=eps.wait))(eps.avail, eps.mask)
    return r, reads


def _stamp(params):
    """A number that tells parameter sets apart: the sum of all their values."""
    return sum(jnp.sum(x) for x in jax.tree.leaves(params))


@pytest.fixture(scope="module")
def case():
    """Six episodes of random play, the two runs' stacked policy (`P`) and
    reference (`S`) parameters, and `log_probs(params)`: their
    teacher-forced log-probabilities of the episodes' tokens `[R, E, T, N]`."""
    eps = sft.from_episodes(ENV, fast_call(
        lambda k: envs.run_episodes(ENV, random_policy(ENV.spec), None, k, M * K),
        jax.random.PRNGKey(0)))
    eps = jax.device_get(eps)
    net = A.make_policy(ENV, CFG)
    init = fast_compile(jax.vmap(net.init), jax.random.split(jax.random.PRNGKey(1), 2))
    P = _sharp(init(jax.random.split(jax.random.PRNGKey(1), 2)))
    S = _sharp(init(jax.random.split(jax.random.PRNGKey(2), 2)))
    score = fast_compile(jax.vmap(lambda p: jax.vmap(net.episode_scores, in_axes=(None, 0, 0, 0))(
        p, eps.obs, eps.avail, eps.actions)[0]), P)
    log_probs = lambda params: np.asarray(score(params), np.float64)  # noqa: E731
    return dict(eps=eps, P=P, S=S, log_probs=log_probs)


def _reinforce(ret, choice_lp, rollout_major=False):
    """The REINFORCE loss of returns `ret [E]` with leave-one-out baselines
    over each prompt's K rollouts (or, `rollout_major`, over the wrong
    groups `{j, j + M, …}`), `choice_lp [E]` the summed log-probabilities."""
    g = ret.reshape(K, M).T if rollout_major else ret.reshape(M, K)
    adv = g - (g.sum(1, keepdims=True) - g) / (K - 1)
    return -np.mean((adv.T if rollout_major else adv).reshape(-1) * choice_lp)


def _expected(case, lp_policy=None):
    """Per run, float64: the learned score `S` and KL estimate per episode,
    the shaped return, the leave-one-out advantages and the REINFORCE
    loss (the loss also for other policy log-probabilities `lp_policy`
    with the same advantages)."""
    eps = case["eps"]
    valid, avail, acts = np.asarray(eps.mask), np.asarray(eps.avail), np.asarray(eps.actions)
    mask = valid[..., None] & (avail.sum(-1) > 1)  # the policy's choices
    only_wait = avail[..., eps.wait] & (avail.sum(-1) == 1)
    reads = valid[..., None] & ~only_wait  # every speaking token
    lp, lp0 = case["log_probs"](case["P"]), case["log_probs"](case["S"])
    out = []
    for r, (beta, w) in enumerate(zip(BETAS, W)):
        rew = w * ((acts % 7) + 1) / 7.0
        score = np.where(reads, rew, 0.0).sum((1, 2))
        kl = np.where(mask, lp[r] - lp0[r], 0.0).sum((1, 2))
        ret = score - beta * kl
        pol = lp if lp_policy is None else lp_policy
        loss = _reinforce(ret, np.where(mask, pol[r], 0.0).sum((1, 2)))
        out.append(dict(score=score, kl=kl, ret=ret, loss=loss, mask=mask, rew=rew, lp=lp[r],
                        lp0=lp0[r]))
    return out


class _FastJax:
    """`jax` for the align module, its `jit` compiled with XLA's
    optimisation level 0 (helpers.fast_compile): most of the test's time
    is compiling the update."""

    def __getattr__(self, name):
        return getattr(jax, name)

    @staticmethod
    def jit(fn):
        return lambda *args: fast_call(fn, *args)


def _program(case, monkeypatch):
    """The program of the two runs, its rollouts replaced by the fixed
    episodes (the returns stamped with the parameters the rollout got)."""
    eps = case["eps"]

    def rollout(env, policy, params, reset_keys, key, num_rollouts):
        assert reset_keys.shape[0] == M and num_rollouts == K, (reset_keys.shape, num_rollouts)
        return eps.replace(episode_return=jnp.zeros(M * K) + _stamp(params))

    def run_episodes(env, policy, params, key, num_episodes):
        assert num_episodes == CFG.eval_episodes
        return params

    monkeypatch.setattr(A, "jax", _FastJax())
    monkeypatch.setattr(A, "same_start_token_episodes", rollout)
    monkeypatch.setattr(A, "envs", types.SimpleNamespace(run_episodes=run_episodes))
    monkeypatch.setattr(A, "from_episodes", lambda env, params: eps.replace(
        episode_return=jnp.zeros(M * K) + _stamp(params)))
    return A.align_program(ENV, token_reward, jnp.asarray(W), case["S"], list(BETAS), [0, 1], CFG)


@pytest.fixture(scope="module")
def update(case):
    """The program's `start` (its `init`), the `state` it updates (the
    policy parameters `P`, not the reference's), the `new` state and the
    `metrics` of one update, and the `evaluation` of `state`."""
    with pytest.MonkeyPatch.context() as mp:
        program = _program(case, mp)
        start = program.init()
        state = start.replace(params=case["P"])
        new, metrics, _ = program.chunk(state, 0)
        evaluation = program.evaluate(state, 0)
    return dict(start=start, state=state, new=jax.device_get(new),
                metrics=jax.device_get(metrics), evaluation=jax.device_get(evaluation))


def test_each_run_starts_at_its_own_sft_params(case, update):
    """Run r's policy starts at `sft_params[r]` (π_SFT, its KL reference).
    Kills an `init` that starts from fresh parameters or from another
    run's π_SFT."""
    for r in range(2):
        for a, b in zip(jax.tree.leaves(update["start"].params), jax.tree.leaves(case["S"])):
            np.testing.assert_array_equal(np.asarray(a)[r], np.asarray(b)[r])


def test_update_scores_the_policys_rollouts_against_its_runs_reference_reward_and_beta(
        case, update):
    """One update reports, per run, the mean learned score `Σ ρ·r` under
    the run's own reward parameters, the mean KL estimate `Σ m (log π_θ −
    log π_SFT)` against the run's own π_SFT on its choice tokens, and the
    REINFORCE loss with leave-one-out advantages over each prompt's K
    rollouts of `R = S − β_r·KL`; its rollouts come from the policy's
    parameters. Kills, each alone: the rollout sampled from π_SFT instead of
    the policy; the reference scored with the policy's parameters (KL 0) or
    the two swapped (the KL's sign); another run's β, β = 0 or a dropped KL
    term; the reward's read mask and the loss mask swapped; the baseline
    over `[K, M]` (rollouts of different prompts grouped); another run's
    reward parameters."""
    m, want = update["metrics"], _expected(case)
    for r, w in enumerate(want):
        np.testing.assert_allclose(m["return"][r], float(_stamp(jax.tree.map(
            lambda x: x[r], case["P"]))), rtol=1e-6)
        np.testing.assert_allclose(m["reward"][r], w["score"].mean(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(m["kl"][r], w["kl"].mean(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(m["loss"][r], w["loss"], rtol=RTOL, atol=ATOL)
    # The checks above tell each wrong wiring apart from the right one.
    far = lambda a, b: abs(a - b) > 0.05 * abs(b)  # noqa: E731
    for r, w in enumerate(want):
        assert abs(w["kl"].mean()) > 1.0
        choice_lp = np.where(w["mask"], w["lp"], 0.0).sum((1, 2))
        for beta in (BETAS[1 - r], 0.0):
            assert far(_reinforce(w["score"] - beta * w["kl"], choice_lp), w["loss"]), beta
        assert far(_reinforce(w["ret"], choice_lp, rollout_major=True), w["loss"])
        score_on_mask = np.where(w["mask"], w["rew"], 0.0).sum((1, 2)).mean()
        assert far(score_on_mask, w["score"].mean())
        assert far(want[1 - r]["score"].mean(), w["score"].mean())


def test_update_steps_the_policy_down_its_reinforce_loss(case, update):
    """The update moves the policy (every run) and lowers the REINFORCE
    surrogate with the update's advantages held fixed (Adam's first step
    goes against the sign of the gradient). Kills a gradient that does
    not reach the policy's log-probabilities (all of them stopped, or
    taken of the reference's), and one of the wrong sign."""
    before = _expected(case)
    after = _expected(case, lp_policy=case["log_probs"](update["new"].params))
    for r in range(2):
        moved = max(float(np.max(np.abs(np.asarray(a)[r] - np.asarray(b)[r])))
                    for a, b in zip(jax.tree.leaves(update["new"].params),
                                    jax.tree.leaves(case["P"])))
        assert moved > 0.5 * CFG.learning_rate
        assert after[r]["loss"] < before[r]["loss"] - 1e-3 * abs(before[r]["loss"]), r


def test_evaluation_reports_the_policys_kl_to_its_own_sft_and_its_reward(case, update):
    """The evaluation rolls the policy out (not π_SFT) and reports, per
    episode, the learned score under the run's reward parameters and the
    KL estimate `Σ m (log π_θ − log π_SFT)` to the run's own π_SFT. Kills
    the evaluation scoring π_SFT's rollouts, a reference equal to the
    policy (KL 0) or swapped with it (the sign), another run's π_SFT or
    reward parameters."""
    ev, want = update["evaluation"], _expected(case)
    for r, w in enumerate(want):
        np.testing.assert_allclose(ev["eval_return"][r], float(_stamp(jax.tree.map(
            lambda x: x[r], case["P"]))), rtol=1e-6)
        np.testing.assert_allclose(ev["eval_kl"][r], w["kl"], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(ev["eval_reward"][r], w["score"], rtol=RTOL, atol=ATOL)
    other_kl = np.where(want[0]["mask"], want[0]["lp"] - want[1]["lp0"], 0.0).sum((1, 2))
    assert np.abs(other_kl - want[0]["kl"]).max() > 1.0


# -- the command line ------------------------------------------------------------------------

SEEDS = (3, 5)


def _cli(monkeypatch, reward, kl=("0", "0.5")):
    """`jaxil lm align` with every stage a recorder: `(calls, sft params,
    π_0 params)`; parameters are single numbers that name seed and role."""
    from jaxil.algorithms.lm import reward as R
    from jaxil.cli import lm as cli_lm
    from jaxil.cli.main import main

    sft_params = {"w": np.asarray([[100.0 + s] for s in SEEDS], np.float32)}
    student = object()
    calls = {}
    monkeypatch.setattr(cli_lm, "load_students", lambda *a, **k: (
        student, sft_params, {"seeds": list(SEEDS), "size": "tiny", "agent_ids": False}))
    monkeypatch.setattr(sft, "initial_params",
                        lambda st, s: {"w": np.asarray([float(s)], np.float32)})

    def policy_episodes(env, policy, params, key, n):
        w = np.asarray(params["w"])[:, 0]  # [S] the role's parameters, one per seed
        return sft.TokenEpisodes(obs=np.zeros((2, 1, 1, 1, 1)),
                                 avail=np.ones((2, 1, 1, 1, 2), bool),
                                 actions=np.broadcast_to(w[:, None, None, None], (2, 1, 1, 1)),
                                 mask=np.ones((2, 1, 1), bool), won=np.zeros((2, 1)),
                                 episode_return=np.zeros((2, 1)))

    def train_reward_model(env, data, cfg, seeds, labels, init_params, **kw):
        calls["reward"] = dict(data=data, seeds=list(seeds), labels=list(labels),
                               init_params=init_params)
        return types.SimpleNamespace(state=types.SimpleNamespace(
            params={"rm": np.asarray([[1000.0 + s] for s in seeds], np.float32)}))

    def train_align(env, token_reward, reward_params, sft_params_, kl_coefs, seeds, cfg, **kw):
        calls["align"] = dict(token_reward=token_reward, reward_params=reward_params,
                              sft_params=sft_params_, kl_coefs=list(kl_coefs), seeds=list(seeds))
        return types.SimpleNamespace(summary={})

    monkeypatch.setattr(R, "policy_episodes", policy_episodes)
    monkeypatch.setattr(R, "train_reward_model", train_reward_model)
    monkeypatch.setattr(R, "analytic_token_rewards", lambda policy, p, e: (policy, p, e))
    monkeypatch.setattr(A, "train_align", train_align)
    monkeypatch.setattr(A, "format_table", lambda summary: "")
    assert main(["lm", "align", "--env", "tokens:arith", "--task-knob", "num_ops=1", "--sft",
                 "students", "--reward", reward, "--kl", *kl, "--no-progress"]) == 0
    return calls, student


def _w(tree, key="w"):
    return np.asarray(tree[key])[:, 0].tolist()


def _runs(align, kls):
    """The recorded `train_align` call, after checking that its runs are
    every (KL coefficient, seed) pair once, in any order."""
    pairs = list(zip(align["kl_coefs"], align["seeds"]))
    assert sorted(pairs) == sorted((b, s) for b in kls for s in SEEDS), pairs
    return align


def test_cli_align_pairs_each_kl_coefficient_with_its_students_reference_and_reward(
        monkeypatch):
    """`--reward init-sft`: the reward model of seed s is trained from
    π_SFT's parameters of seed s, on π_SFT's episodes (positives) against
    π_0's (negatives: the seed's initial parameters); RL run j gets the
    KL coefficient, π_SFT and reward model of its own (coefficient, seed)
    pair. Kills a reward model started from scratch, the two roles'
    parameters swapped (a reward that prefers π_0), π_0 of one seed for
    all, and the runs' references, reward models or coefficients picked
    in different orders."""
    calls, _ = _cli(monkeypatch, "init-sft")
    rm = calls["reward"]
    assert _w(rm["init_params"]) == [100.0 + s for s in SEEDS]
    assert rm["seeds"] == list(SEEDS) and rm["labels"] == ["init-sft"] * 2
    np.testing.assert_array_equal(np.asarray(rm["data"].positive.actions)[:, 0, 0, 0],
                                  [100.0 + s for s in SEEDS])
    np.testing.assert_array_equal(np.asarray(rm["data"].negative.actions)[:, 0, 0, 0],
                                  [float(s) for s in SEEDS])
    al = _runs(calls["align"], (0.0, 0.5))
    assert _w(al["sft_params"]) == [100.0 + s for s in al["seeds"]]
    assert _w(al["reward_params"], "rm") == [1000.0 + s for s in al["seeds"]]


def test_cli_align_r_c_is_log_pi_sft_minus_log_pi_0_of_each_runs_seed(monkeypatch):
    """`--reward r_c`: the analytic reward of run j reads π_SFT's and
    π_0's parameters of run j's seed under their own names (`sft`,
    `init`) and scores with the students' network. Kills the two swapped
    (the reward's sign: RL towards π_0), π_0 of another seed, and the
    reward's parameters picked in another order than the references."""
    calls, student = _cli(monkeypatch, "r_c", kl=("0.1", "1"))
    al = _runs(calls["align"], (0.1, 1.0))
    assert _w(al["sft_params"]) == [100.0 + s for s in al["seeds"]]
    assert _w(al["reward_params"]["sft"]) == [100.0 + s for s in al["seeds"]]
    assert _w(al["reward_params"]["init"]) == [float(s) for s in al["seeds"]]
    policy, params, eps = al["token_reward"]("p", "e")
    assert policy is student and (params, eps) == ("p", "e")
