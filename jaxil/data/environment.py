"""The environment a dataset was recorded in.

[`dataset_env`][jaxil.data.environment.dataset_env] makes it from the dataset's
environment id and the `envs.make` keywords its builder recorded
([`DatasetInfo.env_kwargs`][jaxil.data.format.DatasetInfo.env_kwargs]), and
checks it against the dataset's spec, so that a learner trained on the data is
evaluated where the data came from (a MaMuJoCo dataset at a cheaper solver
setting, say, or an MPE one with shorter episodes).
"""

from __future__ import annotations

from jaxil import envs
from jaxil.data.format import Dataset


def dataset_env(ds: Dataset) -> envs.MultiAgentEnv:
    """The environment `ds` was recorded in, checked against its spec."""

    env = envs.make(ds.spec.env_id, **ds.info.env_kwargs)
    if env.spec != ds.spec:
        raise ValueError(f"dataset spec {ds.spec} does not match environment {env.spec}; "
                         "was it recorded with environment keywords it does not record?")
    return env
