"""The check of a token task and its expert, before any learner sees them.

[check_token_task][jaxil.algorithms.lm.task_check.check_token_task] plays one
compiled batch of episodes of three kinds, drawn per episode:

- **expert**: the expert alone. It must win (`min_expert_success`), type
  only legal tokens, and never play one turn `repeat_limit` times (the
  interactive learners' repetition filter would reject its episodes).
- **random**: the uniform legal random policy. It must almost never win
  (`max_random_success`): a task that random typing solves teaches nothing.
- **takeover**: the random policy types `1 … switch_hi` tokens (often
  stopping inside a command; never a command of `final_words`, after which
  nobody could win), then the expert continues from that state.
  It must still win (`min_takeover_success`): OEC, DAgger and the entropy
  gate hand a student's episode to the expert at any token.

It also checks the contract the learners read: `<eot>` / `<wait>`
([token_specials][jaxil.envs.tokens.token_specials]), `<pad>` never legal,
and no episode putting more than `env.max_context` tokens into an agent's
context. The report lists every failed check in one line each.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.algorithms.lm.corrections import max_turn_repeats
from jaxil.envs.core import MultiAgentEnv
from jaxil.envs.policies import Policy, as_policy, uniform_available
from jaxil.envs.rollout import run_episodes
from jaxil.envs.tokens import token_specials

EXPERT, RANDOM, TAKEOVER = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class TokenTaskReport:
    """What [check_token_task][jaxil.algorithms.lm.task_check.check_token_task] found.

    Attributes:
      env_id: the task.
      episodes: episodes played in all (about a third of each kind).
      expert_success: the expert's win rate.
      random_success: the uniform legal random policy's win rate.
      takeover_success: the win rate when the expert takes over after
        `1 … switch_hi` random tokens (over the episodes still running at
        the switch).
      takeover_episodes: how many episodes that rate is over.
      mid_command: the share of those whose switch fell inside a command
        (NaN when the environment does not expose its partial command).
      illegal_expert_tokens: tokens the expert proposed on steps it acted
        that were not legal there.
      max_expert_repeats: the most times the expert played one turn in an
        episode (the repetition filter's count).
      max_context_used: the most tokens one agent's context received in an
        episode (at most `env.max_context`).
      problems: one line per failed check; empty when the task passes.
    """

    env_id: str
    episodes: int
    expert_success: float
    random_success: float
    takeover_success: float
    takeover_episodes: int
    mid_command: float
    illegal_expert_tokens: int
    max_expert_repeats: int
    max_context_used: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No check failed."""
        return not self.problems

    def __str__(self) -> str:
        lines = [f"{self.env_id}: expert {self.expert_success:.3f}, random "
                 f"{self.random_success:.3f}, takeover {self.takeover_success:.3f} "
                 f"(over {self.takeover_episodes} episodes, {self.mid_command:.0%} mid-command); "
                 f"context {self.max_context_used} tokens, expert repeats "
                 f"{self.max_expert_repeats}"]
        lines += [f"  problem: {p}" for p in self.problems] or ["  all checks pass"]
        return "\n".join(lines)


class _Shared(NamedTuple):
    kind: jax.Array
    switch: jax.Array
    t: jax.Array
    proposal: jax.Array  # [N] the expert's token
    expert_acted: jax.Array
    inner: Any  # the expert's own carry


def _shared_control(expert: Policy, switch_hi: int, final: tuple[int, ...]) -> Policy:
    """Per episode one kind (expert, random, takeover at a random step);
    the expert acts on every step's observation, played or not."""

    def init(key, n):
        k_kind, k_switch, k_x = jax.random.split(key, 3)
        return _Shared(kind=jax.random.randint(k_kind, (), 0, 3),
                       switch=jax.random.randint(k_switch, (), 1, switch_hi + 1),
                       t=jnp.int32(0), proposal=jnp.zeros((n,), jnp.int32),
                       expert_acted=jnp.bool_(False), inner=expert.init(k_x, n))

    def act(params, obs, avail, key, c: _Shared):
        k_x, k_r = jax.random.split(key)
        a_x, inner = expert.act(params, obs, avail, k_x, c.inner)
        a_x = jnp.asarray(a_x, jnp.int32)
        now = (c.kind == EXPERT) | ((c.kind == TAKEOVER) & (c.t >= c.switch))
        banned = jnp.isin(jnp.arange(avail.shape[-1]), jnp.asarray(final, jnp.int32))
        student = avail & ~(banned & (c.kind == TAKEOVER))
        student = jnp.where(student.any(-1, keepdims=True), student, avail)
        a = jnp.where(now, a_x, uniform_available(k_r, student))
        return a, _Shared(c.kind, c.switch, c.t + 1, a_x, now, inner)

    return Policy(init=init, act=act)


@functools.partial(jax.jit, static_argnums=(0, 1, 4, 5, 6))
def _play(env, expert, params, key, num_episodes, switch_hi, final):
    return run_episodes(env, _shared_control(as_policy(expert), switch_hi, final), params, key,
                        num_episodes, record_carry=lambda c: c._replace(inner=None))


def check_token_task(env: MultiAgentEnv, expert: Any, params: Any = None, *,
                     episodes: int = 600, seed: int = 0, min_expert_success: float = 0.95,
                     max_random_success: float = 0.1, min_takeover_success: float = 0.9,
                     switch_hi: int = 12, repeat_limit: int = 3,
                     final_words: tuple[str, ...] = ("SUBMIT",)) -> TokenTaskReport:
    """Check a token task and its expert (see the module docstring).

    Args:
      env: the token environment (e.g. `envs.make("tokens:nav")`).
      expert: its expert policy (e.g. `envs.token_expert(env)[0]`).
      params: the expert's parameters (None for a scripted expert).
      episodes: episodes in all, about a third of each kind.
      seed: the key of the instances and of the random tokens.
      min_expert_success: the least win rate of the expert alone.
      max_random_success: the most win rate of the random policy.
      min_takeover_success: the least win rate after a takeover.
      switch_hi: the random prefix of a takeover is `1 … switch_hi` tokens.
      repeat_limit: the expert may play one turn at most `repeat_limit - 1`
        times in an episode (the learners' default filter is 3).
      final_words: the commands that end an episode, which the random
        prefix of a takeover never types (words the task's vocabulary lacks
        are ignored).

    Returns:
      A [TokenTaskReport][jaxil.algorithms.lm.task_check.TokenTaskReport]; `ok` is
      whether every check passed, `problems` says which did not.

    Raises:
      ValueError: `env` is not a token environment (no `token_width`,
        `max_context`, `<eot>` or `<wait>`), or a bad setting.
    """
    if episodes < 3 or switch_hi < 1:
        raise ValueError(f"episodes must be >= 3 and switch_hi >= 1, got {episodes} and "
                         f"{switch_hi}")
    missing = [a for a in ("token_width", "max_context") if not hasattr(env, a)]
    if missing or not env.spec.discrete:
        raise ValueError(f"{env.spec.env_id} is not a token environment (discrete actions and "
                         f"token_width / max_context); missing: {missing}")
    eot, wait = token_specials(env)
    spec, K = env.spec, env.token_width
    vocab = getattr(env, "vocab", None)
    final = tuple(sorted(vocab[w] for w in final_words if vocab is not None and w in vocab))
    eps = jax.device_get(_play(env, expert, params, jax.random.PRNGKey(seed), episodes,
                               switch_hi, final))
    kind = np.asarray(eps.carry.kind[:, 0])
    won = np.asarray(eps.won, bool)
    mask = np.asarray(eps.mask, bool)
    avail = np.asarray(eps.avail_actions[:, :-1], bool)  # what each step's token came from
    acted = np.asarray(eps.carry.expert_acted, bool) & mask
    proposal = np.asarray(eps.carry.proposal)
    legal = np.take_along_axis(avail, proposal[..., None], -1)[..., 0]
    illegal = int((~legal & acted[..., None]).sum())

    ex, rd, tk = kind == EXPERT, kind == RANDOM, kind == TAKEOVER
    reached = tk & acted.any(axis=1)  # still running at the switch
    rate = lambda sel: float(won[sel].mean()) if sel.any() else float("nan")
    mid = float("nan")
    if hasattr(env, "privileged") and reached.any():
        first = np.argmax(acted, axis=1)
        obs = np.asarray(eps.obs)[np.arange(len(first)), first]
        cmd_len = np.asarray(env.privileged(obs).cmd_len)  # [E, N]
        mid = float((cmd_len.max(-1) > 0)[reached].mean())

    after = jnp.round(jnp.asarray(eps.obs[:, 1:, :, :K])).astype(jnp.int32)
    repeats = jax.vmap(functools.partial(max_turn_repeats, eot=eot, wait=wait),
                       in_axes=(0, 0, 0, 0, None))(
        after, jnp.asarray(eps.actions), jnp.asarray(avail), jnp.asarray(mask),
        getattr(env, "cmd_width", 7) + 1)
    repeats = int(np.asarray(repeats)[ex].max()) if ex.any() else 0
    toks = np.round(np.asarray(eps.obs)[..., :K]).astype(np.int64)  # [E, T+1, N, K]
    steps = np.concatenate([np.ones((len(won), 1), bool), mask], axis=1)[..., None, None]
    context = int(((toks != 0) & steps).sum(axis=(1, 3)).max())

    problems = []
    if avail[..., 0][mask].any():
        problems.append("<pad> (token 0) is legal at some step; it must never be")
    if illegal:
        problems.append(f"the expert proposed {illegal} illegal tokens (the rollout replaces "
                        "them by another token, so it plays something else)")
    e_rate, r_rate, t_rate = rate(ex), rate(rd), rate(reached)
    if not e_rate >= min_expert_success:
        problems.append(f"the expert wins {e_rate:.3f} of its episodes, below "
                        f"{min_expert_success}")
    if not r_rate <= max_random_success:
        problems.append(f"random legal tokens win {r_rate:.3f}, above {max_random_success}: "
                        "the task is solved without the expert's skill")
    if not t_rate >= min_takeover_success:
        problems.append(f"taking over after 1 … {switch_hi} random tokens the expert wins "
                        f"{t_rate:.3f}, below {min_takeover_success}: it must continue from "
                        "any state, mid-command included")
    if repeats >= repeat_limit:
        problems.append(f"the expert plays one turn {repeats} times in an episode; the "
                        f"learners' repetition filter (limit {repeat_limit}) would reject it")
    if context > env.max_context:
        problems.append(f"an agent's context got {context} tokens, more than max_context="
                        f"{env.max_context}")
    return TokenTaskReport(
        env_id=spec.env_id, episodes=int(len(won)), expert_success=e_rate,
        random_success=r_rate, takeover_success=t_rate, takeover_episodes=int(reached.sum()),
        mid_command=mid, illegal_expert_tokens=illegal, max_expert_repeats=repeats,
        max_context_used=context, problems=tuple(problems))
