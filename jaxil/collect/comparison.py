"""The offline learners' comparison on the recipe datasets: the learners the
MisoDICE table compares, their names in tables, and the measured tier
returns a dataset's scores are normalised by.

`ALGOS` are BC on all data D_U and on the expert-labelled data D_E, independent
DemoDICE (INDD), MisoDICE with sum mixing (MisoDICE-VDN) and MisoDICE
([`jaxil.algorithms.offline.make_learner`][jaxil.algorithms.offline.make_learner]
names); `VARIANTS` are learners of the comparison with one setting changed;
`LABELS` names them all.

[`tier_returns`][jaxil.collect.comparison.tier_returns] reads what
[`jaxil.collect.recipes.build`][jaxil.collect.recipes.build] measured of each
tier's policy (the dataset's `.tiers.json` sidecar): a return R is reported
normalised as (R − R_random) / (R_expert − R_random), 0 for the random policy
and 1 for the expert that made the data.
"""

from __future__ import annotations

import json
import os
from typing import Union

from jaxil.collect.recipes import dataset_path, sidecar_path

ALGOS = ("bc_union", "bc_expert", "indd", "misodice_vdn", "misodice")
LABELS = {"bc_union": "BC(D_U)", "bc_expert": "BC(D_E)", "indd": "INDD",
          "misodice_vdn": "MisoDICE-VDN", "misodice": "MisoDICE"}
#: Learners of the comparison with one setting changed: name -> (learner, overrides, label).
VARIANTS = {
    "misodice_strat": ("misodice", dict(policy_sampling="stratified"),
                       "MisoDICE, stratified π batch"),
}
LABELS.update({k: v[2] for k, v in VARIANTS.items()})


def tier_returns(dataset: Union[str, os.PathLike], seed: int = 0) -> dict[str, float]:
    """`{tier: mean return}` measured for a dataset: a file, or a recipe name
    (its file under runs/data/,
    [`jaxil.collect.recipes.dataset_path`][jaxil.collect.recipes.dataset_path]);
    {} when it has no `.tiers.json` sidecar."""
    side = sidecar_path(dataset_path(dataset, seed))
    if not side.exists():
        return {}
    tiers = json.loads(side.read_text())["tier_measurements"]["tiers"]
    return {t: v["mean_return"] for t, v in tiers.items()}
