"""A user's own token task, written outside `envs/` against the public API:
`tokens:nav`, with its own words and its own expert (the example of the
docs page "Custom token tasks").

The agent stands at a hidden position on a line of `size` cells and must
stop on a hidden target: `LOOK` answers the direction and distance
(`RIGHT 5`, `LEFT 2`, `HERE 0`), `GO RIGHT 5` moves (clipped to the line),
`STOP` ends the episode, won when the agent stands on the target.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxil import envs
from jaxil.envs.policies import Policy, stateless_carry
from jaxil.envs.tokens import (PAD, VOCAB, Command, Outcome, TokenEnv, number, numbers,
                               random_ints, value_of)

NAV_VOCAB = VOCAB.extend(["nav", "LOOK", "GO", "STOP", "LEFT", "RIGHT", "HERE"])
LOOK, GO, STOP = NAV_VOCAB["LOOK"], NAV_VOCAB["GO"], NAV_VOCAB["STOP"]
LEFT, RIGHT, HERE = NAV_VOCAB["LEFT"], NAV_VOCAB["RIGHT"], NAV_VOCAB["HERE"]


@struct.dataclass
class NavTask:
    pos: jax.Array  # [] int32 where the agent stands
    target: jax.Array  # [] int32 where it must stop
    looked: jax.Array  # [] bool a LOOK was answered since the last GO


class NavEnv(TokenEnv):
    """`tokens:nav` (see the module docstring)."""

    vocab = NAV_VOCAB

    def __init__(self, size: int = 16, max_turns: int = 10, env_id: str = "tokens:nav"):
        if not 2 <= size <= 32:
            raise ValueError(f"size must be in [2, 32], got {size}")
        self.size = size
        super().__init__(
            env_id, num_agents=1, prompt_len=1,
            commands=(Command("LOOK", answer=2),
                      Command("GO", ((LEFT, RIGHT), numbers(1, size)), answer=1),
                      Command("STOP", answer=1)),
            num_features=3, max_turns=max_turns, score_weight=0.1)

    def _generate(self, key):
        r = random_ints(key, (2,), self.size * (self.size - 1))
        pos = r[0] % self.size
        target = (pos + 1 + r[1] % (self.size - 1)) % self.size  # never the start
        return (NavTask(pos, target, jnp.bool_(False)),
                jnp.full((1, 1), NAV_VOCAB["nav"], jnp.int32))

    def _features(self, task):
        return jnp.stack([task.pos, task.target, task.looked.astype(jnp.int32)])[None]

    def _execute(self, task, cmd, cmd_len, ended):
        c, e = cmd[0], ended[0]
        look, go, stop = e & (c[0] == LOOK), e & (c[0] == GO), e & (c[0] == STOP)
        step = jnp.where(c[1] == RIGHT, 1, -1) * value_of(c[2])
        pos = jnp.where(go, jnp.clip(task.pos + step, 0, self.size - 1), task.pos)
        d = task.target - task.pos
        seen = jnp.stack([jnp.where(d > 0, RIGHT, jnp.where(d < 0, LEFT, HERE)),
                          number(jnp.abs(d))])
        won = pos == task.target
        answer = jnp.where(look, seen, jnp.where(
            go, jnp.array([NAV_VOCAB["OK"], PAD]),
            jnp.stack([jnp.where(won, NAV_VOCAB["PASS"], NAV_VOCAB["FAIL"]), PAD])))
        looked = jnp.where(go, False, task.looked | look)
        score = 1.0 - jnp.abs(task.target - pos) / (self.size - 1)
        return Outcome(task=NavTask(pos, task.target, looked), answer=answer[None],
                       done=stop, won=won, score=score)


def nav_expert(env: NavEnv) -> Policy:
    """`LOOK`, then `GO` where the answer says, `LOOK` again, `STOP` on the
    target. It looks before every move, so each of its tokens follows from
    the transcript a student sees. Taking over mid-command it completes the
    command (`GO` gets the right direction and distance, or 1 after a wrong
    direction; a complete command gets `<eot>`)."""
    eot = env.eot_token

    def one(cmd, cmd_len, f):
        pos, target, looked = f[0], f[1], f[2] > 0
        d = target - pos
        start = jnp.where(~looked, LOOK, jnp.where(d == 0, STOP, GO))
        toward = jnp.where(d >= 0, RIGHT, LEFT)
        right_way = (cmd[1] == RIGHT) == (d >= 0)
        dist = number(jnp.where(right_way, jnp.maximum(jnp.abs(d), 1), 1))
        is_go = cmd[0] == GO
        return jnp.select([cmd_len == 0, is_go & (cmd_len == 1), is_go & (cmd_len == 2)],
                          [start, toward, dist], eot).astype(jnp.int32)

    def act(params, obs, avail, key, carry):
        p = env.privileged(obs)
        return jax.vmap(one)(p.cmd, p.cmd_len, p.features), carry

    return Policy(init=stateless_carry, act=act)


def make_nav(**knobs) -> NavEnv:
    """The task as a `module:callable` id names it (`--env mytasks:make_nav`)."""
    return NavEnv(**knobs)


envs.register_token_task("tokens:nav", NavEnv, expert=nav_expert, source="nav-look-go",
                         description="LOOK, GO where the answer says, LOOK, STOP on the target")
