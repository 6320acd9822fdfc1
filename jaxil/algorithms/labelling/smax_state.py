"""The SMAX world state, parsed on the host: layout, unit health, teams.

One parser for every reader of SMAX datasets: the semantic oracle
([`jaxil.algorithms.labelling.oracles`][jaxil.algorithms.labelling.oracles])
and the prompt renderer
([`jaxil.algorithms.labelling.render`][jaxil.algorithms.labelling.render]) both
import it from here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxil.envs.core import EnvSpec
from jaxil.data.format import Dataset
from jaxil.envs._jaxmarl import import_jaxmarl


@dataclasses.dataclass(frozen=True)
class SMAXLayout:
    """Where things are in a SMAX world state (`smax_env.SMAX.get_world_state`).

    The state is `[U·F unit features | U unit teams | U unit types]` with
    `U = num_allies + num_enemies` units, allies first, and per unit
    `F = 4 + #unit types` features: health (divided by the unit type's
    maximum health, so in [0, 1]), x, y, weapon cooldown, one-hot unit type.
    A dead unit's features are all zero. The allies are team 0, the learners.
    """

    num_allies: int
    num_enemies: int
    unit_features: int

    @property
    def num_units(self) -> int:
        return self.num_allies + self.num_enemies

    @property
    def state_dim(self) -> int:
        return (self.unit_features + 2) * self.num_units


def smax_layout(spec: EnvSpec) -> SMAXLayout:
    """The world-state layout of a `smax:<map>` environment.

    Unit counts come from JaxMARL's scenario table; the per-unit feature
    count from `spec.state_dim`. Raises ValueError for non-SMAX specs or a
    state size that does not fit the scenario.
    """
    env_id = spec.env_id
    if not env_id.startswith("smax:"):
        raise ValueError(
            f"{env_id!r} is not a SMAX environment (ids look like 'smax:3m'); the SMAX "
            f"world-state parser only reads SMAX datasets"
        )

    import_jaxmarl("smax")
    from jaxmarl.environments.smax.smax_env import MAP_NAME_TO_SCENARIO

    map_name = env_id.split(":", 1)[1]
    if map_name not in MAP_NAME_TO_SCENARIO:
        raise ValueError(
            f"unknown SMAX map {map_name!r} in {env_id!r}; known maps: "
            f"{sorted(MAP_NAME_TO_SCENARIO)}"
        )
    scenario = MAP_NAME_TO_SCENARIO[map_name]
    A, E = int(scenario.num_allies), int(scenario.num_enemies)
    if A != spec.num_agents:
        raise ValueError(
            f"{env_id}: the scenario has {A} allies but the spec controls "
            f"{spec.num_agents} agents; the dataset was not recorded by envs.smax"
        )
    U, S = A + E, int(spec.state_dim)
    F = S // U - 2
    if S % U or F < 5:
        raise ValueError(
            f"{env_id}: state_dim {S} is not (4 + #unit types + 2) x {U} units; the "
            f"global state is not SMAX's world state (was it recorded by envs.smax?)"
        )
    return SMAXLayout(num_allies=A, num_enemies=E, unit_features=F)


def smax_health(global_state: np.ndarray, layout: SMAXLayout) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit health fractions `(allies [..., A], enemies [..., E])` in
    [0, 1] (0 = dead) from SMAX world states `[..., S]`."""
    gs = np.asarray(global_state)
    if gs.shape[-1] != layout.state_dim:
        raise ValueError(
            f"global states have {gs.shape[-1]} features but the SMAX layout needs "
            f"{layout.state_dim}"
        )
    U, F, A = layout.num_units, layout.unit_features, layout.num_allies
    units = gs[..., : U * F].reshape(gs.shape[:-1] + (U, F))
    health = units[..., 0]
    return health[..., :A], health[..., A:]


def smax_check_teams(dataset: Dataset, layout: SMAXLayout) -> None:
    """Raise ValueError unless every trajectory's first state lists the
    allies (team 0) first and then the enemies (team 1)."""
    U, F = layout.num_units, layout.unit_features
    teams = np.asarray(dataset.global_state[:, 0, U * F : U * F + U])
    want = np.r_[np.zeros(layout.num_allies), np.ones(layout.num_enemies)]
    if teams.size and not np.all(teams == want):
        bad = int(np.flatnonzero(~np.all(teams == want, axis=-1))[0])
        raise ValueError(
            f"{dataset.info.env_id}: trajectory {bad}'s world state has unit teams "
            f"{teams[bad].tolist()}, expected {want.tolist()} (allies first); the global "
            f"state is not the SMAX world state recorded by envs.smax"
        )
