"""What the interactive program's on-policy distillation round
([`make_opd_round`][jaxil.algorithms.lm.interactive.make_opd_round]) passes
into its loss, its mask and its budget, checked against
[`jaxil.algorithms.lm.distill`][jaxil.algorithms.lm.distill] on the round's
own episodes, in the default suite.

One compiled round (`fast_compile`; the regime's budget and learning rate
are traced) serves every test, on `tokens:exchange` with one value per
agent and four turns (two agents, so an agent off turn plays `<wait>`), an
untrained tiny student and a random tiny expert LM with its parameters
scaled up (a sharper distribution than the student's). The round runs
from a buffer already holding other episodes of the student (an earlier
round's, as DAgger's buffer would), so a round that trains on its buffer
rather than on its own fresh episodes is seen.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.interactive.config import resolve_auto
from jaxil.algorithms.lm import distill as OPD
from jaxil.algorithms.lm import interactive as TI
from jaxil.algorithms.lm import sft
from jaxil.losses.distill import distillation_loss
from jaxil.nn.transformer import TransformerPolicy, config_for_env

from helpers.fast_compile import fast_call, fast_compile

ENV = envs.make("tokens:exchange", half=1, max_turns=4)
E = 8  # episodes per round
CFG = TI.TokenInteractiveConfig(rounds=1, episodes_per_round=E, updates_per_round=1,
                                batch_episodes=E, sft_tokens=10, sft_updates=1, eval_episodes=1)
BETA = 0.5  # GKD's beta compiled into the round (not an endpoint, so 0 and 1 are both wrong)
RTOL = 1e-5  # the round's loss against opd_loss compiled apart
TIGHT = 40  # interactive expert tokens of the tight regime: a few of the E episodes


def _hp(budget: int, lr: float):
    [(_, h)], beta = TI._split_distill(
        [("opd", TI.token_regime("opd", CFG.sft_tokens + budget, sft_tokens=CFG.sft_tokens,
                                 distill_beta=BETA, lr=lr))])
    assert beta == BETA
    return TI.stack_regimes([resolve_auto(h, 2.0, 0.0)])


@pytest.fixture(scope="module")
def setup():
    student = TI.make_student(ENV, CFG)
    expert = TransformerPolicy(config_for_env(ENV, "tiny"))
    assert expert.config == student.config  # one compiled init serves both
    init = fast_compile(student.init, jax.random.PRNGKey(0))
    params = init(jax.random.PRNGKey(0))
    expert_params = jax.tree.map(lambda x: 3.0 * x, init(jax.random.PRNGKey(1)))
    tx = TI._optimizer(CFG)
    # The student's own episodes: its sampling policy from a key; round 0
    # samples from its rollout key (the round splits its key as make_round
    # does), an earlier round's from another.
    key = jax.random.PRNGKey(3)
    rollout = fast_compile(lambda p, k: envs.run_episodes(ENV, student.policy(), p, k, E),
                           params, key)
    own = sft.from_episodes(ENV, rollout(params, jax.random.split(key)[1]))
    stale = sft.from_episodes(ENV, rollout(params, jax.random.PRNGKey(4)))
    stale_mask = sft._token_mask(stale, False)
    demos = TI.Demos(episodes=stale, mask=stale_mask)  # unused by the round
    full = TI.EpisodeBuffer(obs=stale.obs, avail=stale.avail, targets=stale.actions,
                            mask=stale_mask, size=jnp.int32(E), ptr=jnp.int32(0))

    def state(budget, lr=1e-3):
        hp = jax.tree.map(lambda x: x[0], _hp(budget, lr))
        return TI.TokenRunState(
            params=params, opt_state=TI._set_lr(tx.init(params), hp.lr), hp=hp, buffer=full,
            spent=jnp.int32(0), expert_turns=jnp.int32(0), expert_episodes=jnp.int32(0),
            demo_eps=jnp.int32(E), round=jnp.int32(0), key=key)

    round_fn = fast_compile(TI.make_opd_round(ENV, student, expert, CFG, tx, BETA), state(TIGHT),
                            demos, expert_params)
    # Both networks' teacher-forced log-probabilities of a batch of E
    # episodes (expert_log_probs scores any TransformerPolicy).
    scores = fast_compile(lambda p, b: (OPD.expert_log_probs(student, p, b),
                                        OPD.expert_log_probs(expert, expert_params, b)),
                          params, own)
    opd = fast_compile(lambda p, b: OPD.opd_loss(student, p, expert, expert_params, b, BETA),
                       params, own)
    return dict(params=params, state=state, own=own, stale=stale, scores=scores, opd=opd,
                round=lambda s: jax.device_get(round_fn(s, demos, expert_params)))


@pytest.fixture(scope="module")
def tight(setup):
    """The round under the tight budget: `(state, metrics, within [E])`,
    `within` the episodes whose cumulative scored tokens fit the allowance
    (computed here from the episodes)."""
    new, metrics, _ = setup["round"](setup["state"](TIGHT))
    scored = np.asarray(OPD.expert_tokens_scored(setup["own"]))
    within = np.cumsum(scored) <= TIGHT
    assert 0 < within.sum() < E  # the allowance cuts: some episodes are left out
    return new, metrics, within


def _divergence(log_s, log_e, batch, beta=BETA):
    """`distillation_loss` of given log-probabilities under `batch`'s SFT mask."""
    return float(distillation_loss(log_s, log_e, batch.avail, sft._token_mask(batch, False), beta))


def test_round_minimises_opd_loss_on_its_own_fresh_episodes(setup, tight):
    """The loss the round's update minimises is `opd_loss` of the student
    (before the update), the expert LM and the round's beta on the
    student's own freshly sampled episodes within the allowance, and the
    buffer then holds exactly those episodes. Kills a round that trains
    on its buffer (the stale episodes it started with, or them and the
    fresh ones), on all of its episodes past the allowance too, with the
    expert's scores one step off, with another beta (1 or 0 instead of
    the compiled 0.5), or on episodes the student did not sample itself
    (the expert's, or greedy ones)."""
    new, metrics, within = tight
    own, stale, opd = setup["own"], setup["stale"], setup["opd"]
    mine = own.replace(mask=own.mask & jnp.asarray(within)[:, None])  # the others: padding
    got = float(metrics["loss"])
    np.testing.assert_allclose(got, float(opd(setup["params"], mine)), rtol=RTOL)

    buf = new.buffer
    n = int(within.sum())
    assert int(buf.size) == n == int(metrics["episodes_within_budget"])
    idx = np.flatnonzero(within)
    np.testing.assert_array_equal(np.asarray(buf.obs[:n]), np.asarray(own.obs[idx]))
    np.testing.assert_array_equal(np.asarray(buf.targets[:n]), np.asarray(own.actions[idx]))
    assert not np.asarray(buf.mask[n:]).any()

    s_own, e_own = setup["scores"](setup["params"], own)
    s_stale, e_stale = setup["scores"](setup["params"], stale)
    cat = lambda a, b: jnp.concatenate([a, b])
    wrong = {"the stale buffer": float(opd(setup["params"], stale)),
             "past the allowance": float(opd(setup["params"], own)),
             "beta 1": _divergence(s_own, e_own, mine, 1.0),
             "beta 0": _divergence(s_own, e_own, mine, 0.0),
             "buffer and fresh": _divergence(cat(s_own, s_stale), cat(e_own, e_stale),
                                             jax.tree.map(cat, mine, stale)),
             "expert one step late": _divergence(s_own, jnp.roll(e_own, 1, axis=1), mine),
             "expert one step early": _divergence(s_own, jnp.roll(e_own, -1, axis=1), mine)}
    for name, value in wrong.items():  # apart by 100× the tolerance of the equality
        assert abs(value - got) > 100 * RTOL * got, name


def test_round_charges_the_expert_tokens_scored(setup, tight):
    """The round charges its budget exactly `expert_tokens_scored` of the
    episodes within the allowance (every speaking token, `<wait>` and
    padding excluded), and stays within the allowance. Kills a budget that
    counts only the expert's own segment (OEC's: nothing here, the expert
    never acts), the episodes' length (padded steps, or every agent's
    token with the off-turn `<wait>`), or the episodes past the
    allowance."""
    new, metrics, within = tight
    own = setup["own"]
    scored = np.asarray(OPD.expert_tokens_scored(own))
    right = int(scored[within].sum())
    assert 0 < right <= TIGHT
    assert int(new.spent) == int(metrics["interactive_tokens"]) == right
    valid = np.asarray(own.mask)[within]
    n_agents = ENV.spec.num_agents
    for name, count in (("episodes' length, every agent", valid.sum() * n_agents),
                        ("padded episodes", within.sum() * ENV.spec.max_steps),
                        ("all episodes", scored.sum()), ("expert's segment", 0)):
        assert count != right, name  # the test tells them apart
    assert int(new.expert_episodes) == int(within.sum())


def test_a_few_rounds_of_opd_lower_the_students_reverse_kl_to_the_expert(setup):
    """Four rounds (one update each, learning rate 0.01, an ample budget)
    lower the student's reverse KL to the expert LM on fixed episodes (its
    own episodes of round 0) by a clear margin. Kills a flipped sign of
    the loss or its gradient (the student would move away from the expert),
    and updates that do not reach the student's parameters."""
    state = setup["state"](10_000, lr=1e-2)
    own = setup["own"]
    kl = lambda params: _divergence(*setup["scores"](params, own), own, 1.0)
    before = kl(setup["params"])
    for _ in range(4):
        state, metrics, _ = setup["round"](state)
    after = kl(state.params)
    assert int(metrics["episodes_within_budget"]) == E
    assert after < 0.9 * before, (before, after)


def test_opd_runs_alone_with_one_beta():
    """`run` refuses, in one line and before any work, an opd regime beside
    another method (their rounds train on different losses) or two opd
    regimes with different betas (GKD's beta is compiled in). Kills a run
    that silently trains every regime with one of the two rounds."""
    lm = TransformerPolicy(config_for_env(ENV, "tiny"))
    opd = lambda b: TI.token_regime("opd", 100, sft_tokens=CFG.sft_tokens, distill_beta=b)
    dagger = TI.token_regime("dagger", 100, sft_tokens=CFG.sft_tokens)
    for regimes, needle in (([("o", opd(1.0)), ("d", dagger)], "without the other methods"),
                            ([("a", opd(1.0)), ("b", opd(0.5))], "share GKD's beta")):
        with pytest.raises(ValueError, match=needle) as info:
            TI.run(ENV, lm, None, regimes, seeds=1, config=CFG)
        assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::jaxil.algorithms.lm.interactive.BudgetUnderspent")
def test_an_opd_run_resumes_to_the_uninterrupted_rows(tmp_path):
    """An opd run on the engine (2 seeds vmapped), stopped after its first
    round and resumed, writes the rows of the uninterrupted run, charges
    scored tokens within its budget, and records its beta in run.json (a
    resume with another beta is refused). Kills OPD state that a checkpoint does
    not hold (the buffer, the spent tokens, the key) and a beta lost from
    the run's identity (a resume with another beta would be accepted)."""
    import json

    config = TI.TokenInteractiveConfig(rounds=2, episodes_per_round=4, updates_per_round=2,
                                       batch_episodes=4, sft_tokens=10, sft_updates=2,
                                       eval_episodes=4)
    lm = TransformerPolicy(config_for_env(ENV, "tiny"))
    lm_params = jax.tree.map(lambda x: 3.0 * x, lm.init(jax.random.PRNGKey(1)))
    regimes = [("opd", TI.token_regime("opd", 30, sft_tokens=10, distill_beta=0.5))]
    run = lambda out, **kw: TI.run(ENV, lm, lm_params, regimes, seeds=2, config=config,
                                   out_dir=out, expert_name="lm:random", **kw)
    full = run(tmp_path / "full")
    run(tmp_path / "cut", stop_after_rounds=1)
    resumed = run(tmp_path / "cut", resume=True)
    assert resumed.rows == full.rows
    last = [r for r in full.rows if r["round"] == 2]
    assert len(last) == 2 and all(0 < r["interactive_tokens"] <= 20 for r in last)
    meta = json.loads((tmp_path / "full" / "run.json").read_text())
    assert "0.5" in json.dumps(meta) and "distill_beta" in json.dumps(meta)
    with pytest.raises(ValueError):
        TI.run(ENV, lm, lm_params,
               [("opd", TI.token_regime("opd", 30, sft_tokens=10, distill_beta=1.0))],
               seeds=2, config=config, out_dir=tmp_path / "cut", resume=True)


@pytest.mark.slow
def test_an_opd_run_whose_rounds_cannot_afford_a_rollout_says_so():
    """A budget one token above the demonstrations leaves each round an
    allowance smaller than any rollout the student writes: the rounds buy
    nothing and the run warns that they bought no expert tokens, naming the
    allowance. Kills a summary that does not pass the demonstrations' cost
    to the warnings (the shortfall warning stays silent here: the budget is
    less than an expert episode above what was spent)."""
    config = TI.TokenInteractiveConfig(rounds=1, episodes_per_round=4, updates_per_round=1,
                                       batch_episodes=4, sft_tokens=10, sft_updates=1,
                                       eval_episodes=4)
    lm = TransformerPolicy(config_for_env(ENV, "tiny"))
    lm_params = jax.tree.map(lambda x: 3.0 * x, lm.init(jax.random.PRNGKey(1)))
    regimes = [("opd", TI.token_regime("opd", 11, sft_tokens=10))]
    with pytest.warns(TI.BudgetUnderspent, match="opd bought no expert tokens in its rounds"):
        res = TI.run(ENV, lm, lm_params, regimes, seeds=1, config=config)
    assert all(r.get("interactive_tokens", 0) == 0 for r in res.rows)
