"""`jaxil envs` (the environment table) and `jaxil quickstart`."""

from __future__ import annotations


def env_table(ids=None) -> list[dict]:
    from jaxil import envs

    rows = []
    for eid in ids or envs.list():
        try:
            spec = envs.make(eid).spec
        except ImportError as e:
            rows.append(dict(id=eid, note=str(e)))
            continue
        a = spec.action
        action = f"discrete({a.num_actions})" if spec.discrete else f"box[{a.low},{a.high}]^{a.dim}"
        rows.append(
            dict(id=eid, agents=spec.num_agents, obs=spec.obs_dim, state=spec.state_dim,
                 action=action, max_steps=spec.max_steps, win=spec.has_win)
        )
    return rows


def _envs(args) -> int:
    rows = env_table(args.ids.split(",") if args.ids else None)
    print(f"{'id':<38}{'agents':>7}{'obs':>6}{'state':>7}  {'action':<18}{'T':>5}  win")
    for r in rows:
        if "note" in r:
            print(f"{r['id']:<38}  ({r['note']})")
        else:
            print(f"{r['id']:<38}{r['agents']:>7}{r['obs']:>6}{r['state']:>7}  {r['action']:<18}"
                  f"{r['max_steps']:>5}  {'yes' if r['win'] else '-'}")
    return 0


def _quickstart(args) -> int:
    from jaxil.cli import quickstart

    quickstart.run(args)
    return 0


def register(sub) -> None:
    p = sub.add_parser("envs", help="list registered environments with their specs")
    p.add_argument("--ids", default="", help="comma-separated ids (default: all)")
    p.set_defaults(func=_envs)
    from jaxil.cli import quickstart

    q = sub.add_parser("quickstart", help="the README's quickstart")
    quickstart.add_arguments(q)
    q.set_defaults(func=_quickstart)

