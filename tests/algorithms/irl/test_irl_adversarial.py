"""GAIL, AIRL and PPO against a learned reward.

The losses are checked against float64 numpy references on random inputs,
with and without jit; the reward hook of the PPO teacher trainer on the tiny
environments of tests/helpers/teachers.py; the GAIL driver's kill-and-resume
against an uninterrupted run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.losses import discriminator_loss
from jaxil.losses.adversarial import (
    agent_discriminator_loss,
    airl_logits,
    airl_shaped_reward,
    discriminator_accuracy,
    gail_reward,
    kl_penalized_reward,
)

from helpers.fast_compile import fast_call

RNG = np.random.default_rng(7)
jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


@pytest.fixture(autouse=True)
def _reseed():
    global RNG
    RNG = np.random.default_rng(7)


def _f32(*shape, scale=1.0):
    return (scale * RNG.normal(size=shape)).astype(np.float32)


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _np_softplus(x):
    return np.logaddexp(0.0, np.asarray(x, np.float64))


TOL = dict(rtol=2e-5, atol=2e-6)


# --------------------------------------------------------------------------
# Losses against numpy
# --------------------------------------------------------------------------
@jit_param
@pytest.mark.parametrize("form", ["softplus", "logit", "log_d"])
def test_gail_reward_forms_match_numpy(jit, form):
    """Each GAIL reward form equals its definition in D = σ(ℓ): −log(1−D),
    log D − log(1−D), log D. A flipped sign (rewarding the policy for looking
    like the policy) or the forms swapped fails; large |ℓ| stay finite."""
    logits = np.concatenate([_f32(64, scale=3.0), np.float32([-80.0, 80.0])])
    out = np.asarray(_maybe_jit(gail_reward, jit, static_argnums=1)(logits, form))
    x = logits.astype(np.float64)
    ref = {"softplus": _np_softplus(x),  # = -log(1 - D), stably
           "logit": x,
           "log_d": -_np_softplus(-x)}[form]
    np.testing.assert_allclose(out, ref, **TOL)
    mid = np.abs(x) < 10
    d = 1.0 / (1.0 + np.exp(-x[mid]))
    direct = {"softplus": -np.log1p(-d), "logit": np.log(d) - np.log1p(-d), "log_d": np.log(d)}[form]
    np.testing.assert_allclose(out[mid], direct, rtol=1e-4, atol=1e-5)
    assert np.isfinite(out).all()
    # Monotone increasing in the logit: more expert-like, more reward.
    order = np.argsort(x)
    assert (np.diff(out[order]) >= 0).all()


def test_gail_reward_unknown_form_is_named():
    with pytest.raises(ValueError, match="unknown GAIL reward form 'bogus'.*softplus"):
        gail_reward(jnp.zeros(3), "bogus")


@jit_param
@pytest.mark.parametrize("shape", [(32,), (16, 3)])
def test_airl_shaped_reward_and_logits_match_numpy(jit, shape):
    """f = g + γ(1−last)h' − h and ℓ = f − log π against numpy, team [B] and
    per agent [B, N]. Fails for: the shaping sign reversed (h − γh'), the
    terminal mask ignored (bootstrapping h' across an episode end), γ on h
    instead of h', or + log π."""
    g, h, hn, lp = (_f32(*shape) for _ in range(4))
    last = RNG.random(shape) < 0.3
    gamma = 0.93
    f = np.asarray(_maybe_jit(airl_shaped_reward, jit)(g, h, hn, last, gamma))
    lo = np.asarray(_maybe_jit(airl_logits, jit)(g, h, hn, last, lp, gamma))
    g64, h64, hn64, lp64 = (np.asarray(x, np.float64) for x in (g, h, hn, lp))
    ref_f = g64 + gamma * (1.0 - last) * hn64 - h64
    np.testing.assert_allclose(f, ref_f, **TOL)
    np.testing.assert_allclose(lo, ref_f - lp64, **TOL)
    # D = exp f / (exp f + π): the logistic of the logit.
    d = np.exp(ref_f) / (np.exp(ref_f) + np.exp(lp64))
    np.testing.assert_allclose(1 / (1 + np.exp(-lo)), d, rtol=1e-4, atol=1e-6)


def test_airl_logits_do_not_differentiate_the_policy_and_check_shapes():
    """The discriminator step treats log π as data: its gradient w.r.t.
    log π is zero (a missing stop-gradient would let the discriminator loss
    move the policy), w.r.t. g it is the logistic loss's. Mismatched shapes
    are refused."""
    g, h, hn, lp = (_f32(8) for _ in range(4))
    last = np.zeros(8, bool)

    def loss(g, lp):
        return discriminator_loss(airl_logits(g, h, hn, last, lp, 0.9), jnp.zeros(4))

    dg, dlp = fast_call(jax.grad(loss, argnums=(0, 1)), g, lp)  # one compile, not op by op
    assert np.all(np.asarray(dlp) == 0.0)
    f = g + 0.9 * hn - h - lp
    np.testing.assert_allclose(np.asarray(dg), -(1 - 1 / (1 + np.exp(-f))) / 8, rtol=1e-4, atol=1e-6)
    with pytest.raises(AssertionError):
        airl_logits(g, h, hn[:4], last, lp, 0.9)
    with pytest.raises(AssertionError):
        airl_logits(g, h, hn, last, lp[:4], 0.9)


@jit_param
def test_agent_discriminator_loss_matches_numpy(jit):
    """Σ_i of each agent's logistic loss with expert = 1, policy = 0, over
    batches of different sizes. Swapped labels, a mean instead of a sum over
    agents, or mixing agents' columns fails."""
    e, p = _f32(12, 3, scale=2.0), _f32(20, 3, scale=2.0)
    out = float(_maybe_jit(agent_discriminator_loss, jit)(e, p))
    ref = sum(_np_softplus(-e[:, i]).mean() + _np_softplus(p[:, i]).mean() for i in range(3))
    np.testing.assert_allclose(out, ref, **TOL)
    # Agent i's loss depends on column i only (the gradient compiled once, not op by op).
    g = np.asarray(fast_call(jax.grad(agent_discriminator_loss), e, p))
    e64 = e.astype(np.float64)
    np.testing.assert_allclose(g, -(1 - 1 / (1 + np.exp(-e64))) / 12, rtol=1e-4, atol=1e-6)
    with pytest.raises(AssertionError):
        agent_discriminator_loss(e, p[:, :2])
    with pytest.raises(AssertionError):
        agent_discriminator_loss(e[:, 0], p[:, 0])


def test_discriminator_accuracy():
    """Half expert-correct, all policy-correct -> 0.75 (a flipped comparison
    on either source fails)."""
    acc = discriminator_accuracy(jnp.array([1.0, -1.0, 2.0, -3.0]), jnp.array([-1.0, -0.5]))
    assert float(acc) == pytest.approx(0.75)


@jit_param
@pytest.mark.parametrize("per_agent", [False, True], ids=["team", "agents"])
def test_kl_penalized_reward_matches_numpy(jit, per_agent):
    """r − β(log π − log π_ref): for a team reward the log-ratio is summed over
    agents (the joint policy), for per-agent rewards each agent gets its own.
    Fails for: the ratio the wrong way round (rewarding divergence), a mean
    over agents, the coefficient dropped."""
    T, E, N = 5, 4, 3
    lp, ref = _f32(T, E, N), _f32(T, E, N)
    r = _f32(T, E, N) if per_agent else _f32(T, E)
    out = np.asarray(_maybe_jit(kl_penalized_reward, jit)(r, lp, ref, 0.3))
    ratio = lp.astype(np.float64) - ref
    expect = r - 0.3 * (ratio if per_agent else ratio.sum(-1))
    np.testing.assert_allclose(out, expect, **TOL)
    with pytest.raises(AssertionError):
        kl_penalized_reward(r[:2], lp, ref, 0.3)


def test_kl_penalty_estimates_the_kl_in_expectation():
    """E_{a~π}[log π(a) − log π_ref(a)] is KL(π‖π_ref): the mean penalty over
    many draws of a categorical approaches the exact KL (the estimator's sign
    or the ratio's orientation wrong fails)."""
    p = np.array([0.6, 0.3, 0.1])
    q = np.array([0.2, 0.5, 0.3])
    a = RNG.choice(3, size=200_000, p=p)
    lp = np.log(p)[a].astype(np.float32)[:, None]
    lq = np.log(q)[a].astype(np.float32)[:, None]
    pen = -np.asarray(kl_penalized_reward(jnp.zeros(a.shape[0]), lp, lq, 1.0))
    kl = float(np.sum(p * np.log(p / q)))
    assert abs(pen.mean() - kl) < 0.01


# --------------------------------------------------------------------------
# The reward hook of the teacher trainer
# --------------------------------------------------------------------------
from jaxil import envs  # noqa: E402
from helpers import teachers as tt  # noqa: E402  (registers the toy environments)
from helpers.fast_compile import FAST_COMPILE  # noqa: E402
from jaxil.teachers import make_train  # noqa: E402
from jaxil.algorithms.rl.ppo import RewardHook  # noqa: E402


@pytest.mark.slow  # ~30 s of compilation on a shared 2-core CPU
def test_reward_hook_replaces_the_environment_reward():
    """Two seeds in one vmapped program, one trained on +r_env and one on
    −r_env through the hook (the sign is the hook's state): the first learns
    to pick the target, the second to avoid it, while `return_mean` keeps
    reporting the TRUE return and `learned_reward` the hook's. Fails if the
    hook's reward is ignored (both learn alike), if its state is not carried
    per seed, or if the true return is replaced by the learned one."""
    cfg = tt.TINY.replace(total_timesteps=12 * 2 * 16 * 8, lr=1e-2)
    hook = RewardHook(reward=lambda sign, actor_params, b: sign * b.env_reward)
    train = make_train(envs.make("toy:masked"), cfg, hook)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    signs = jnp.array([1.0, -1.0])
    runner, m = jax.jit(jax.vmap(train)).lower(keys, signs).compile(FAST_COMPILE)(keys, signs)
    ret = np.asarray(m["return_mean"])
    assert ret[0, -2:].mean() > ret[0, :2].mean() + 0.6, ret  # learns the target
    assert ret[1, -2:].mean() < ret[1, :2].mean() - 0.6, ret  # learns to avoid it
    np.testing.assert_allclose(np.asarray(m["learned_reward"]),
                               np.asarray(m["env_reward"]) * np.asarray(signs)[:, None], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(runner.reward), np.asarray(signs))


def test_reward_hook_refuses_bad_settings():
    """A KL penalty without a reference policy, a negative coefficient, and a
    reward state without a hook are named."""
    env = envs.make("toy:masked")
    r = lambda s, p, b: b.env_reward  # noqa: E731
    with pytest.raises(ValueError, match="ref_log_prob"):
        make_train(env, tt.TINY, RewardHook(reward=r, kl_coef=0.1))
    with pytest.raises(ValueError, match="kl_coef must be a number >= 0"):
        make_train(env, tt.TINY, RewardHook(reward=r, kl_coef=-1.0))
    from jaxil.algorithms.rl.ppo import make_ppo

    with pytest.raises(ValueError, match="reward_state exactly when"):
        make_ppo(env, tt.TINY).init(jax.random.PRNGKey(0), 1.0)


# --------------------------------------------------------------------------
# GAIL driver: kill and resume
# --------------------------------------------------------------------------
from jaxil.algorithms.irl.adversarial import (  # noqa: E402
    AdversarialConfig,
    demos_from_dataset,
    stack_demos,
    train_adversarial,
)
from jaxil.runs.rundir import read_jsonl  # noqa: E402

SMALL = tt.TINY.replace(num_envs=8, num_steps=8, update_epochs=1, num_minibatches=1,
                        updates_per_chunk=1, total_timesteps=3 * 64)
GAIL = AdversarialConfig(method="gail", hidden=(8,), mixer_hidden=4, disc_batch=32,
                         disc_lr=1e-3, disc_steps=2, kl_coef=0.05, sft_updates=5,
                         sft_batch=32, eval_episodes=8)


def _target_expert(params, obs, avail, key):
    return jnp.argmax(obs[:, :4], axis=-1).astype(jnp.int32)


@pytest.fixture(scope="module")
def toy_demos():
    env = envs.make("toy:masked")
    ep = fast_call(lambda k: envs.run_episodes(env, _target_expert, None, k, 3),
                   jax.random.PRNGKey(5))
    # One demonstration set per seed (2 and 3 trajectories: padding in play).
    return env, stack_demos([demos_from_dataset(ep, [0, 1]), demos_from_dataset(ep, [0, 1, 2])])


@pytest.mark.slow  # default-suite time (~20 s); the engine's, SFT's and offline training's resume tests stay
def test_gail_resume_reproduces_the_uninterrupted_run(toy_demos, tmp_path):
    """GAIL (team discriminator, 2 discriminator steps per
    PPO iteration, KL to π_SFT), 2 seeds vmapped: 3 chunks straight vs 1
    chunk, a stop, and --resume. Metrics rows and the final state (actor,
    critic, discriminator, its Adam state, keys) must be identical. Fails if
    any randomness or state lives outside the checkpoint (a key drawn from
    the wall clock, the discriminator not saved, the SFT redone on resume
    over the restored actor), or rows past the checkpoint are kept twice.
    Also: at the first update the policy IS π_SFT, so the KL estimate is 0."""
    env, demos = toy_demos
    kw = dict(seeds=2, progress=False, compiler_options=FAST_COMPILE)
    full = train_adversarial(env, SMALL, GAIL, demos, out_dir=tmp_path / "full", **kw)
    part = train_adversarial(env, SMALL, GAIL, demos, out_dir=tmp_path / "part",
                             stop_after_chunks=1, **kw)
    assert not part["complete"] and full["complete"]
    with pytest.raises(FileExistsError, match="--resume"):
        train_adversarial(env, SMALL, GAIL, demos, out_dir=tmp_path / "part", **kw)
    with pytest.raises(ValueError, match="differ from the run.*config"):
        train_adversarial(env, SMALL, GAIL.__class__(**dict(GAIL.to_dict(), hidden=(8,),
                                                             disc_steps=3)),
                          demos, out_dir=tmp_path / "part", resume=True, **kw)
    res = train_adversarial(env, SMALL, GAIL, demos, out_dir=tmp_path / "part", resume=True, **kw)
    assert res["complete"]
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k} for r in rows]  # noqa: E731
    rows_full = strip(read_jsonl(tmp_path / "full" / "metrics.jsonl"))
    rows_res = strip(read_jsonl(tmp_path / "part" / "metrics.jsonl"))
    assert [r["chunk"] for r in rows_full] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rows_full == rows_res
    for a, b in zip(jax.tree.leaves(full["states"]), jax.tree.leaves(res["states"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    first = [r for r in rows_full if r["chunk"] == 1]
    assert all(r["kl"] == 0.0 for r in first), first
    assert all(np.isfinite(r["disc_loss"]) and r["grad_penalty"] == 0 for r in first)
    # The two seeds have different demonstrations and different discriminators.
    d = full["states"].reward.disc.params
    leaf = np.asarray(jax.tree.leaves(d)[0])
    assert not np.array_equal(leaf[0], leaf[1])


def test_policy_samples_keep_an_empty_legal_action_mask():
    """The discriminator's policy samples of a box-action rollout, whose
    legal-action mask is ``[T, E, N, 0]``: ``disc_batch`` steps with the mask
    ``[B, N, 0]``. Bug caught: a reshape with ``-1``, which cannot be
    inferred for a zero-size leaf (``ZeroDivisionError: integer modulo by
    zero`` in every GAIL/AIRL run on a box-action environment)."""
    from jaxil.algorithms.irl.adversarial import Adversarial
    from jaxil.algorithms.rl.ppo import RewardBatch, make_actor

    spec = envs.make("toy:continuous").spec
    n, o, d = spec.num_agents, spec.obs_dim, spec.action.dim
    T, E = 3, 4
    z = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    batch = RewardBatch(obs=z(T, E, n, o), global_state=z(T, E, spec.state_dim),
                        avail=np.zeros((T, E, n, 0), bool), action=z(T, E, n, d),
                        next_obs=z(T, E, n, o), next_global_state=z(T, E, spec.state_dim),
                        last=np.zeros((T, E), bool), env_reward=z(T, E))
    adv = Adversarial(spec, make_actor(spec, SMALL), SMALL, GAIL)
    # Traced as inside the GAIL/AIRL program (the reshape fails when traced;
    # nothing to compile: only the shapes are checked).
    got = jax.eval_shape(adv.policy_samples, batch, jax.random.PRNGKey(0))
    assert got.avail.shape == (GAIL.disc_batch, n, 0)
    assert got.actions.shape == (GAIL.disc_batch, n, d)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gail", "airl"])
def test_adversarial_chunk_on_box_actions(tmp_path, method):
    """A box-action environment (legal-action mask ``[N, 0]``) through one
    GAIL or AIRL chunk end to end: the metrics are finite. Bug caught: any
    step of the program that mishandles the zero-size mask (the policy
    samples' reshape was one)."""
    env = envs.make("toy:continuous")
    half = lambda params, obs, avail, key: jnp.full((obs.shape[0], 2), 0.5)  # noqa: E731
    ep = fast_call(lambda k: envs.run_episodes(env, half, None, k, 2), jax.random.PRNGKey(0))
    demos = stack_demos([demos_from_dataset(ep, [0, 1])])
    cfg = GAIL.__class__(**dict(GAIL.to_dict(), method=method, hidden=(8,), reward_form=None))
    out = train_adversarial(env, SMALL, cfg, demos, out_dir=tmp_path, seeds=1, progress=False,
                            compiler_options=FAST_COMPILE, stop_after_chunks=1)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["chunk"] == 1]
    assert rows and all(np.isfinite(r["disc_loss"]) for r in rows), rows
    assert not out["complete"]


# --------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------
import json  # noqa: E402

from jaxil.cli.main import main as cli_main  # noqa: E402


@pytest.fixture(scope="module")
def spread_file(tmp_path_factory):
    """12 random episodes of ``mpe:simple_spread``'s shapes (numpy, no rollout
    to compile) as an expert-tier jaxil dataset file: what the bad-input
    checks read (its counts, tier and environment)."""
    from helpers.data import make_dataset
    from jaxil.data import save

    ds = make_dataset(envs.make("mpe:simple_spread").spec, num=12, tier="expert",
                      source="scripted", expert=True)
    path = tmp_path_factory.mktemp("spread-file") / "demos.npz"
    save(ds, path)
    return path


@pytest.fixture(scope="module")
def spread_demos(tmp_path_factory):
    """12 episodes of the scripted MPE spread expert as a jaxil dataset file."""
    from jaxil.envs.experts import scripted_expert
    from jaxil.data import save
    from jaxil.data.format import Dataset

    env = envs.make("mpe:simple_spread")
    pol = scripted_expert(env)[0]
    ep = fast_call(lambda k: envs.run_episodes(env, pol, None, k, 12), jax.random.PRNGKey(0))
    ds = Dataset.from_episodes(jax.device_get(ep), env.spec, "expert", "scripted", 0)
    path = tmp_path_factory.mktemp("spread") / "demos.npz"
    save(ds, path)
    return path


CLI_SMALL = ["--total-timesteps", "768", "--num-envs", "8", "--num-steps", "32",
             "--updates-per-chunk", "1", "--update-epochs", "1", "--num-minibatches", "1",
             "--hidden", "16", "--disc-hidden", "16", "--mixer-hidden", "8", "--disc-batch", "32",
             "--sft-updates", "10", "--sft-batch", "32", "--eval-episodes", "4", "--seeds", "2",
             "--no-progress"]


@pytest.mark.parametrize("argv, match", [
    (["gail", "--env", "mpe:simple_spread", "--demos", "{d}", "--num-demos", "13"],
     "fewer than --num-demos 13"),
    (["gail", "--env", "mpe:simple_spread", "--demos", "{d}", "--num-demos", "4", "--seeds", "4",
      "--demos-per-seed"], r"fewer than --num-demos 4 × 4 seeds"),
    (["airl", "--env", "mpe:simple_spread", "--demos", "{d}", "--tier", "poor"],
     "--tier 'poor' is not in"),
    (["gail", "--env", "mpe:simple_spread", "--demos", "{d}", "--kl-coef", "0.1",
      "--sft-updates", "0"], "kl_coef.*needs a reference policy"),
    (["gail", "--env", "mpe:simple_spread", "--demos", "{d}", "--num-envs", "6", "--num-steps", "3"],
     "num_minibatches.*must divide"),
    (["gail", "--env", "smax:3m", "--demos", "{d}"], "spec|env"),
])
def test_cli_bad_input_is_one_line(spread_file, capsys, argv, match):
    """Bad counts, tiers, settings and a dataset of another environment end in
    a one-line error naming the problem (exit 1), before any compilation."""
    import re

    argv = [a.replace("{d}", str(spread_file)) for a in argv]
    assert cli_main(argv + ["--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err


@pytest.mark.parametrize("argv", [["gail", "--disc-steps", "0"], ["airl", "--gp-coef", "-1"],
                                  ["gail", "--gamma", "1.5"], ["irl", "ppo", "--kl-coef", "nan"],
                                  ["gail", "--reward-form", "bogus"]])
def test_cli_range_checked_arguments(argv, capsys):
    """Out-of-range values are refused by argparse (exit 2) with the range."""
    with pytest.raises(SystemExit) as e:
        cli_main(argv + ["--env", "mpe:simple_spread", "--demos", "x"])
    assert e.value.code == 2
    import re

    assert re.search(r"argument --\S+: (must be in|invalid choice|expected)", capsys.readouterr().err)


@pytest.mark.slow  # three CLI processes, each compiling (~2-4 min on a shared 2-core CPU)
def test_cli_gail_killed_with_sigkill_resumes_exactly(spread_demos, tmp_path):
    """``jaxil gail`` killed by SIGKILL once a checkpoint past chunk 0 exists,
    then ``--resume``: the metrics equal an uninterrupted run's line for line
    (keys redrawn on resume, the SFT redone over the restored actor, or rows
    of an uncommitted chunk kept would differ)."""
    import sys

    from helpers.cli_kill import kill_then_resume

    args = [sys.executable, "-m", "jaxil.cli.main", "gail", "--env", "mpe:simple_spread",
            "--demos", str(spread_demos), "--num-demos", "3", "--demos-per-seed",
            "--gp-coef", "0.1", "--kl-coef", "0.05"] + CLI_SMALL
    kill_then_resume(args, tmp_path, min_step=1, max_step=3)
    a = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert len(a) == 2 * 4 and [json.loads(x) for x in a] == [json.loads(x) for x in b]
    ra = json.loads((tmp_path / "full" / "results.json").read_text())
    rb = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert ra["final"] == rb["final"] and ra["initial"] == rb["initial"]


# --------------------------------------------------------------------------
# Direction: the policy is rewarded for acting like the demonstrations
# --------------------------------------------------------------------------
def _masked_toy_steps(seed, k, expert):
    """``k`` steps of toy:masked (2 agents, 4 actions) as :class:`Demos`, built
    in numpy (no rollout to compile): a random target per agent (one-hot in
    the observation, always available), a random time feature, and the
    target as the action (``expert``) or a uniformly random available one."""
    from jaxil.algorithms.irl.adversarial import Demos

    rng = np.random.default_rng(seed)
    n, a = 2, 4
    target = rng.integers(0, a, (k + 1, n))
    onehot = np.eye(a, dtype=np.float32)[target]
    t = rng.integers(0, 8, k + 1)
    obs = np.concatenate([onehot, np.broadcast_to((t / 8.0)[:, None, None], (k + 1, n, 1))], -1)
    avail = (rng.random((k, n, a)) < 0.5) | (onehot[:k] > 0)
    rand = np.argmax(np.where(avail, rng.random((k, n, a)), -1.0), -1)
    actions = target[:k] if expert else rand
    gs = onehot.reshape(k + 1, n * a)
    return Demos(obs=jnp.asarray(obs[:k], jnp.float32), global_state=jnp.asarray(gs[:k]),
                 avail=jnp.asarray(avail), actions=jnp.asarray(actions, jnp.int32),
                 next_obs=jnp.asarray(obs[1:], jnp.float32), next_global_state=jnp.asarray(gs[1:]),
                 last=jnp.asarray(t[:k] == 7), reward=jnp.zeros(k, jnp.float32),
                 weight=jnp.ones(k, jnp.float32))


def _as_rollout(d, t=16):
    """Steps as a time-major :class:`RewardBatch` ``[t, k/t, ...]``."""
    from jaxil.algorithms.rl.ppo import RewardBatch

    r = lambda x: x.reshape((t, x.shape[0] // t) + x.shape[1:])  # noqa: E731
    return RewardBatch(obs=r(d.obs), global_state=r(d.global_state), avail=r(d.avail),
                       action=r(d.actions), next_obs=r(d.next_obs),
                       next_global_state=r(d.next_global_state), last=r(d.last),
                       env_reward=r(d.reward))


@pytest.mark.slow  # default-suite time (about 13 s; the AIRL learning test and the reward-form tests stay); run with -m slow
def test_gail_policy_learns_the_demonstrated_action():
    """GAIL from a random policy on toy:masked (64 PPO iterations, 4
    discriminator steps each, one compiled program): the policy's
    probability of the demonstrated actions rises from ~0.46 to ~0.9 (it
    falls under any of the mutations below). Kills, at their call sites: 'the
    policy's reward negated' (``-gail_reward(...)`` in ``Adversarial.reward``;
    the reward-form test above checks gail_reward itself), 'demonstrations
    and policy samples swapped in the discriminator update'
    (``Adversarial.disc_update``), and 'the learned reward negated where PPO
    takes it' (the ``RewardHook`` reward in ``make_ppo``).

    Then ``irl ppo``'s reward (method "ppo": a fixed reward model, here the
    trained discriminator) is higher on the demonstrations than on random
    play (~0.1 against ~-4.9): kills 'the learned reward's sign flipped' for
    PPO on a reward model (the same ``Adversarial.reward`` line, flipped for
    method "ppo" only)."""
    from jaxil.algorithms.irl.adversarial import Adversarial, AdversarialState, Program

    env = envs.make("toy:masked")
    demos, play = _masked_toy_steps(0, 256, expert=True), _masked_toy_steps(1, 256, expert=False)
    ppo = tt.TINY.replace(lr=1e-2, anneal_lr=False, updates_per_chunk=64, update_epochs=1,
                          num_minibatches=1, total_timesteps=64 * 16 * 8)
    # A summed team discriminator (the sign lines are the hypernetwork's too):
    # the smallest program to compile.
    cfg = AdversarialConfig(method="gail", mixing="sum", hidden=(16,), disc_batch=64,
                            disc_lr=1e-2, disc_steps=4, sft_updates=0, eval_episodes=8)
    prog = Program(env, ppo, cfg)
    fixed = Adversarial(env.spec, prog.adv.actor, ppo, AdversarialConfig(
        method="ppo", mixing="sum", hidden=(16,)))

    def run(key):  # one compiled program: init, one chunk of 64 iterations, the measures
        k_init, k_fixed = jax.random.split(key)
        runner, _, _ = prog.init(k_init, demos)
        p_demo = lambda params: jnp.exp(prog.adv.actor.log_prob(  # noqa: E731
            params, demos.obs, demos.avail, demos.actions)).mean()
        before = p_demo(runner.actor.params)
        runner, _ = prog.ppo.update_chunk(runner)
        rs = AdversarialState(disc=fixed.init_disc(k_fixed, runner.reward.disc.params), demos=None)
        r = lambda d: fixed.reward(rs, runner.actor.params, _as_rollout(d)).mean()  # noqa: E731
        return before, p_demo(runner.actor.params), r(demos), r(play)

    before, after, r_demo, r_play = map(float, fast_call(run, jax.random.PRNGKey(0)))
    assert after > before + 0.15, (before, after)
    assert r_demo > r_play + 0.5, (r_demo, r_play)


@pytest.mark.parametrize("method,margin", [("airl", 2.0), ("gail", 1.0)])
def test_discriminator_and_reward_favour_the_demonstrations(method, margin):
    """200 discriminator steps (one `disc_update` call of the hook) on
    demonstrations vs random play of toy:masked, then the reward the hook
    gives PPO is clearly higher on the demonstrations (AIRL: f − log π, by
    ~6; GAIL: a function of the discriminator's logit, `reward_form`).
    Kills, at their call sites: 'demonstrations and policy samples swapped
    in the discriminator's loss' (`Adversarial.airl_loss`,
    `Adversarial.disc_update` for GAIL) and 'the policy's reward negated'
    (`Adversarial.reward`), which only the slow learning tests saw; the
    numpy tests check airl_logits, gail_reward and discriminator_loss by
    value only."""
    from jaxil.algorithms.irl.adversarial import Adversarial, AdversarialState
    from jaxil.algorithms.rl.ppo import make_actor

    spec = envs.make("toy:masked").spec
    actor = make_actor(spec, tt.TINY)
    cfg = AdversarialConfig(method=method, mixing="sum", hidden=(16,), disc_batch=64,
                            disc_lr=1e-2, disc_steps=200, sft_updates=0)
    adv = Adversarial(spec, actor, tt.TINY, cfg)
    demos, play = _masked_toy_steps(0, 256, expert=True), _masked_toy_steps(1, 256, expert=False)

    def run(key):  # one compiled program: initialisations, the hook's update, its reward
        k_disc, k_actor, k_update = jax.random.split(key, 3)
        rs = AdversarialState(disc=adv.init_disc(k_disc), demos=demos)
        actor_params = actor.init(k_actor)
        rs, _ = adv.disc_update(rs, actor_params, _as_rollout(play), k_update)
        return (adv.reward(rs, actor_params, _as_rollout(demos)).mean(),
                adv.reward(rs, actor_params, _as_rollout(play)).mean())

    r_demo, r_play = map(float, fast_call(run, jax.random.PRNGKey(2)))
    assert r_demo > r_play + margin, (r_demo, r_play)


def test_the_sft_warm_start_scores_the_demonstrations_under_their_legal_masks():
    """The first BC step of π_SFT (``Adversarial.pretrain``) reports the
    demonstrations' negative log-likelihood under their own legal-action
    masks: on demonstrations that repeat one step of toy:masked (about
    half its actions unavailable), −Σ_i log π_i(a_i | o_i) of the actor
    at its initial parameters. Kills the warm start scored without the
    demonstrations' ``avail`` (the reference over all actions is checked to
    be far off), which no default test saw (the learning tests start from
    ``sft_updates=0`` or are slow)."""
    from jaxil.algorithms.irl.adversarial import Adversarial
    from jaxil.algorithms.rl.ppo import make_actor

    spec = envs.make("toy:masked").spec
    actor = make_actor(spec, tt.TINY)
    cfg = AdversarialConfig(method="gail", mixing="sum", hidden=(16,), sft_updates=1)
    adv = Adversarial(spec, actor, tt.TINY, cfg)
    one = _masked_toy_steps(0, 8, expert=True)
    one = jax.tree.map(lambda x: jnp.repeat(x[1:2], 64, axis=0), one)
    assert not bool(one.avail[0].all())

    def run(key):
        params = actor.init(key)
        _, losses = adv.pretrain(params, one, jax.random.PRNGKey(1))
        ref = lambda av: -jnp.sum(actor.log_prob(params, one.obs[:1], av, one.actions[:1]))  # noqa: E731
        return losses[0], ref(one.avail[:1]), ref(jnp.ones_like(one.avail[:1]))

    loss, want, unmasked = map(float, fast_call(run, jax.random.PRNGKey(0)))
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert abs(unmasked - want) > 0.2, (want, unmasked)


def test_the_sft_warm_start_of_a_normalising_actor_takes_the_demonstrations_statistics():
    """With `normalize_obs`, π_SFT first folds the demonstrations' observations
    into the actor's statistics, padding (weight 0) left out, so that BC fits
    the standardised inputs PPO goes on to see. Fails if the warm start keeps
    the identity statistics (count 1e-4) or counts the padding rows (whose
    observations are set to 1e3 here, so the mean would move far off)."""
    from jaxil.algorithms.irl.adversarial import Adversarial
    from jaxil.algorithms.rl.ppo import make_actor

    spec = envs.make("toy:masked").spec
    ppo = tt.TINY.replace(normalize_obs=True)
    actor = make_actor(spec, ppo)
    cfg = AdversarialConfig(method="gail", mixing="sum", hidden=(16,), sft_updates=1)
    adv = Adversarial(spec, actor, ppo, cfg)
    d = _masked_toy_steps(0, 32, expert=True)
    real = np.arange(32) < 20
    d = d.replace(weight=jnp.asarray(real, jnp.float32),
                  obs=jnp.where(jnp.asarray(real)[:, None, None], d.obs, 1e3))

    def run(key):
        params, _ = adv.pretrain(actor.init(key), d, jax.random.PRNGKey(1))
        return params["obs_stats"]

    stats = fast_call(run, jax.random.PRNGKey(0))
    kept = np.asarray(d.obs)[real].reshape(-1, spec.obs_dim).astype(np.float64)
    np.testing.assert_allclose(float(stats.count), 20 * 2 + 1e-4, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(stats.mean), kept.mean(0), atol=1e-4)
    np.testing.assert_allclose(np.asarray(stats.var), kept.var(0), rtol=1e-3, atol=1e-4)
