"""Adapter-specific tests for the Jumanji and MABrax adapters.

The generic interface checks (shapes, jit/vmap, auto-reset, illegal actions)
live in ``test_env_conformance.py``; these check what each adapter defines:
the global-state encoding, the team reward as a function of upstream rewards,
the done/truncated split, success flags, and keyword overrides.
"""

import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.jumanji import CleanerEnv, ConnectorEnv, LevelBasedForagingEnv, RobotWarehouseEnv
from helpers.fast_compile import fast_call

LBF = "jumanji:LevelBasedForaging-v0"
RWARE = "jumanji:RobotWarehouse-v0"
CONN = "jumanji:Connector-v3"
CLEAN = "jumanji:Cleaner-v0"
JUMANJI_IDS = [LBF, RWARE, CONN, CLEAN]
MABRAX_IDS = [
    "mabrax:hopper_3x1", "mabrax:ant_4x2", "mabrax:halfcheetah_6x1", "mabrax:walker2d_2x3"
]
HAS_BRAX = importlib.util.find_spec("brax") is not None

LIMIT = 8  # a short time limit so that the parallel run below crosses it
SMALL = {
    LBF: dict(time_limit=LIMIT),
    RWARE: dict(num_agents=2, time_limit=LIMIT),
    CONN: dict(num_agents=2, grid_size=5, time_limit=LIMIT),
    CLEAN: dict(num_agents=2, grid_size=5, time_limit=LIMIT),
}

_envs, _jits, _runs = {}, {}, {}


def _env(eid):
    if eid not in _envs:
        _envs[eid] = envs.make(eid, **SMALL[eid])
    return _envs[eid]


def _step_fn(eid):
    if eid not in _jits:
        _jits[eid] = jax.jit(_env(eid).step)
    return _jits[eid]


def _team_reward(eid, raw_reward):
    """The documented team reward: sum of per-agent rewards, or upstream's scalar."""
    return raw_reward.sum(-1) if eid in (LBF, CONN) else raw_reward


def _dynamics_state(eid, inner):
    """The upstream state fields the global state claims to encode."""
    if eid == LBF:
        a, f = inner.agents, inner.food_items
        return (a.position, a.level, a.loading, f.position, f.level, f.eaten)
    if eid == RWARE:
        a, s = inner.agents, inner.shelves
        return (a.position.x, a.position.y, a.direction, a.is_carrying,
                s.position.x, s.position.y, s.is_requested)
    if eid == CONN:
        return (inner.grid, inner.agents.position)
    return (inner.grid, inner.agents_locations)


def _parallel_run(eid, steps=12):
    """Step the adapter and the raw upstream env side by side with the same
    random legal actions, from the same upstream state; one compile per env."""
    if eid in _runs:
        return _runs[eid]
    env = _env(eid)

    def run(key):
        state, ts0 = env.reset(key)

        def body(state, k):
            logits = jnp.where(state.avail_actions, 0.0, -jnp.inf)
            a = jax.random.categorical(k, logits, axis=-1).astype(jnp.int32)
            raw_state, raw_ts = env.raw.step(state.inner, a)
            new_state, ts = env.step(state, a)
            return new_state, (ts, raw_state, raw_ts, new_state.inner)

        _, out = jax.lax.scan(body, state, jax.random.split(key, steps))
        return ts0, state.inner, out

    _runs[eid] = jax.tree.map(np.asarray, fast_call(run, jax.random.PRNGKey(7)))  # XLA level 0
    return _runs[eid]


# -- registry, specs and keyword overrides ----------------------------------------------


def test_ids_registered_even_without_brax():
    ids = envs.list()
    for eid in JUMANJI_IDS + MABRAX_IDS:
        assert eid in ids


def test_default_specs_follow_upstream_defaults():
    s = envs.make(LBF).spec
    assert (s.num_agents, s.obs_dim, s.state_dim, s.max_steps) == (2, 12, 16, 100)
    assert s.action.num_actions == 6 and s.action.noop_action == 0 and s.has_win
    s = envs.make(RWARE).spec
    assert (s.num_agents, s.obs_dim, s.state_dim, s.max_steps) == (4, 66, 7 * 4 + 3 * 80, 500)
    assert s.action.num_actions == 5 and s.action.noop_action == 0 and not s.has_win
    s = envs.make(CONN).spec
    assert (s.num_agents, s.obs_dim, s.state_dim, s.max_steps) == (10, 150, 150, 50)
    assert s.action.num_actions == 5 and s.action.noop_action == 0 and s.has_win
    s = envs.make(CLEAN).spec
    assert (s.num_agents, s.obs_dim, s.state_dim, s.max_steps) == (3, 106, 106, 100)
    assert s.action.num_actions == 4 and s.action.noop_action is None and s.has_win


def test_keyword_overrides_reach_upstream():
    env = envs.make(LBF, num_agents=3, num_food=3, grid_size=10, time_limit=30)
    assert isinstance(env, LevelBasedForagingEnv)
    assert env.raw.num_agents == 3 and env.raw.num_food == 3 and env.raw.grid_size == 10
    assert env.raw.fov == 10, "fov follows grid_size (full view) unless given"
    assert (env.spec.obs_dim, env.spec.state_dim, env.spec.max_steps) == (18, 24, 30)
    grid = envs.make(LBF, grid_observation=True, fov=2)
    assert grid.spec.obs_dim == 3 * 5 * 5
    assert envs.make(LBF, max_steps=7).spec.max_steps == 7  # alias of time_limit

    env = envs.make(RWARE, num_agents=2, sensor_range=2, shelf_rows=1, time_limit=40)
    assert isinstance(env, RobotWarehouseEnv) and env.spec.num_agents == 2
    assert env.spec.obs_dim == 8 + 5 * 24 + 2 * 25 and env.spec.max_steps == 40

    env = envs.make(CONN, num_agents=3, grid_size=6, timestep_reward=-0.1)
    assert isinstance(env, ConnectorEnv)
    assert (env.spec.num_agents, env.spec.obs_dim) == (3, 36 + 15)
    assert env.raw._rewarder.timestep_reward == -0.1

    env = envs.make(CLEAN, num_agents=4, num_rows=6, num_cols=6, penalty_per_timestep=0.1)
    assert isinstance(env, CleanerEnv)
    assert (env.spec.num_agents, env.spec.obs_dim, env.spec.max_steps) == (4, 36 + 8, 36)
    assert env.raw.penalty_per_timestep == 0.1


@pytest.mark.parametrize("eid", JUMANJI_IDS)
def test_unknown_keyword_names_the_accepted_ones(eid):
    with pytest.raises(TypeError, match=r"'num_agentz'.*accepted keywords: .*num_agents"):
        envs.make(eid, num_agentz=3)
    with pytest.raises(TypeError, match="not both"):
        envs.make(eid, time_limit=5, max_steps=5)
    with pytest.raises(ValueError, match="time_limit"):
        envs.make(eid, time_limit=0)


def test_invalid_configurations_raise_value_errors():
    with pytest.raises(ValueError, match="LevelBasedForaging"):
        envs.make(LBF, grid_size=6, fov=9)  # upstream asserts fov <= grid_size
    with pytest.raises(ValueError, match="odd"):
        envs.make(RWARE, shelf_columns=2)
    with pytest.raises(ValueError, match="request_queue_size"):
        envs.make(RWARE, request_queue_size=1000)
    with pytest.raises(ValueError, match="do not fit"):
        envs.make(CONN, grid_size=3, num_agents=5)
    with pytest.raises(ValueError, match="square"):
        envs.make(CLEAN, num_rows=6, num_cols=8)


# -- side-by-side with the raw upstream environment -------------------------------------


@pytest.mark.parametrize("eid", JUMANJI_IDS)
def test_adapter_steps_upstream_plainly(eid):
    """The adapter's inner state is exactly upstream ``step``'s (no reset, no
    extra dynamics), and its observations are upstream's where documented so."""
    _, _, (ts, raw_state, raw_ts, inner) = _parallel_run(eid)
    for a, b in zip(jax.tree.leaves(inner), jax.tree.leaves(raw_state)):
        np.testing.assert_array_equal(a, b)
    if eid in (LBF, RWARE):
        np.testing.assert_array_equal(ts.obs, raw_ts.observation.agents_view.reshape(ts.obs.shape))
    np.testing.assert_array_equal(ts.avail_actions, raw_ts.observation.action_mask)


@pytest.mark.parametrize("eid", JUMANJI_IDS)
def test_team_reward_is_documented_function_of_upstream_rewards(eid):
    _, _, (ts, _, raw_ts, _) = _parallel_run(eid)
    np.testing.assert_allclose(ts.reward, _team_reward(eid, raw_ts.reward), rtol=1e-6)
    if eid == CONN:  # -0.03 per unconnected agent at least on the first step
        assert ts.reward[0] <= -0.03 * 2 + 1.0 * 2


@pytest.mark.parametrize("eid", JUMANJI_IDS)
def test_done_and_truncated_split_upstream_last(eid):
    _, _, (ts, raw_state, raw_ts, _) = _parallel_run(eid)
    last = raw_ts.step_type == 2  # dm_env StepType.LAST
    np.testing.assert_array_equal(ts.done | ts.truncated, last)
    assert not (ts.done & ts.truncated).any()
    at_limit = raw_state.step_count >= LIMIT
    # before the limit, any ending is a termination
    assert not ts.truncated[~at_limit].any()
    # a truncation is exactly reaching the limit without terminating
    np.testing.assert_array_equal(ts.truncated, at_limit & ~ts.done)
    if not _env(eid).spec.has_win:
        assert not ts.won.any()


@pytest.mark.parametrize("eid", JUMANJI_IDS)
def test_global_state_changes_exactly_when_upstream_state_changes(eid):
    ts0, inner0, (ts, _, _, inner) = _parallel_run(eid)
    gs = np.concatenate([ts0.global_state[None], ts.global_state])
    leaves = [
        np.concatenate([a[None], b]) for a, b in zip(_dynamics_state(eid, inner0),
                                                      _dynamics_state(eid, inner))
    ]
    changed_state = np.zeros(len(gs) - 1, bool)
    for x in leaves:
        changed_state |= (x[1:] != x[:-1]).reshape(len(gs) - 1, -1).any(-1)
    changed_gs = (gs[1:] != gs[:-1]).any(-1)
    assert changed_state.any(), "random play never changed the state; test is vacuous"
    np.testing.assert_array_equal(changed_gs, changed_state)


def test_global_state_and_egocentric_obs_layouts():
    _, _, (ts, _, _, inner) = _parallel_run(LBF)
    a, f = inner.agents, inner.food_items
    gs = ts.global_state.reshape(len(ts.global_state), -1, 4)  # [T, N + F, 4]
    np.testing.assert_array_equal(gs[:, :2, :2], a.position)
    np.testing.assert_array_equal(gs[:, :2, 2], a.level)
    np.testing.assert_array_equal(gs[:, :2, 3], a.loading)
    np.testing.assert_array_equal(gs[:, 2:, :2], f.position)
    np.testing.assert_array_equal(gs[:, 2:, 3], f.eaten)

    _, _, (ts, _, _, inner) = _parallel_run(CONN)
    g2 = 25
    ent = ts.global_state[:, g2:].reshape(-1, 2, 5)
    np.testing.assert_array_equal(ent[..., :2], inner.agents.position)
    np.testing.assert_array_equal(ent[..., 2:4], inner.agents.target)
    for i in range(2):  # each agent's obs lists itself first
        np.testing.assert_array_equal(ts.obs[:, i, g2 : g2 + 5], ent[:, i])
        np.testing.assert_array_equal(ts.obs[:, i, :g2], ts.global_state[:, :g2])
    np.testing.assert_array_equal(ts.obs[:, 0, g2 + 5 :], ent[:, 1])
    np.testing.assert_array_equal(ts.obs[:, 1, g2 + 5 :], ent[:, 0])

    _, _, (ts, _, _, inner) = _parallel_run(CLEAN)
    cells = 25
    tiles = (inner.grid == 0).astype(np.float32) - (inner.grid == 2)  # +1 dirty, -1 wall
    np.testing.assert_array_equal(ts.global_state[:, :cells], tiles.reshape(-1, cells))
    np.testing.assert_array_equal(ts.global_state[:, cells:], inner.agents_locations.reshape(-1, 4))
    for i in range(2):
        np.testing.assert_array_equal(ts.obs[:, i, :cells], ts.global_state[:, :cells])
        np.testing.assert_array_equal(ts.obs[:, i, cells : cells + 2], inner.agents_locations[:, i])
    np.testing.assert_array_equal(ts.obs[:, 0, cells + 2 :], inner.agents_locations[:, 1])


# -- constructed episodes: success flags and exact rewards ------------------------------


def _state_with(eid, mask, **fields):
    """An EnvState at step 0 whose upstream state is the parallel run's reset
    state with ``fields`` replaced (and ``action_mask`` where upstream keeps one)."""
    _, inner0, _ = _parallel_run(eid)
    inner = jax.tree.map(jnp.asarray, inner0)
    mask = jnp.asarray(mask)
    if hasattr(inner, "action_mask"):
        fields["action_mask"] = mask
    return envs.EnvState(
        inner=inner.replace(**fields),
        key=jax.random.PRNGKey(0),
        avail_actions=mask,
        episode_return=jnp.float32(0.0),
        episode_length=jnp.int32(0),
        ended=jnp.bool_(False),
    )


def test_lbf_eating_all_food_is_a_win_worth_one():
    _, inner0, _ = _parallel_run(LBF)
    # agent 0 (level 1) between both foods, agent 1 (level 2) beside food 0.
    agents = inner0.agents.replace(
        position=np.array([[3, 2], [3, 4]]), level=np.array([1, 2]), loading=np.zeros(2, bool)
    )
    food = inner0.food_items.replace(
        position=np.array([[3, 3], [2, 2]]), level=np.array([3, 1]), eaten=np.zeros(2, bool)
    )
    # noop, up, down, left, right, load: moves into food are illegal, load is legal
    mask = [[1, 0, 1, 1, 0, 1], [1, 1, 1, 0, 1, 1]]
    state = _state_with(LBF, np.array(mask, bool), agents=agents, food_items=food)

    _, ts = _step_fn(LBF)(state, jnp.array([5, 5], jnp.int32))  # both load
    assert bool(ts.done) and bool(ts.won) and not bool(ts.truncated)
    np.testing.assert_allclose(ts.reward, 1.0, rtol=1e-6)  # normalised: all food = 1
    assert np.asarray(ts.global_state).reshape(-1, 4)[2:, 3].all()  # both eaten

    # only agent 0 loads: it eats food 1 alone (level 1 of a total of 4).
    _, ts = _step_fn(LBF)(state, jnp.array([5, 0], jnp.int32))
    assert not bool(ts.done) and not bool(ts.won)
    np.testing.assert_allclose(ts.reward, 0.25, rtol=1e-6)


def _connector_state(heads, targets, mask):
    from jumanji.environments.routing.connector.utils import get_position, get_target

    _, inner0, _ = _parallel_run(CONN)
    ids = np.arange(len(heads))
    heads, targets = np.array(heads), np.array(targets)
    grid = np.zeros_like(inner0.grid)
    grid[tuple(heads.T)] = np.asarray(get_position(ids))
    grid[tuple(targets.T)] = np.asarray(get_target(ids))
    agents = inner0.agents.replace(start=heads, position=heads, target=targets)
    return _state_with(CONN, np.array(mask, bool), grid=grid, agents=agents)


def test_connector_all_connected_is_a_win():
    # noop, up, right, down, left; each agent's own target is enterable
    state = _connector_state(
        [[0, 0], [4, 4]], [[0, 1], [4, 3]], [[1, 0, 1, 1, 0], [1, 1, 0, 0, 1]]
    )
    right, left, noop = 2, 4, 0
    _, ts = _step_fn(CONN)(state, jnp.array([right, left], jnp.int32))
    assert bool(ts.done) and bool(ts.won) and not bool(ts.truncated)
    np.testing.assert_allclose(ts.reward, 2 * (1.0 - 0.03), rtol=1e-6)

    _, ts = _step_fn(CONN)(state, jnp.array([right, noop], jnp.int32))
    assert not bool(ts.done) and not bool(ts.won)
    np.testing.assert_allclose(ts.reward, (1.0 - 0.03) - 0.03, rtol=1e-6)
    assert np.asarray(ts.global_state)[25 + 4] == 1.0  # agent 0's connected flag


def test_connector_all_blocked_or_connected_is_done_without_win():
    # agent 0 in the corner, walled in by agent 1's head (0, 1) and target (1, 0).
    state = _connector_state(
        [[0, 0], [0, 1]], [[4, 4], [1, 0]], [[1, 0, 0, 0, 0], [1, 0, 1, 1, 0]]
    )
    down, left = 3, 4
    state, ts = _step_fn(CONN)(state, jnp.array([0, down], jnp.int32))
    assert not bool(ts.done)  # agent 1 is neither connected nor blocked
    assert not np.asarray(ts.avail_actions)[0, 1:].any(), "agent 0 stays walled in"
    _, ts = _step_fn(CONN)(state, jnp.array([0, left], jnp.int32))  # agent 1 connects
    assert bool(ts.done) and not bool(ts.won) and not bool(ts.truncated)
    np.testing.assert_allclose(ts.reward, (1.0 - 0.03) - 0.03, rtol=1e-6)


def test_cleaner_cleaning_the_last_tile_is_a_win():
    from jumanji.environments.routing.cleaner.constants import CLEAN as C, DIRTY as D

    grid = np.full((5, 5), C, np.int8)
    grid[0, 1] = D
    mask = np.array([[False, True, True, False]] * 2)  # up, right, down, left from (0, 0)
    state = _state_with(CLEAN, mask, grid=grid, agents_locations=np.zeros((2, 2), np.int32))
    _, ts = _step_fn(CLEAN)(state, jnp.array([1, 2], jnp.int32))  # right cleans (0, 1)
    assert bool(ts.done) and bool(ts.won) and not bool(ts.truncated)
    np.testing.assert_allclose(ts.reward, 1.0 - 0.5, rtol=1e-6)
    _, ts = _step_fn(CLEAN)(state, jnp.array([2, 2], jnp.int32))
    assert not bool(ts.done) and not bool(ts.won)
    np.testing.assert_allclose(ts.reward, -0.5, rtol=1e-6)


def test_cleaner_illegal_action_maps_to_first_legal_move_not_termination():
    ts0, inner0, _ = _parallel_run(CLEAN)
    up, left = 0, 3  # never legal from the top-left corner, where agents start
    assert not ts0.avail_actions[:, [up, left]].any()
    state = _state_with(CLEAN, ts0.avail_actions)
    _, ts1 = _step_fn(CLEAN)(state, jnp.array([up, left], jnp.int32))
    assert not bool(ts1.done), "upstream would terminate on an illegal action"
    assert int(ts1.episode_length) == 1


# -- MABrax -----------------------------------------------------------------------------


def test_mabrax_without_brax_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)  # makes `import brax` fail
    for eid in MABRAX_IDS:
        with pytest.raises(ImportError) as err:
            envs.make(eid)
        assert str(err.value) == "MABrax needs brax: pip install 'jaxil[mabrax]'"


@pytest.mark.skipif(not HAS_BRAX, reason="brax is not installed (pip install 'jaxil[mabrax]')")
def test_mabrax_unknown_keyword_names_the_accepted_ones():
    with pytest.raises(TypeError, match=r"'nope'.*episode_length.*ctrl_cost_weight"):
        envs.make("mabrax:hopper_3x1", nope=1)
    with pytest.raises(ValueError, match="episode_length"):
        envs.make("mabrax:hopper_3x1", max_steps=0)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_BRAX, reason="brax is not installed (pip install 'jaxil[mabrax]')")
def test_mabrax_matches_brax_and_jaxmarl_mapping():
    env = envs.make("mabrax:hopper_3x1", episode_length=4)
    spec = env.spec
    assert (spec.num_agents, spec.obs_dim, spec.state_dim, spec.max_steps) == (3, 9, 11, 4)
    assert spec.action.dim == 1 and not spec.discrete
    raw = env.raw
    state, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
    actions = jnp.array([[0.5], [-0.3], [1.0]], jnp.float32)
    step = jax.jit(env.step)
    outs = []
    for _ in range(4):
        _, _, raw_rew, _, _ = raw.step_env(
            jax.random.PRNGKey(0), state.inner, {a: actions[i] for i, a in enumerate(raw.agents)}
        )
        prev = state
        state, ts = step(state, actions)
        outs.append((prev, ts, raw_rew))
    for prev, ts, raw_rew in outs:
        np.testing.assert_allclose(ts.reward, raw_rew["__all__"], rtol=1e-5, atol=1e-5)
    raw_obs = raw.get_obs(state.inner)
    for i, a in enumerate(raw.agents):
        o = np.asarray(raw_obs[a])
        np.testing.assert_allclose(np.asarray(ts.obs)[i, : o.size], o, rtol=1e-6)
        assert (np.asarray(ts.obs)[i, o.size :] == 0).all()
    np.testing.assert_allclose(ts.global_state, state.inner.obs, rtol=1e-6)
    assert bool(ts.truncated) or bool(ts.done)

    cheetah = envs.make("mabrax:halfcheetah_6x1")
    assert cheetah.raw.env.observation_size == 18  # x position kept so the mapping lines up
    assert cheetah.spec.state_dim == 17


MPE_VALUES = dict(num_agents=2, num_landmarks=2, local_ratio=0.3, max_steps=7, dt=0.05,
                  moveable=np.array([1, 1, 1, 0, 0, 0], bool), silent=np.ones(3, int),
                  mass=np.full(6, 2.0), accel=np.full(3, 4.0), max_speed=np.full(6, 3.0),
                  u_noise=np.full(3, 0.1), c_noise=np.full(3, 0.2), damping=0.3,
                  contact_force=50.0, contact_margin=1e-2)


@pytest.mark.parametrize("eid", ["mpe:simple_spread", "mpe:simple_spread_continuous"])
def test_mpe_unknown_keyword_names_the_accepted_ones(eid):
    """JaxMARL's MPE takes `**kwargs` and ignores a name it does not read, so
    `max_step=50` (a typo) ran the default 25-step episodes silently. Bug
    caught: the adapter passing unknown keywords through unchecked."""
    with pytest.raises(TypeError, match=r"'max_step'.*accepted: .*max_steps"):
        envs.make(eid, max_step=50)


def test_mpe_accepted_keywords_all_reach_jaxmarl():
    """Every keyword of `envs.mpe.KEYWORDS` ends up on JaxMARL's environment
    with the value given. Bug caught: a name in the list that JaxMARL does not
    read (accepted, then ignored: the silence the list exists to stop) or one
    it refuses (`rad`, `collide`: set by SimpleSpreadMPE itself)."""
    from jaxil.envs.mpe import KEYWORDS

    assert set(KEYWORDS) == set(MPE_VALUES)
    for k in KEYWORDS:
        raw = envs.make("mpe:simple_spread", **{k: MPE_VALUES[k]}).raw
        np.testing.assert_array_equal(np.asarray(getattr(raw, k)), np.asarray(MPE_VALUES[k]),
                                      err_msg=k)
