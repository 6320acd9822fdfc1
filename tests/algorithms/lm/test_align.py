"""RL against a learned sequence reward (:mod:`jaxil.algorithms.lm.align`),
its losses (:func:`jaxil.losses.leave_one_out_advantages`,
:func:`jaxil.losses.reinforce_loss`) and best-of-N on token tasks
(:mod:`jaxil.algorithms.lm.best_of_n`).

The maths against float64 numpy references, eager and jitted; best-of-N's
prompt-major layout on real rollouts; RL that raises a per-token reward
(and a negated objective that lowers it); and a stopped RL run that resumes
to the uninterrupted run's rows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil import losses as L
from jaxil.algorithms.lm import align as A
from jaxil.algorithms.lm import best_of_n as B
from jaxil.envs.policies import random_policy
from jaxil.envs.tokens import NUM0
from helpers.fast_compile import fast_call


def _maybe_jit(fn, jit):
    return jax.jit(fn) if jit else fn


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_leave_one_out_advantages_match_float64_numpy(jit):
    """A_mk = R_mk − mean of the prompt's other returns. Kills: a baseline
    that includes the rollout's own return (divides by K), a baseline over
    the whole batch instead of the prompt, a flipped sign."""
    rng = np.random.default_rng(0)
    ret = rng.normal(size=(5, 4))
    want = np.stack([[ret[m, k] - np.mean(np.delete(ret[m], k)) for k in range(4)]
                     for m in range(5)])
    got = _maybe_jit(L.leave_one_out_advantages, jit)(jnp.asarray(ret, jnp.float32))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=">= 2 rollouts"):
        L.leave_one_out_advantages(jnp.ones((3, 1)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_reinforce_loss_and_its_gradient_match_float64_numpy(jit):
    """L = −mean_e A_e Σ m log π; ∂L/∂log π_eti = −A_e m_eti / E and no
    gradient into the advantages. Kills: an unmasked sum (the −inf padding
    would make it non-finite), a mean over tokens instead of episodes, a
    flipped sign, advantages that are differentiated."""
    rng = np.random.default_rng(1)
    E, T, N = 3, 5, 2
    lp = rng.normal(size=(E, T, N)) - 1.0
    mask = rng.random((E, T, N)) < 0.6
    lp[~mask] = -np.inf  # padding may hold -inf
    adv = rng.normal(size=E)
    want = -np.mean(adv * np.where(mask, lp, 0.0).sum((1, 2)))
    fn = _maybe_jit(L.reinforce_loss, jit)
    got = fn(jnp.asarray(lp, jnp.float32), jnp.asarray(mask), jnp.asarray(adv, jnp.float32))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    safe = jnp.asarray(np.where(mask, lp, 0.0), jnp.float32)
    g_lp, g_adv = jax.grad(lambda a, b: fn(a, jnp.asarray(mask), b), argnums=(0, 1))(
        safe, jnp.asarray(adv, jnp.float32))
    np.testing.assert_allclose(np.asarray(g_lp), -adv[:, None, None] * mask / E, rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_array_equal(np.asarray(g_adv), 0.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_shaped_returns_match_float64_numpy(jit):
    """R = Σ ρ·r − β Σ m (log π − log π_SFT), with S and KL reported apart.
    Kills: a KL of the wrong sign (log π_SFT − log π), rewards read off
    their read mask, log-ratios counted on forced or padding tokens (which
    hold −inf here)."""
    rng = np.random.default_rng(2)
    E, T, N = 4, 6, 2
    r, lp, lp0 = (rng.normal(size=(E, T, N)) for _ in range(3))
    reads = rng.random((E, T, N)) < 0.5
    mask = rng.random((E, T, N)) < 0.7
    lp[~mask], lp0[~mask], r[~reads] = -np.inf, -np.inf, np.nan
    beta = 0.3
    s = np.where(reads, r, 0).sum((1, 2))
    kl = np.where(mask, lp - np.where(mask, lp0, 0), 0).sum((1, 2))
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    got = _maybe_jit(A.shaped_returns, jit)(f32(r), jnp.asarray(reads), f32(lp), f32(lp0),
                                             jnp.asarray(mask), jnp.float32(beta))
    for g, w in zip(got, (s - beta * kl, s, kl)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=2)


def test_same_start_episodes_are_prompt_major_and_best_of_n_by_truth_is_the_oracle(env):
    """Episodes ``m·K … m·K+K−1`` share prompt m's tokens (the first
    observation) and prompts differ; scoring by the true return gives the
    oracle curve and ρ = 1; the length diagnostic ranks by the episode's
    steps. Kills: a rollout-major reshape (prompts mixed within a group), a
    curve that ignores the scores, lengths read off the wrong axis."""
    rand = random_policy(env.spec)
    M, K = 3, 4
    eps = fast_call(lambda k: B.same_start_token_episodes(
        env, rand, None, jax.random.split(jax.random.PRNGKey(7), M), k, K),
        jax.random.PRNGKey(8))
    first = np.asarray(eps.obs[:, 0]).reshape(M, K, -1)
    for m in range(M):
        assert (first[m] == first[m, :1]).all()
    assert not (first[0, 0] == first[1, 0]).all() or not (first[0, 0] == first[2, 0]).all()
    rep = B.token_best_of_n(eps, M, {"truth": lambda e: e.episode_return,
                                     "negated": lambda e: -e.episode_return})
    score = rep["score"]
    np.testing.assert_allclose(score["rewards"]["truth"]["curve"], score["oracle"])
    assert score["rewards"]["negated"]["curve"][-1] == pytest.approx(score["oracle"][-1])
    if score["rewards"]["truth"]["spearman_states"]:
        assert score["rewards"]["truth"]["spearman"] == pytest.approx(1.0)
    steps = np.asarray(eps.mask).sum(1)
    rep_len = B.token_best_of_n(eps, M, {"length": lambda e: steps, "minus": lambda e: -steps})
    assert rep_len["length_spearman"]["length"] == pytest.approx(1.0)  # random play: lengths vary
    assert rep_len["length_spearman"]["minus"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="prompts"):
        B.token_best_of_n(eps, 5, {"truth": lambda e: e.episode_return})
    with pytest.raises(ValueError, match="NaN or inf"):
        B.token_best_of_n(eps, M, {"bad": lambda e: e.episode_return * np.nan})


def _small_number_reward(params, episodes):
    """+w per agent token that is a number below 10 (a reward the policy can
    raise by choosing small operands); ``params`` is the weight w."""
    a = episodes.actions
    small = (a >= NUM0) & (a < NUM0 + 10)
    return jnp.where(small, params, 0.0).astype(jnp.float32), small | (a >= 0)


def _rl(env, *, num_updates=40, stop=None, out_dir=None, resume=False, kl=(0.0, 0.0)):
    cfg = A.AlignConfig(prompts=4, rollouts_per_prompt=4, learning_rate=3e-3,
                        num_updates=num_updates, eval_every=num_updates // 2, eval_episodes=32)
    net = A.make_policy(env, cfg)
    params = jax.vmap(net.init)(jax.random.split(jax.random.PRNGKey(0), len(kl)))
    return A.train_align(env, _small_number_reward, jnp.ones(len(kl)), params, list(kl),
                         list(range(len(kl))), cfg, out_dir=out_dir, resume=resume,
                         stop_after_chunks=stop)


def _small_share(env, res):
    """The evaluation's learned reward per run at the start and the end."""
    rows = res.rows
    start = np.array([r["eval_reward"] for r in rows if r["update"] == 0])
    end = np.array([r["eval_reward"] for r in rows if r["update"] == max(x["update"] for x in rows)])
    return start, end


@pytest.mark.slow
def test_rl_raises_the_reward_and_a_negated_objective_lowers_it(env, monkeypatch):
    """40 REINFORCE updates from a random policy raise the per-episode count
    of small-number tokens (the reward) on the fixed evaluation instances by
    a clear margin; with the surrogate's sign flipped they fall. Kills: a
    flipped sign in reinforce_loss, advantages not centred on the prompt (no
    learning signal), the gradient taken w.r.t. the reference instead of the
    policy."""
    start, end = _small_share(env, _rl(env))
    assert (end > start + 1.0).all(), (start, end)
    orig = L.reinforce_loss
    monkeypatch.setattr(A, "reinforce_loss", lambda *a: -orig(*a))
    start_n, end_n = _small_share(env, _rl(env))
    assert (end_n < start_n - 0.5).all(), (start_n, end_n)


@pytest.mark.slow
def test_a_large_kl_coefficient_holds_the_policy_at_the_reference(env):
    """With β = 10 the policy stays near π_SFT (small KL, little reward
    gain) while β = 0 drifts. Kills: the KL term dropped from the return or
    added with the wrong sign (then β = 10 would drift further)."""
    res = _rl(env, kl=(0.0, 10.0))
    last = max(r["update"] for r in res.rows)
    kl = {r["kl_coef"]: r["eval_kl"] for r in res.rows if r["update"] == last}
    assert kl[10.0] < kl[0.0] / 2 and kl[0.0] > 0.5, kl


@pytest.mark.slow
def test_a_stopped_rl_run_resumes_to_the_uninterrupted_rows(env, tmp_path):
    """Stop after the first chunk, resume: every row equals the
    uninterrupted run's. Kills: a resume that restarts the key stream, drops
    the optimiser state or re-evaluates from the wrong parameters."""
    full = _rl(env, num_updates=8)
    _rl(env, num_updates=8, out_dir=tmp_path / "r", stop=1)
    resumed = _rl(env, num_updates=8, out_dir=tmp_path / "r", resume=True)
    key = lambda r: (r["update"], r["run"])  # noqa: E731
    a, b = sorted(full.rows, key=key), sorted(resumed.rows, key=key)
    assert len(a) == len(b) == 6
    for x, y in zip(a, b):
        for k in ("eval_return", "eval_reward", "eval_kl", "loss"):
            if k in x:
                assert x[k] == y[k], (k, x, y)
    with pytest.raises(ValueError):
        _rl(env, num_updates=8, out_dir=tmp_path / "r", resume=True, kl=(0.0, 1.0))


def test_bad_settings_raise_one_line_errors(env):
    """Out-of-range settings and parameters that are not stacked per run
    name the problem."""
    with pytest.raises(ValueError, match="rollouts_per_prompt"):
        A.AlignConfig(rollouts_per_prompt=1)
    with pytest.raises(ValueError, match="multiple of eval_every"):
        A.AlignConfig(num_updates=10, eval_every=3)
    cfg = A.AlignConfig()
    net = A.make_policy(env, cfg)
    # parameters stacked for two runs; zeros of init's shapes (the checks read
    # no value, and compiling the vmapped init costs seconds)
    shapes = jax.eval_shape(jax.vmap(net.init), jax.random.split(jax.random.PRNGKey(0), 2))
    p = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    with pytest.raises(ValueError, match="one KL coefficient per seed"):
        A.align_program(env, _small_number_reward, jnp.ones(2), p, [0.1], [0, 1], cfg)
    with pytest.raises(ValueError, match="finite and >= 0"):
        A.align_program(env, _small_number_reward, jnp.ones(2), p, [0.1, -1.0], [0, 1], cfg)
    with pytest.raises(ValueError, match="stacked with one entry per run"):
        A.align_program(env, _small_number_reward, jnp.ones(3), p, [0.1, 0.1], [0, 1], cfg)
    with pytest.raises(ValueError, match="size and agent_ids"):
        A.align_program(env, _small_number_reward, jnp.ones(2), p, [0.1, 0.1], [0, 1],
                        A.AlignConfig(size="small"))
    with pytest.raises(ValueError, match="not a token environment"):
        A.align_program(envs.make("mpe:simple_spread"), _small_number_reward, jnp.ones(2), p,
                        [0.1, 0.1], [0, 1], cfg)
    with pytest.raises(ValueError, match="num_rollouts"):
        B.same_start_token_episodes(env, random_policy(env.spec), None,
                                    jax.random.split(jax.random.PRNGKey(0), 2),
                                    jax.random.PRNGKey(1), 0)


@pytest.mark.slow
def test_cli_sft_then_align_killed_with_sigkill_resumes_exactly(tmp_path):
    """``jaxil lm sft`` on an ε-noisy expert, then ``jaxil lm align``
    (an Init–SFT reward model, then RL at two KL coefficients) killed by
    SIGKILL once the RL stage has a checkpoint and ``--resume``d: both
    stages' metrics equal the uninterrupted run's line for line. Kills a
    resume that retrains the reward model differently, redraws the rollout
    keys or restarts the update count."""
    import json
    import subprocess
    import sys

    from helpers.cli_kill import kill_then_resume

    cli = [sys.executable, "-m", "jaxil.cli.main", "lm"]
    task = ["--env", "tokens:arith", "--task-knob", "num_ops=2"]
    sft_dir = tmp_path / "sft"
    subprocess.run(cli + ["sft"] + task + ["--demos", "32", "--heldout", "0", "--updates", "20",
                                           "--eval-every", "20", "--eval-episodes", "8",
                                           "--seeds", "2", "--demo-epsilon", "0.1",
                                           "--no-progress", "--out", str(sft_dir)],
                   check=True, capture_output=True)
    args = cli + ["align"] + task + ["--sft", str(sft_dir), "--rm-updates", "10",
                                     "--source-episodes", "16", "--kl", "0", "0.1",
                                     "--updates", "12", "--eval-every", "2", "--prompts", "2",
                                     "--rollouts", "2", "--eval-episodes", "8", "--no-progress"]
    full, killed = kill_then_resume(args, tmp_path, min_step=2, max_step=12, stage="rl",
                                    timeout_s=400)
    for stage in ("reward", "rl"):
        a = (full / stage / "metrics.jsonl").read_text().splitlines()
        b = (killed / stage / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x) for x in a] == [json.loads(x) for x in b], stage
    rows = [json.loads(x) for x in (full / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert {r["kl_coef"] for r in rows} == {0.0, 0.1} and max(r["update"] for r in rows) == 12


def test_cli_align_refuses_bad_input_in_one_line(tmp_path, capsys):
    """``jaxil lm align`` with a directory that holds no students, a
    non-token task or too few rollouts per prompt exits 1 with one line
    naming the fix (no traceback)."""
    from jaxil.cli.main import main

    base = ["lm", "align", "--no-progress"]
    for extra, needle in (
            (["--env", "tokens:arith", "--sft", str(tmp_path)], "no students.json there"),
            (["--env", "mpe:simple_spread", "--sft", str(tmp_path)], "is not a token task")):
        assert main(base + extra) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
