"""The transcript-only experts of tokens:repair, tokens:arith, tokens:exchange.

Per task ONE compiled program (XLA level 0) plays 240 episodes: half from
the start by the transcript-only expert, half in which a uniform legal
random student types 1 … 12 tokens (never `SUBMIT`, often stopping inside
a command) before the expert takes over. On every step it also asks a
second copy of the expert (its own carry) for its token with the privileged
columns `obs[:, K:]` replaced by random numbers, and the scripted expert for
its token on the true observation. The tests read that one run.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm.task_check import check_token_task
from jaxil.envs.policies import Policy, uniform_available
from jaxil.envs.tokens import VOCAB
from helpers.fast_compile import fast_call

IDS = ["tokens:repair", "tokens:arith", "tokens:exchange"]
EPISODES = 240
SWITCH_HI = 12


@functools.cache
def _env(eid):
    return envs.make(eid)


class _Rec(NamedTuple):
    switch: jax.Array  # [] 0: the expert from the start
    t: jax.Array
    label: jax.Array  # [N] the transcript expert's token on the true obs
    blind: jax.Array  # [N] ... on obs with the privileged columns replaced
    scripted: jax.Array  # [N] the scripted expert's token on the true obs
    scripted_blind: jax.Array  # [N] ... on the replaced obs
    acted: jax.Array  # [] the expert's token was played
    x: object  # the carries
    xb: object


def _shared(env, expert: Policy, scripted: Policy) -> Policy:
    K = env.token_width
    submit = jnp.arange(env.spec.num_actions) == VOCAB["SUBMIT"]

    def init(key, n):
        k_s, k_coin, k_x, k_b = jax.random.split(key, 4)
        switch = jnp.where(jax.random.bernoulli(k_coin), 0,
                           jax.random.randint(k_s, (), 1, SWITCH_HI + 1))
        z = jnp.zeros((n,), jnp.int32)
        return _Rec(switch, jnp.int32(0), z, z, z, z, jnp.bool_(False), expert.init(k_x, n),
                    expert.init(k_b, n))

    def act(params, obs, avail, key, c: _Rec):
        k_r, k_p = jax.random.split(key)
        fake = jax.random.randint(k_p, obs[:, K:].shape, 0, 40).astype(obs.dtype)
        blind_obs = obs.at[:, K:].set(fake)
        a_x, x = expert.act(None, obs, avail, key, c.x)
        a_b, xb = expert.act(None, blind_obs, avail, key, c.xb)
        a_s, _ = scripted.act(None, obs, avail, key, scripted.init(key, obs.shape[0]))
        a_sb, _ = scripted.act(None, blind_obs, avail, key, scripted.init(key, obs.shape[0]))
        now = c.t >= c.switch
        student = jnp.where((avail & ~submit).any(-1, keepdims=True), avail & ~submit, avail)
        a = jnp.where(now, a_x, uniform_available(k_r, student))
        return a, _Rec(c.switch, c.t + 1, a_x, a_b, a_s, a_sb, now, x, xb)

    return Policy(init=init, act=act)


@functools.cache
def _run(eid):
    env = _env(eid)
    expert = envs.token_expert(env, "transcript")[0]
    scripted = envs.token_expert(env, "scripted")[0]
    pol = _shared(env, expert, scripted)

    def run(key):
        return envs.run_episodes(env, pol, None, key, EPISODES,
                                 record_carry=lambda c: c._replace(x=None, xb=None))

    return jax.tree.map(np.asarray, fast_call(run, jax.random.PRNGKey(3)))


@pytest.mark.parametrize("eid", IDS)
def test_transcript_expert_ignores_the_privileged_columns(eid):
    """Two observations whose token columns agree get the same token, at
    turn starts and mid-command, from the start and after a takeover: the
    expert's token is unchanged when `obs[:, K:]` is replaced by random
    numbers on every step. Catches an expert (or its carry update) that
    reads `obs[:, K:]` (the hidden list, the chain, "heard correctly", or
    the environment's copy of the partial command) instead of the context.
    The scripted expert, asked the same, must change its token somewhere
    (else the replacement would test nothing)."""
    env, eps = _env(eid), _run(eid)
    valid = eps.mask.astype(bool)
    rec = eps.carry
    cmd_len = np.asarray(env.privileged(eps.obs[:, :-1]).cmd_len)  # [E, T, N]
    sel = valid[..., None] & np.ones_like(cmd_len, bool)
    mid, start = sel & (cmd_len > 0), sel & (cmd_len == 0)
    assert mid.sum() > 100 and start.sum() > 100
    assert (rec.label[sel] == rec.blind[sel]).all(), (
        f"{eid}: {(rec.label != rec.blind)[sel].sum()} tokens changed with the privileged columns")
    assert (rec.scripted[sel] != rec.scripted_blind[sel]).any()


@pytest.mark.parametrize("eid", IDS)
def test_transcript_expert_wins_from_the_start_and_after_a_takeover(eid):
    """The transcript-only expert alone wins ≥ 0.95 of its episodes (here
    over the run's ~120 episodes from the start; -m slow checks 512), and
    after 1 … 12 random student tokens, most stopping inside a command, it
    still wins ≥ 0.9 of the episodes still running at the switch. Catches a
    protocol that needs the hidden state to finish (e.g. an exchange agent
    that submits the first message it heard, wrong after a student's garbled
    SAY), a partial command it cannot complete, or a carry that misses
    the student's tokens (the expert must read every step, played or not)."""
    env, eps = _env(eid), _run(eid)
    switch = eps.carry.switch[:, 0]
    won = eps.won.astype(bool)
    acted = (eps.carry.acted & eps.mask.astype(bool)).any(1)
    fresh, taken = switch == 0, (switch > 0) & acted
    first = np.argmax(eps.carry.acted & eps.mask.astype(bool), axis=1)
    cl = np.asarray(env.privileged(eps.obs[np.arange(EPISODES), first]).cmd_len).max(-1)
    print(f"{eid}: from the start {won[fresh].mean():.3f} over {fresh.sum()}, after a takeover "
          f"{won[taken].mean():.3f} over {taken.sum()} ({(cl[taken] > 0).mean():.0%} mid-command)")
    assert fresh.sum() > 90 and taken.sum() > 90
    assert won[fresh].mean() >= 0.95
    assert won[taken].mean() >= 0.9
    assert (cl[taken] > 0).mean() > 0.5


@pytest.mark.parametrize("eid", ["tokens:repair", "tokens:arith"])
def test_transcript_expert_plays_the_scripted_tokens_from_the_start(eid):
    """On repair and arith the scripted procedure is followable from the
    transcript, so from a fresh episode both experts type the same token on
    every step. Catches a misread answer (FAIL's WANT and GOT swapped, a
    calculator result not counted as the next chain step, an off-by-one in
    the prompt's operands), which would send the expert down another path."""
    eps = _run(eid)
    fresh = (eps.carry.switch[:, 0] == 0)[:, None] & eps.mask.astype(bool)
    assert fresh.sum() > 1000
    assert (eps.carry.label[fresh] == eps.carry.scripted[fresh]).all()


def test_exchange_transcript_expert_submits_a_half_heard_twice():
    """From the start: A says, B says, A says, B submits (4 turns), and B's
    submission is never on a single message. Catches a trust rule that
    submits after one HEAR (2 turns: right only because the speaker was the
    expert) or never submits (truncated after 8 turns)."""
    env, eps = _env("tokens:exchange"), _run("tokens:exchange")
    fresh = eps.carry.switch[:, 0] == 0
    acts, mask = eps.actions[fresh], eps.mask[fresh].astype(bool)
    eots = ((acts == env.eot_token) & mask[..., None]).sum(axis=(1, 2))
    assert (eots == 4).all(), np.unique(eots)


@pytest.mark.parametrize("eid", IDS)
def test_token_expert_finds_both_kinds(eid):
    """`token_expert(env, kind)` returns the transcript-only expert under
    its own source name and the scripted one by default; an unknown kind is
    a one-line error. Catches a registration that drops `transcript_expert`
    or hands back the scripted expert for both kinds."""
    env = _env(eid)
    _, s_src, _ = envs.token_expert(env)
    _, t_src, t_desc = envs.token_expert(env, "transcript")
    assert t_src.endswith("-transcript") and s_src != t_src and "transcript" in t_desc
    with pytest.raises(ValueError, match="not one of"):
        envs.token_expert(env, "oracle")


def test_a_task_without_a_transcript_expert_says_how_to_register_one():
    """A task registered with only a scripted expert refuses the kind
    `transcript` in one line naming `transcript_expert=`. Catches a lookup
    that silently falls back to the scripted expert (whose labels read the
    hidden state)."""
    from types import SimpleNamespace

    from jaxil.envs.token_repair import RepairEnv, repair_expert

    eid = "tokens:test-scripted-only"
    envs.register_token_task(eid, lambda **k: RepairEnv(**k), expert=repair_expert)
    env = SimpleNamespace(spec=SimpleNamespace(env_id=eid))
    with pytest.raises(ValueError, match="transcript_expert="):
        envs.token_expert(env, "transcript")


@pytest.mark.slow
@pytest.mark.parametrize("eid", IDS)
def test_transcript_expert_passes_the_task_check(eid):
    """Over 512 fresh episodes the transcript-only expert wins ≥ 0.95, and
    [check_token_task] (expert, random and takeover episodes, 900 in all)
    finds no problem: legal tokens, no turn repeated 3 times, takeover ≥ 0.9.
    Catches what the cheap default run's ~120 episodes per kind could miss."""
    env = _env(eid)
    expert = envs.token_expert(env, "transcript")[0]
    eps = jax.jit(lambda k: envs.run_episodes(env, expert, None, k, 512))(jax.random.PRNGKey(11))
    assert np.asarray(eps.won).mean() >= 0.95
    report = check_token_task(env, expert, episodes=900, seed=5)
    print(report)
    assert report.ok, report


class _Called(Exception):
    pass


@pytest.mark.parametrize("kind", ["scripted", "transcript"])
def test_lm_interactive_expert_flag_passes_that_kind(monkeypatch, kind):
    """`jaxil lm interactive ... --expert transcript` hands the learner the
    transcript-only expert (its carry is built from the context) under the
    name `transcript`; `--expert scripted` the scripted one. Catches a
    flag that is parsed but still looks up the scripted expert, or a run
    recorded under the wrong expert name."""
    from jaxil.algorithms.lm import interactive as TI
    from jaxil.cli.main import main
    from jaxil.envs.token_transcript import TranscriptCarry

    seen = {}

    def fake_run(env, expert, expert_params, regimes, **kw):
        seen.update(expert=expert, name=kw.get("expert_name"))
        raise _Called

    monkeypatch.setattr(TI, "run", fake_run)
    with pytest.raises(_Called):
        main(["lm", "interactive", "bc", "--env", "tokens:arith", "--budget", "2000",
              "--expert", kind, "--no-progress"])
    carry = seen["expert"].init(jax.random.PRNGKey(0), 1)
    assert seen["name"] == kind
    assert isinstance(carry, TranscriptCarry) == (kind == "transcript")
