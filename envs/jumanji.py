"""Jumanji adapters: LevelBasedForaging, RobotWarehouse, Connector, Cleaner.

Ids: `jumanji:LevelBasedForaging-v0`, `jumanji:RobotWarehouse-v0`,
`jumanji:Connector-v3`, `jumanji:Cleaner-v0`. The defaults are Jumanji's
(`jumanji.make(name)`); keyword overrides rebuild the upstream generator,
e.g. `envs.make("jumanji:LevelBasedForaging-v0", num_agents=3, num_food=3)`.
Every id accepts `time_limit` (alias `max_steps`); the other keywords are
listed per environment below, and an unknown keyword raises `TypeError`
naming the accepted ones.

The adapters call the plain upstream `reset`/`step` (Jumanji's `step` never
resets; auto-reset is [`envs.AutoReset`][jaxil.envs.wrappers.AutoReset]).
Jumanji has no global state, so each adapter defines one from the upstream
`State`. Integer quantities (coordinates, levels) are kept as they are, cast to
float32. Coordinates are (row, column).

LevelBasedForaging-v0 (N=2 agents, F=2 food, 8x8 grid, time limit 100)
  keywords: `num_agents, num_food, grid_size, fov` (defaults to
  `grid_size`: full view), `max_agent_level, force_coop, grid_observation,
  normalize_reward, penalty`.

  - obs `[N, 3 (F + N)]`: Jumanji's vector view: (row, col, level) of each
    food, then of the agent itself, then of the other agents in index order;
    rows/cols are relative to the agent's field-of-view window, and an item
    out of view (or eaten food) reads (-1, -1, 0). With
    `grid_observation=True`: the `[3, 2 fov + 1, 2 fov + 1]` grid view
    (agent levels, food levels, free cells) flattened.
  - global state `[4 (N + F)]`: (row, col, level, loading) per agent, then
    (row, col, level, eaten) per food.
  - actions (6): no-op, up, down, left, right, load; no-op is always legal.
  - team reward: the SUM of the per-agent rewards. Upstream splits each
    food's value among the agents that loaded it (by level) and normalises so
    that eating all food is worth exactly 1 in total: the sum is the team's
    share of food collected, and a cleared episode returns 1 (less penalties).
  - done: every food item eaten (= won); truncated: time limit.
  - [`lbf_expert`][jaxil.envs.jumanji.lbf_expert] is a scripted expert for the
    default full view.

RobotWarehouse-v0 (N=4 robots, 20x10 floor, S=80 shelves, time limit 500)
  keywords: `num_agents, shelf_rows, shelf_columns, column_height,
  sensor_range, request_queue_size`.

  - obs `[N, 8 + 5 ((2r+1)^2 - 1) + 2 (2r+1)^2]` (66 for sensor range r=1):
    Jumanji's per-robot vector (own position, carrying flag, direction one-hot,
    on-highway flag; robots and shelves, requested or not, in the sensor
    window).
  - global state `[7 N + 3 S]`: per robot (row, col, direction one-hot (4),
    carrying), then per shelf (row, col, requested).
  - actions (5): no-op, forward, left, right, toggle load; no-op is always
    legal.
  - team reward: upstream's reward is already one shared scalar (+1 per
    requested shelf delivered this step); used as is.
  - done: two robots collided (upstream's only termination besides the
    horizon); truncated: time limit. Upstream marks the horizon as a
    termination (discount 0); here it is a truncation, as it is a time limit.
  - no win condition (`has_win=False`).

Connector-v3 (N=10 agents, 10x10 grid, time limit 50)
  keywords: `num_agents, grid_size, connected_reward, timestep_reward`.

  - obs `[N, G^2 + 5 N]`: the path layer of the grid (1 where any agent's
    trail lies), then (head row, head col, target row, target col, connected)
    of the agent itself, then of the other agents in index order. Connector is
    fully observed upstream (one grid for everyone); this is that grid,
    re-encoded egocentrically and compactly.
  - global state `[G^2 + 5 N]`: the path layer, then the same five numbers
    for every agent in index order. Path ownership is left out: it does not
    affect the dynamics (any trail blocks everyone).
  - actions (5): no-op, up, right, down, left; no-op is always legal.
  - team reward: the SUM of the per-agent rewards (+1 when an agent connects,
    -0.03 per step for each agent not yet connected), as Jumanji's own
    `SharedDenseRewardFn` does; a perfect episode returns about N.
  - done: every agent is connected or blocked; truncated: time limit;
    won: every agent connected.

Cleaner-v0 (N=3 agents, 10x10 maze, time limit 100)
  keywords: `num_agents, grid_size` (or `num_rows`/`num_cols`, which
  must be equal: upstream's action mask assumes a square maze),
  `penalty_per_timestep`.

  - obs `[N, R C + 2 N]`: the maze, one number per tile (+1 dirty, 0 clean,
    -1 wall), then the agent's own (row, col), then the other agents' in index
    order. Upstream shows everyone the whole maze.
  - global state `[R C + 2 N]`: the same tile layer, then every agent's
    (row, col) in index order.
  - actions (4): up, right, down, left; there is no no-op, so an illegal
    action is replaced by the agent's first legal one (`noop_action=None`).
    Upstream ends the episode on an illegal action; through the adapter that
    never happens.
  - team reward: upstream's shared scalar (tiles cleaned this step minus
    `penalty_per_timestep`), used as is.
  - done: every tile clean (= won); truncated: time limit. As for
    RobotWarehouse, upstream's horizon termination becomes a truncation.
"""

from __future__ import annotations

import abc
import functools
import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .core import DiscreteActions, EnvSpec, MultiAgentEnv, Step
from .policies import ScriptedExpertUnavailable, uniform_available
from .registry import register

try:
    from jumanji.environments import Cleaner, Connector, LevelBasedForaging, RobotWarehouse
    from jumanji.environments.routing.cleaner.constants import DIRTY as CLEANER_DIRTY
    from jumanji.environments.routing.cleaner.constants import WALL as CLEANER_WALL
    from jumanji.environments.routing.cleaner.generator import (
        RandomGenerator as CleanerGenerator,
    )
    from jumanji.environments.routing.connector.generator import RandomWalkGenerator
    from jumanji.environments.routing.connector.reward import DenseRewardFn
    from jumanji.environments.routing.connector.utils import is_path as connector_is_path
    from jumanji.environments.routing.lbf.generator import RandomGenerator as LBFGenerator
    from jumanji.environments.routing.robot_warehouse.generator import (
        RandomGenerator as RwareGenerator,
    )
    from jumanji.environments.routing.robot_warehouse.utils import is_collision
except ImportError as e:  # pragma: no cover - jumanji is a core dependency
    raise ImportError("the Jumanji adapters need jumanji: pip install 'jumanji>=1.1.2'") from e


def _split_kwargs(env_id: str, kwargs: dict, accepted: dict[str, Any]) -> dict[str, Any]:
    """Fill `accepted` defaults from `kwargs`; reject unknown keywords.

    `max_steps` is accepted everywhere as an alias of `time_limit`.
    """
    kwargs = dict(kwargs)
    if "max_steps" in kwargs:
        if "time_limit" in kwargs:
            raise TypeError(f"{env_id}: give time_limit or its alias max_steps, not both")
        kwargs["time_limit"] = kwargs.pop("max_steps")
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        names = ", ".join(sorted(set(accepted) | {"max_steps"}))
        raise TypeError(
            f"{env_id} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"accepted keywords: {names}"
        )
    cfg = {**accepted, **kwargs}
    limit = cfg.get("time_limit")
    if limit is not None and (not isinstance(limit, (int, np.integer)) or limit < 1):
        raise ValueError(f"{env_id}: time_limit must be a positive integer, got {limit!r}")
    return cfg


def _build(env_id: str, cfg: dict, make: Callable[[], Any]) -> Any:
    """Run an upstream constructor, turning its bare `assert`s into ValueErrors."""
    try:
        return make()
    except AssertionError as e:
        raise ValueError(f"invalid {env_id} configuration {cfg}: {e}") from e


def _self_first(n: int) -> np.ndarray:
    """`[N, N]` static index table: row i is `[i, 0, .., i-1, i+1, .., N-1]`."""
    return np.array([[i] + [j for j in range(n) if j != i] for i in range(n)], np.int32)


def _per_agent_obs(shared: jax.Array, own: jax.Array) -> jax.Array:
    """`[N, S + P]` rows `[shared, own[i]]` from `shared [S]` and `own [N, P]`.

    Written as two slice updates of one buffer rather than a concatenate,
    which XLA:CPU would otherwise materialise operand by operand (about a
    third more memory traffic on Connector's `[10, 150]` observation).
    """
    n, s = own.shape[0], shared.shape[0]
    obs = jnp.zeros((n, s + own.shape[1]), jnp.float32)
    return obs.at[:, :s].set(shared[None, :]).at[:, s:].set(own)


class JumanjiEnv(MultiAgentEnv, abc.ABC):
    """Base of the Jumanji adapters: holds `raw` (the upstream environment) and
    turns its `(state, timestep)` into a [`Step`][jaxil.envs.core.Step] via
    `_out`."""

    raw: Any
    # Jumanji steps are deterministic given the state (RobotWarehouse keeps
    # its own key in the state), so `step` does not split a key for them.
    stochastic_step = False

    @abc.abstractmethod
    def _out(self, state: Any, ts: Any, first: bool) -> Step:
        """Upstream `(state, timestep)` -> [`Step`][jaxil.envs.core.Step];
        `first` on reset (reward 0, not done), else the transition's reward and
        ending flags."""

    def _reset(self, key: jax.Array) -> Step:
        state, ts = self.raw.reset(key)
        return self._out(state, ts, first=True)

    def _step(self, key: jax.Array, inner: Any, actions: jax.Array) -> Step:
        state, ts = self.raw.step(inner, actions)
        return self._out(state, ts, first=False)


# -- LevelBasedForaging ---------------------------------------------------------------


class LevelBasedForagingEnv(JumanjiEnv):
    """Level-Based Foraging; see the module docstring for the encoding."""

    ENV_ID = "jumanji:LevelBasedForaging-v0"

    def __init__(self, **kwargs):
        cfg = _split_kwargs(
            self.ENV_ID,
            kwargs,
            dict(
                num_agents=2,
                num_food=2,
                grid_size=8,
                fov=None,
                max_agent_level=2,
                force_coop=True,
                time_limit=100,
                grid_observation=False,
                normalize_reward=True,
                penalty=0.0,
            ),
        )
        if cfg["fov"] is None:
            cfg["fov"] = cfg["grid_size"]

        def make():
            gen = LBFGenerator(
                grid_size=cfg["grid_size"],
                num_agents=cfg["num_agents"],
                num_food=cfg["num_food"],
                fov=cfg["fov"],
                max_agent_level=cfg["max_agent_level"],
                force_coop=cfg["force_coop"],
            )
            return LevelBasedForaging(
                generator=gen,
                time_limit=cfg["time_limit"],
                grid_observation=cfg["grid_observation"],
                normalize_reward=cfg["normalize_reward"],
                penalty=cfg["penalty"],
            )

        self.raw = _build(self.ENV_ID, cfg, make)
        self.config = cfg
        n, f = self.raw.num_agents, self.raw.num_food
        view = self.raw.observation_spec.agents_view.shape[1:]
        self.spec = EnvSpec(
            env_id=self.ENV_ID,
            num_agents=n,
            obs_dim=int(np.prod(view)),
            state_dim=4 * (n + f),
            action=DiscreteActions(6, noop_action=0),
            max_steps=int(self.raw.time_limit),
            has_win=True,
        )

    def _out(self, state, ts, first):
        agents, food = state.agents, state.food_items
        n = self.spec.num_agents
        per_agent = jnp.column_stack([agents.position, agents.level, agents.loading])
        per_food = jnp.column_stack([food.position, food.level, food.eaten])
        gs = jnp.concatenate([per_agent.reshape(-1), per_food.reshape(-1)]).astype(jnp.float32)
        obs = ts.observation
        all_eaten = jnp.all(food.eaten)
        if first:
            return Step(state, obs.agents_view.reshape(n, -1), gs, obs.action_mask)
        return Step(
            inner=state,
            obs=obs.agents_view.reshape(n, -1),
            global_state=gs,
            avail_actions=obs.action_mask,
            reward=jnp.sum(ts.reward),
            done=all_eaten,
            truncated=state.step_count >= self.raw.time_limit,
            won=all_eaten,
        )


def lbf_expert(env: MultiAgentEnv, jitter: float = 0.05) -> Callable:
    """Scripted expert for Jumanji LevelBasedForaging (full-view vector obs).

    With `fov = grid_size` the vector view holds absolute (row, col, level)
    of every food (eaten: level 0), of the agent itself, then of the other
    agents in index order, so every agent sees the same layout and makes the
    same team decisions:

    1. target: among remaining food whose level the whole team can lift, the
       one with the smallest summed Manhattan distance to all agents (lowest
       index on ties) — with `force_coop` every food needs everyone;
    2. cells: the agents take distinct free cells next to the target food,
       the assignment minimising total Manhattan distance (exhaustive for at
       most 4 agents, greedy in index order otherwise);
    3. move: shortest path (BFS over the grid, food and other agents are
       walls) to the own cell, ties broken at random; once there, `load`
       every step until the food is gone (it goes when the loading levels
       add up).

    With probability `jitter` an agent takes a random legal action instead,
    which breaks the rare livelock of two agents bumping into the same cell.
    Needs the default full view (`fov == grid_size`) and the vector
    observation; otherwise it raises
    [`envs.policies.ScriptedExpertUnavailable`][jaxil.envs.policies.ScriptedExpertUnavailable].
    """
    cfg = getattr(env, "config", None)
    if cfg is None or env.spec.env_id != "jumanji:LevelBasedForaging-v0":
        raise TypeError(f"lbf_expert needs a LevelBasedForaging environment, got {env!r}")
    if cfg["grid_observation"] or cfg["fov"] != cfg["grid_size"]:
        raise ScriptedExpertUnavailable(
            "the scripted LevelBasedForaging expert needs the full-view vector observation "
            f"(fov == grid_size, grid_observation=False), got fov={cfg['fov']}, "
            f"grid_size={cfg['grid_size']}, grid_observation={cfg['grid_observation']}; "
            f"train a teacher instead: jaxil teach {env.spec.env_id}"
        )
    G, N, F = int(cfg["grid_size"]), env.spec.num_agents, int(cfg["num_food"])
    LOAD, BIG = 5, 10_000
    moves = jnp.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], jnp.int32)  # noop,U,D,L,R
    sides = moves[1:]
    cell_maps = (
        jnp.array(list(itertools.permutations(range(4), N)), jnp.int32) if N <= 4 else None
    )

    def manhattan(a, b):
        return jnp.abs(a - b).sum(-1)

    def bfs(target, blocked):  # distances [G, G] to target over free cells
        dist = jnp.full((G, G), BIG, jnp.int32).at[target[0], target[1]].set(0)

        def relax(_, d):
            pad = jnp.pad(d, 1, constant_values=BIG)
            nb = jnp.minimum(
                jnp.minimum(pad[:-2, 1:-1], pad[2:, 1:-1]), jnp.minimum(pad[1:-1, :-2], pad[1:-1, 2:])
            )
            return jnp.where(blocked, BIG, jnp.minimum(d, nb + 1))

        return jax.lax.fori_loop(0, G * G, relax, dist)

    def agent_act(i, o, avail, key):
        v = jnp.round(o).astype(jnp.int32).reshape(F + N, 3)
        food, f_lvl = v[:F, :2], v[:F, 2]
        me = v[F, :2]
        others, o_lvl = v[F + 1:, :2], v[F + 1:, 2]
        j = jnp.arange(N)
        idx = jnp.clip(j - (j > i), 0, max(N - 2, 0))
        if N > 1:
            pos = jnp.where((j == i)[:, None], me, others[idx])
            lvl = jnp.where(j == i, v[F, 2], o_lvl[idx])
        else:
            pos, lvl = me[None], v[F, 2][None]
        seen = lvl > 0
        present = f_lvl > 0
        loadable = present & (f_lvl <= jnp.sum(jnp.where(seen, lvl, 0)))
        team_cost = jnp.sum(jnp.where(seen[None], manhattan(food[:, None], pos[None]), 0), -1)
        f = jnp.argmin(jnp.where(loadable, team_cost, BIG))
        any_food = jnp.any(loadable)
        cells = food[f] + sides  # [4, 2]
        in_grid = jnp.all((cells >= 0) & (cells < G), -1)
        on_food = jnp.any(jnp.all(cells[:, None] == food[None], -1) & present[None], -1)
        cell_ok = in_grid & ~on_food
        cost = jnp.where(cell_ok[None] & seen[:, None], manhattan(pos[:, None], cells[None]), BIG)
        if cell_maps is not None:
            total = cost[jnp.arange(N)[None], cell_maps].sum(-1)
            mine = cell_maps[jnp.argmin(total)][i]
        else:
            taken = jnp.zeros((4,), bool)
            mine = jnp.int32(0)
            for k in range(N):
                c = jnp.argmin(jnp.where(taken, BIG + 1, cost[k]))
                mine = jnp.where(k == i, c, mine)
                taken = taken.at[c].set(True)
        valid = cell_ok[mine]
        target = jnp.clip(cells[mine], 0, G - 1)
        grid = jnp.zeros((G, G), bool)
        grid = grid.at[food[:, 0], food[:, 1]].max(present, mode="drop")
        other = (j != i) & seen
        grid = grid.at[pos[:, 0], pos[:, 1]].max(other, mode="drop")
        grid = grid.at[target[0], target[1]].set(False)
        dist = bfs(target, grid)
        nxt = me[None] + moves[1:]
        nxt_ok = jnp.all((nxt >= 0) & (nxt < G), -1)
        d_next = jnp.where(nxt_ok, dist[jnp.clip(nxt[:, 0], 0, G - 1), jnp.clip(nxt[:, 1], 0, G - 1)], BIG)
        k_tie, k_jit, k_rand = jax.random.split(key, 3)
        score = d_next + 0.5 * jax.random.uniform(k_tie, (4,))
        improving = avail[1:5] & (d_next < dist[me[0], me[1]])
        best = 1 + jnp.argmin(jnp.where(improving, score, BIG))
        rand = uniform_available(k_rand, avail)
        arrived = jnp.all(me == target)
        a = jnp.where(arrived, LOAD, jnp.where(jnp.any(improving), best, rand))
        a = jnp.where(any_food & valid, a, 0)
        a = jnp.where(jax.random.uniform(k_jit) < jitter, rand, a)
        return a.astype(jnp.int32)

    def act(params, obs, avail, key):
        return jax.vmap(agent_act)(jnp.arange(N), obs, avail, jax.random.split(key, N))

    return act


# -- RobotWarehouse -------------------------------------------------------------------


class RobotWarehouseEnv(JumanjiEnv):
    """Robotic warehouse (RWARE); see the module docstring for the encoding."""

    ENV_ID = "jumanji:RobotWarehouse-v0"

    def __init__(self, **kwargs):
        cfg = _split_kwargs(
            self.ENV_ID,
            kwargs,
            dict(
                num_agents=4,
                shelf_rows=2,
                shelf_columns=3,
                column_height=8,
                sensor_range=1,
                request_queue_size=8,
                time_limit=500,
            ),
        )

        def make():
            gen = RwareGenerator(
                shelf_rows=cfg["shelf_rows"],
                shelf_columns=cfg["shelf_columns"],
                column_height=cfg["column_height"],
                num_agents=cfg["num_agents"],
                sensor_range=cfg["sensor_range"],
                request_queue_size=cfg["request_queue_size"],
            )
            return RobotWarehouse(generator=gen, time_limit=cfg["time_limit"])

        self.raw = _build(self.ENV_ID, cfg, make)
        num_shelves = int(self.raw.shelf_ids.shape[0])
        if not 0 < cfg["request_queue_size"] <= num_shelves:
            raise ValueError(
                f"{self.ENV_ID}: request_queue_size must be in [1, {num_shelves}] (the number "
                f"of shelves), got {cfg['request_queue_size']}"
            )
        self.config = cfg
        n = self.raw.num_agents
        self.spec = EnvSpec(
            env_id=self.ENV_ID,
            num_agents=n,
            obs_dim=int(self.raw.num_obs_features),
            state_dim=7 * n + 3 * num_shelves,
            action=DiscreteActions(5, noop_action=0),
            max_steps=int(self.raw.time_limit),
            has_win=False,
        )

    def _out(self, state, ts, first):
        agents, shelves = state.agents, state.shelves
        robots = jnp.column_stack(
            [
                agents.position.x,
                agents.position.y,
                jax.nn.one_hot(agents.direction, 4, dtype=jnp.int32),
                agents.is_carrying,
            ]
        ).astype(jnp.float32)
        racks = jnp.column_stack(
            [
                shelves.position.x.astype(jnp.float32),
                shelves.position.y.astype(jnp.float32),
                shelves.is_requested.astype(jnp.float32),
            ]
        )
        gs = jnp.concatenate([robots.reshape(-1), racks.reshape(-1)])
        obs = ts.observation
        if first:
            return Step(state, obs.agents_view, gs, obs.action_mask)
        collided = jnp.any(
            jax.vmap(functools.partial(is_collision, state.grid))(agents, self.raw.agent_ids)
        )
        return Step(
            inner=state,
            obs=obs.agents_view,
            global_state=gs,
            avail_actions=obs.action_mask,
            reward=ts.reward,
            done=collided,
            truncated=state.step_count >= self.raw.time_limit,
        )


# -- Connector ------------------------------------------------------------------------


class ConnectorEnv(JumanjiEnv):
    """Connector (route N pairs without crossing); see the module docstring."""

    ENV_ID = "jumanji:Connector-v3"

    def __init__(self, **kwargs):
        cfg = _split_kwargs(
            self.ENV_ID,
            kwargs,
            dict(
                num_agents=10,
                grid_size=10,
                time_limit=50,
                connected_reward=1.0,
                timestep_reward=-0.03,
            ),
        )
        if cfg["num_agents"] < 1 or 2 * cfg["num_agents"] > cfg["grid_size"] ** 2:
            raise ValueError(
                f"{self.ENV_ID}: num_agents={cfg['num_agents']} heads and targets do not fit "
                f"on a {cfg['grid_size']}x{cfg['grid_size']} grid"
            )

        def make():
            return Connector(
                generator=RandomWalkGenerator(
                    grid_size=cfg["grid_size"], num_agents=cfg["num_agents"]
                ),
                reward_fn=DenseRewardFn(
                    connected_reward=cfg["connected_reward"],
                    timestep_reward=cfg["timestep_reward"],
                ),
                time_limit=cfg["time_limit"],
            )

        self.raw = _build(self.ENV_ID, cfg, make)
        self.config = cfg
        n, g = self.raw.num_agents, self.raw.grid_size
        self._order = _self_first(n)
        self.spec = EnvSpec(
            env_id=self.ENV_ID,
            num_agents=n,
            obs_dim=g * g + 5 * n,
            state_dim=g * g + 5 * n,
            action=DiscreteActions(5, noop_action=0),
            max_steps=int(self.raw.time_limit),
            has_win=True,
        )

    def _out(self, state, ts, first):
        agents = state.agents
        n = self.spec.num_agents
        paths = connector_is_path(state.grid).reshape(-1).astype(jnp.float32)
        connected = agents.connected
        ent = jnp.column_stack(
            [agents.position, agents.target, connected.astype(jnp.int32)]
        ).astype(jnp.float32)  # [N, 5]
        gs = jnp.concatenate([paths, ent.reshape(-1)])
        obs = _per_agent_obs(paths, ent[self._order].reshape(n, -1))
        mask = ts.observation.action_mask
        if first:
            return Step(state, obs, gs, mask)
        # Upstream: termination (all connected or blocked) zeroes every
        # agent's discount; truncation keeps 1 for agents still going.
        last = ts.last()
        return Step(
            inner=state,
            obs=obs,
            global_state=gs,
            avail_actions=mask,
            reward=jnp.sum(ts.reward),
            done=last & jnp.all(ts.discount == 0),
            truncated=last,
            won=jnp.all(connected),
        )


# -- Cleaner --------------------------------------------------------------------------


class CleanerEnv(JumanjiEnv):
    """Cleaner (clean every tile of a maze); see the module docstring."""

    ENV_ID = "jumanji:Cleaner-v0"

    def __init__(self, **kwargs):
        cfg = _split_kwargs(
            self.ENV_ID,
            kwargs,
            dict(
                num_agents=3,
                grid_size=None,
                num_rows=None,
                num_cols=None,
                time_limit=None,
                penalty_per_timestep=0.5,
            ),
        )
        size = cfg.pop("grid_size")
        rows = cfg.pop("num_rows")
        cols = cfg.pop("num_cols")
        sizes = {s for s in (size, rows, cols) if s is not None}
        if len(sizes) > 1:
            raise ValueError(
                f"{self.ENV_ID}: grid_size/num_rows/num_cols disagree ({size}, {rows}, {cols}); "
                "Jumanji 1.1.2's Cleaner action mask is only correct for square mazes"
            )
        side = sizes.pop() if sizes else 10
        if side < 2:
            raise ValueError(f"{self.ENV_ID}: the maze must be at least 2x2, got {side}")
        if cfg["num_agents"] < 1:
            raise ValueError(f"{self.ENV_ID}: num_agents must be >= 1, got {cfg['num_agents']}")
        cfg["grid_size"] = side

        def make():
            return Cleaner(
                generator=CleanerGenerator(
                    num_rows=side, num_cols=side, num_agents=cfg["num_agents"]
                ),
                time_limit=cfg["time_limit"],
                penalty_per_timestep=cfg["penalty_per_timestep"],
            )

        self.raw = _build(self.ENV_ID, cfg, make)
        cfg["time_limit"] = self.raw.time_limit
        self.config = cfg
        n = self.raw.num_agents
        cells = self.raw.num_rows * self.raw.num_cols
        self._order = _self_first(n)
        self.spec = EnvSpec(
            env_id=self.ENV_ID,
            num_agents=n,
            obs_dim=cells + 2 * n,
            state_dim=cells + 2 * n,
            action=DiscreteActions(4, noop_action=None),
            max_steps=int(self.raw.time_limit),
            has_win=True,
        )

    def _out(self, state, ts, first):
        n = self.spec.num_agents
        grid = state.grid.reshape(-1)
        dirty = grid == CLEANER_DIRTY
        tiles = dirty.astype(jnp.float32) - (grid == CLEANER_WALL).astype(jnp.float32)
        pos = state.agents_locations.astype(jnp.float32)  # [N, 2]
        gs = jnp.concatenate([tiles, pos.reshape(-1)])
        obs = _per_agent_obs(tiles, pos[self._order].reshape(n, -1))
        mask = state.action_mask
        if first:
            return Step(state, obs, gs, mask)
        clean = ~jnp.any(dirty)
        timeout = state.step_count >= self.raw.time_limit
        last = ts.last()
        return Step(
            inner=state,
            obs=obs,
            global_state=gs,
            avail_actions=mask,
            reward=ts.reward,
            # Upstream ends on: all clean, an illegal action, or the horizon;
            # only the horizon alone is a truncation.
            done=last & (clean | ~timeout),
            truncated=last,
            won=clean,
        )


register(LevelBasedForagingEnv.ENV_ID, LevelBasedForagingEnv)
register(RobotWarehouseEnv.ENV_ID, RobotWarehouseEnv)
register(ConnectorEnv.ENV_ID, ConnectorEnv)
register(CleanerEnv.ENV_ID, CleanerEnv)
