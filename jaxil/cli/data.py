"""`jaxil data`: build, inspect, validate and list offline datasets.

    jaxil data list [--env smax-3m]
    jaxil data build smax-3m/misodice-200e-1000p [--seed 0] [--out PATH]
                     [--teacher DIR | --no-teacher] [--scale F] [--n-expert N ...]
                     [--env-kwarg max_steps=50] [--chunk-size 128]
                     [--measure-episodes 128] [--quiet]
    jaxil data info runs/data/smax-3m-misodice-200e-1000p.npz [--json]
    jaxil data validate runs/data/smax-3m-misodice-200e-1000p.npz
    jaxil data diff A.npz B.npz
    jaxil data import-omapl dataset/5m_vs_6m.h5 --env ENV --out OUT.npz [--prefs OUT_PREFS]
    jaxil data import-vault vaults/smac_v1/3m.vlt [--vault-uid Good] --out OUT.npz [--env ENV]
    jaxil data export-vault DATA.npz --out vaults/jaxil --vault-uid Mixed [--name NAME.vlt]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from jaxil.cli.args import (add_env_kwargs, env_kwargs, nonneg_int, positive_float,
                            positive_int, probability)
from jaxil.collect.zoo import TIERS


def _tier_epsilon(item: str) -> tuple[str, float]:
    """`TIER=EPS` with ε a probability (range-checked at parse time)."""
    if "=" not in item:
        raise argparse.ArgumentTypeError(f"expected TIER=EPS, e.g. medium=0.2, got {item!r}")
    tier, eps = item.split("=", 1)
    try:
        return tier, probability(eps)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"ε of tier {tier!r} {e}") from None


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


# -- build ---------------------------------------------------------------------------


def _build(args) -> int:
    from jaxil.collect.recipes import build, get_recipe, sidecar_path
    from jaxil.runs.io_atomic import check_file_writable

    r = get_recipe(args.recipe)
    overrides = {t: getattr(args, f"n_{t}") for t in TIERS if getattr(args, f"n_{t}") is not None}
    counts = r.resolve_counts(args.scale, overrides)
    out = Path(args.out) if args.out else r.default_path(args.seed, counts)
    if args.teacher and args.no_teacher:
        raise ValueError("give --teacher DIR or --no-teacher, not both")
    kw = env_kwargs(args, r.env_id) or None  # None: the teacher's own keywords
    # Before any collection: an unwritable --out is found now, not after the build.
    check_file_writable(out, "--out")
    check_file_writable(sidecar_path(out), "--out's sidecar")
    if not args.quiet:
        from jaxil.collect.zoo import make_zoo

        zoo = make_zoo(r.env_id, env_kwargs=kw, teacher_dir=args.teacher,
                       discover=not args.no_teacher, epsilons=dict(args.epsilon or []),
                       greedy_expert=r.greedy_expert)
        print(f"{r.name}: " + ", ".join(f"{t} {n}" for t, n in counts.items())
              + f" -> {out}", file=sys.stderr)
        for t, p in zoo.tiers.items():
            print(f"  {t:<7} {p.source}", file=sys.stderr)
    t0 = time.perf_counter()
    ds = build(
        r, seed=args.seed, out_path=out, teacher_dir=args.teacher, progress=not args.quiet,
        scale=args.scale, counts=overrides, env_kwargs=kw,
        epsilons=dict(args.epsilon or []),
        discover_teachers=not args.no_teacher, chunk_size=args.chunk_size,
        measure_episodes=args.measure_episodes,
    )
    wall = time.perf_counter() - t0
    print(f"wrote {out} ({os.path.getsize(out) / 2**20:.1f} MB, {len(ds)} trajectories, "
          f"{ds.num_transitions} transitions) in {wall:.1f} s")
    if not args.quiet:
        _print_info(out, ds)
    return 0


# -- info ----------------------------------------------------------------------------


def info_dict(path: os.PathLike | str, ds=None) -> dict[str, Any]:
    """What `jaxil data info` shows, as a dict."""
    import numpy as np

    from jaxil.data.format import load

    if ds is None:
        ds = load(path)
    summ = ds.summary()
    tiers = np.asarray(ds.tier)
    src = np.asarray(ds.source)
    for i, name in enumerate(ds.info.tier_names):
        used = sorted(set(src[tiers == i].tolist()))
        summ["tiers"][name]["sources"] = [ds.info.source_names[j] for j in used]
    args = ds.info.creation_args
    return dict(
        path=str(path),
        file_mb=os.path.getsize(path) / 2**20,
        memory_mb=sum(a.nbytes for a in ds.arrays().values()) / 2**20,
        recipe=ds.info.recipe,
        seed=args.get("seed"),
        scale=args.get("scale"),
        env_kwargs=args.get("env_kwargs"),
        spec=ds.spec.to_dict(),
        num_trajectories=len(ds),
        num_transitions=ds.num_transitions,
        num_steps=ds.num_steps,
        overall=summ["overall"],
        tiers=summ["tiers"],
        tier_measurements=args.get("tier_measurements"),
        demonstrators=args.get("zoo") or {},
        versions=dict(ds.info.versions),
    )


def demonstrator_line(details: dict) -> str:
    """Who acted for a tier, from the zoo provenance a dataset records: the
    teacher (run or shipped package, checkpoint, its own evaluation, weights
    digest), the scripted expert, or the random policy; plus the ε-noise."""
    kind = details.get("kind")
    eps = details.get("epsilon")
    noise = f" with ε = {eps} random actions" if eps else ""
    if "teacher_dir" in details:
        ev = f"its eval return {details['teacher_eval_return']:.3f}"
        if details.get("teacher_eval_win_rate") is not None:
            ev += f", win {details['teacher_eval_win_rate']:.3f}"
        where = details["teacher_dir"]
        origin = "shipped with jaxil" if where.startswith("jaxil/teachers/shipped/") else "local run"
        return (f"teacher {where} ({origin}) @ step {details['step']}{noise}; {ev}; "
                f"params sha256 {details['params_sha256'][:12]}")
    if kind == "random":
        return "uniform random over the available actions (or the action box)"
    desc = details.get("description")
    return f"{details.get('source', 'scripted expert')}{noise}" + (f": {desc}" if desc else "")


def _spec_line(spec: dict) -> str:
    a = spec["action"]
    action = (f"discrete({a['num_actions']})" if a["kind"] == "discrete"
              else f"box[{a['low']}, {a['high']}]^{a['dim']}")
    return (f"{spec['env_id']}  agents {spec['num_agents']}  obs {spec['obs_dim']}  "
            f"state {spec['state_dim']}  action {action}  max_steps {spec['max_steps']}  "
            f"win {'yes' if spec['has_win'] else 'no'}")


def _print_info(path, ds=None) -> None:
    d = info_dict(path, ds)
    print(f"{d['path']}  ({d['file_mb']:.1f} MB on disk, {d['memory_mb']:.1f} MB in memory)")
    extra = []
    if d["seed"] is not None:
        extra.append(f"seed {d['seed']}")
    if d["scale"] not in (None, 1.0):
        extra.append(f"scale {d['scale']}")
    if d["env_kwargs"]:
        extra.append(f"env {json.dumps(d['env_kwargs'], sort_keys=True)}")
    print(f"recipe        {d['recipe'] or '-'}" + (f"  ({', '.join(extra)})" if extra else ""))
    print(f"environment   {_spec_line(d['spec'])}")
    print(f"trajectories  {d['num_trajectories']}   transitions {d['num_transitions']}   "
          f"time axis T={d['num_steps']}")
    print()
    head = (f"{'tier':<8} {'count':>6} {'expert':>7} {'return mean ± std':>22} "
            f"{'win rate':>9} {'length':>7}  source")
    print("dataset tiers")
    print(head)
    rows = list(d["tiers"].items()) + [("all", dict(d["overall"], sources=[]))]
    has_win = d["spec"]["has_win"]
    for name, s in rows:
        if not has_win:  # no win condition: `success` is always False
            s = dict(s, win_rate=None)
        ret = (f"{s['mean_return']:.4g} ± {s['std_return']:.3g}"
               if s["mean_return"] is not None else "-")
        print(f"{name:<8} {s['count']:>6} {_fmt(s['expert_fraction'], '.2f'):>7} {ret:>22} "
              f"{_fmt(s['win_rate'], '.3f'):>9} {_fmt(s['mean_length'], '.1f'):>7}  "
              f"{', '.join(s.get('sources', []))}")
    m = d["tier_measurements"]
    if m:
        print()
        print(f"measured tiers ({m['num_episodes']} fresh episodes each, seed {m['seed']})")
        print(f"{'tier':<8} {'return mean ± std':>22} {'win rate':>9} {'length':>7}  source")
        for name, s in m["tiers"].items():
            ret = f"{s['mean_return']:.4g} ± {s['std_return']:.3g}"
            print(f"{name:<8} {ret:>22} {_fmt(s['win_rate'], '.3f'):>9} "
                  f"{s['mean_length']:>7.1f}  {s['source']}")
    if d["demonstrators"]:
        print()
        print("demonstrators")
        for name, det in d["demonstrators"].items():
            print(f"{name:<8} {demonstrator_line(det)}")
    print()
    print("versions      " + ", ".join(f"{k} {v}" for k, v in sorted(d["versions"].items())))


def _info(args) -> int:
    from jaxil.data.format import load

    try:
        ds = load(args.path)
    except Exception as e:  # noqa: BLE001 - every load failure is reported the same way
        from jaxil.data.validate import DatasetError

        if isinstance(e, (DatasetError, FileNotFoundError)):
            print(f"jaxil data info: error: {e}", file=sys.stderr)
            return 1
        raise
    if args.json:
        print(json.dumps(info_dict(args.path, ds), indent=2, sort_keys=True))
    else:
        _print_info(args.path, ds)
    return 0


# -- validate ------------------------------------------------------------------------


def _validate(args) -> int:
    from jaxil.data.format import load
    from jaxil.data.validate import DatasetError

    try:
        ds = load(args.path, registered=True)
    except (DatasetError, FileNotFoundError) as e:
        print(f"INVALID {e}", file=sys.stderr)
        return 1
    print(f"OK {args.path}: {len(ds)} trajectories, {ds.num_transitions} transitions, "
          f"{ds.spec.env_id}, checksums verified")
    return 0


# -- diff ----------------------------------------------------------------------------


def _short_pair(a: Any, b: Any, width: int = 80) -> tuple[str, str]:
    """Both values as JSON, cut to `width` characters around where they
    first differ (long strings often share a long beginning)."""
    ta, tb = (json.dumps(x, sort_keys=True, default=str) for x in (a, b))
    k = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    start = max(0, k - 20) if k > width - 30 else 0

    def cut(text: str) -> str:
        text = ("..." + text[start:]) if start else text
        return text if len(text) <= width else text[: width - 3] + "..."

    return cut(ta), cut(tb)


def _flatten(x: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of nested dicts (and lists) by dotted path: `a.b[2].c`."""
    if isinstance(x, dict) and x:
        out = {}
        for k, v in x.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(x, list) and x:
        out = {}
        for i, v in enumerate(x):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: x}


def _array_difference(a, b) -> Optional[str]:
    """None when equal (NaN equals NaN), else what differs."""
    import numpy as np

    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype.name}{list(a.shape)} vs {b.dtype.name}{list(b.shape)}"
    if np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
        return None
    x, y = a.astype(np.float64), b.astype(np.float64)
    differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    return (f"{int(differ.sum())} of {a.size} elements differ, "
            f"max |a - b| = {float(np.nanmax(np.abs(x - y)[differ])):.6g}")


def diff_files(path_a: os.PathLike | str, path_b: os.PathLike | str) -> dict[str, Any]:
    """What `jaxil data diff` reports: `identical` (byte for byte),
    `arrays` `{name: what differs}` and `metadata` `{dotted key:
    (value in a, value in b)}`. The per-field `fields` entries of the
    metadata (dtype, shape, SHA-256) are left out: `arrays` covers them.

    Raises the loader's DatasetError / FileNotFoundError for unreadable files.
    """
    import filecmp

    from jaxil.data.format import read_archive

    (meta_a, arr_a), (meta_b, arr_b) = read_archive(path_a), read_archive(path_b)
    if filecmp.cmp(path_a, path_b, shallow=False):
        return dict(identical=True, arrays={}, metadata={})
    arrays = {}
    for name in sorted(set(arr_a) | set(arr_b)):
        if name not in arr_b or name not in arr_a:
            arrays[name] = "only in " + ("A" if name in arr_a else "B")
        elif (d := _array_difference(arr_a[name], arr_b[name])) is not None:
            arrays[name] = d
    missing = object()
    flat_a = _flatten({k: v for k, v in meta_a.items() if k != "fields"})
    flat_b = _flatten({k: v for k, v in meta_b.items() if k != "fields"})
    metadata = {}
    for key in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(key, missing), flat_b.get(key, missing)
        if va is missing or vb is missing or va != vb or type(va) is not type(vb):
            metadata[key] = tuple(None if v is missing else v for v in (va, vb))
    return dict(identical=False, arrays=arrays, metadata=metadata)


def _diff(args) -> int:
    from jaxil.data.validate import DatasetError

    a, b = args.a, args.b
    try:
        d = diff_files(a, b)
    except (DatasetError, OSError) as e:  # FileNotFoundError, permissions, ...
        print(f"jaxil data diff: error: {e}", file=sys.stderr)
        return 2
    if d["identical"]:
        print(f"{a} and {b} are byte-identical")
        return 0
    print(f"{a} and {b} differ")
    if not d["arrays"] and not d["metadata"]:
        print("  same arrays and metadata; only the file layout differs")
    if d["arrays"]:
        n = len(d["arrays"])
        print(f"arrays ({n} {'differs' if n == 1 else 'differ'}):")
        for name, what in d["arrays"].items():
            print(f"  {name}: {what}")
    else:
        print("arrays: all identical")
    if d["metadata"]:
        n = len(d["metadata"])
        print(f"metadata ({n} {'key differs' if n == 1 else 'keys differ'}):")
        for key, (va, vb) in d["metadata"].items():
            sa, sb = _short_pair(va, vb)
            print(f"  {key}:")
            print(f"    A: {sa}")
            print(f"    B: {sb}")
    else:
        print("metadata: identical")
    return 1


# -- import-omapl ----------------------------------------------------------------------


def _import_omapl(args) -> int:
    from jaxil.data.format import save
    from jaxil.data.omapl_h5 import import_omapl_h5, save_preferences
    from jaxil.runs.io_atomic import check_file_writable

    out = Path(args.out)
    prefs_path = Path(args.prefs) if args.prefs else out.with_name(f"{out.stem}.prefs.npz")
    if prefs_path.resolve() == out.resolve():
        raise ValueError(f"--prefs and --out are the same file {out}; give two paths")
    check_file_writable(out, "--out")
    check_file_writable(prefs_path, "--prefs")
    try:
        ds, prefs = import_omapl_h5(args.file, None if args.env == "infer" else args.env)
    except ImportError as e:  # h5py missing: one line, not a traceback
        print(f"jaxil data import-omapl: error: {e}", file=sys.stderr)
        return 1
    save(ds, out)
    save_preferences(prefs_path, ds, prefs)
    p = prefs.prefs
    x, y = int((p > 0.5).sum()), int((p < 0.5).sum())
    print(f"wrote {out} ({len(ds)} trajectories of {ds.spec.env_id}, T={ds.num_steps}) and "
          f"{prefs_path} ({len(p)} pairs: x preferred in {x}, y in {y}, ties {len(p) - x - y})")
    return 0


# -- vaults --------------------------------------------------------------------------


def _refuse_existing(path: Path, what: str, other: str) -> None:
    if path.exists():
        raise FileExistsError(
            f"{what} {path} already exists; pass --overwrite to replace it, or choose {other}"
        )


def _import_vault(args) -> int:
    from jaxil.data.format import save
    from jaxil.data.vault import import_vault
    from jaxil.runs.io_atomic import check_file_writable

    out = Path(args.out)
    if not args.overwrite:
        _refuse_existing(out, "--out", "another --out")
    check_file_writable(out, "--out")
    spec = None
    if args.env:
        from jaxil import envs

        spec = envs.make(args.env).spec
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = import_vault(args.vault, args.vault_uid, spec, tier=args.tier,
                              source=args.source, expert=args.expert,
                              reward_reduction=args.reward_reduction, backend=args.backend)
    except ImportError as e:  # neither flashbax nor tensorstore: one line, not a traceback
        print(f"jaxil data import-vault: error: {e}", file=sys.stderr)
        return 1
    for w in caught:
        print(f"jaxil data import-vault: warning: {w.message}", file=sys.stderr)
    save(ds, out)
    print(f"wrote {out} ({len(ds)} trajectories of {ds.spec.env_id}, "
          f"{ds.num_transitions} transitions, T={ds.num_steps}) from {args.vault}")
    return 0


def _export_vault(args) -> int:
    from jaxil.data.format import load
    from jaxil.data.vault import export_vault

    name = args.name or f"{Path(args.dataset).stem}.vlt"
    target = Path(args.out) / name / args.vault_uid
    if not args.overwrite:
        _refuse_existing(target, "vault", "another --vault-uid or --name")
    ds = load(args.dataset)
    try:
        written = export_vault(ds, args.out, name, args.vault_uid, overwrite=args.overwrite,
                               backend=args.backend)
    except ImportError as e:
        print(f"jaxil data export-vault: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote vault {written} ({len(ds)} trajectories of {ds.spec.env_id}, "
          f"{ds.num_transitions} transitions); OG-MARL reads it as Vault(rel_dir="
          f"{str(args.out)!r}, vault_name={name!r}, vault_uid={args.vault_uid!r})")
    return 0


# -- list ----------------------------------------------------------------------------


def _expert_note(env_id: str) -> str:
    from jaxil.envs.experts import has_scripted_expert
    from jaxil.collect.zoo import find_teacher, teacher_label

    t = find_teacher(env_id)
    if t is not None:
        label = teacher_label(t)
        if label.startswith("jaxil/teachers/shipped/"):
            return f"teacher {label} (shipped with jaxil)"
        return f"teacher {os.path.relpath(t)} (local run)"
    if has_scripted_expert(env_id):
        return "scripted"
    return f"needs a teacher: jaxil teach {env_id}"


def _list(args) -> int:
    from jaxil.collect.recipes import KINDS, env_short, list_recipes

    recipes = list_recipes()
    if args.env:
        recipes = [r for r in recipes if args.env in (r.env_short, r.env_id)]
        if not recipes:
            raise ValueError(f"no recipes for environment {args.env!r}")
    width = max(len(r.name) for r in recipes) + 2
    notes: dict[str, str] = {}
    print(f"{'recipe':<{width}}{'trajectories':>13}  contents")
    last = None
    for r in recipes:
        if r.env_id != last and last is not None:
            print()
        last = r.env_id
        print(f"{r.name:<{width}}{r.total:>13}  {r.description}")
        notes.setdefault(env_short(r.env_id), _expert_note(r.env_id))
    print()
    print("expert tier per environment (a complete teacher under runs/teachers/ wins over "
          "the one shipped with jaxil, which wins over the scripted expert):")
    for short, note in notes.items():
        print(f"  {short:<{width}}{note}")
    print()
    print(f"kinds: {', '.join(KINDS)}; any mix as <env>/mix-<n><e|m|p|r>-..., e.g. "
          f"smax-3m/mix-200e-500m-1000p. Box-action environments also take a -dart<σ> suffix "
          f"(executed actions noised, the policy's own recorded), e.g. "
          f"mpe-simple_spread_continuous/misodice-200e-1000p-dart0.8. A -greedy suffix "
          f"(before -dart) makes a teacher expert act on its greedy / mean action, e.g. "
          f"mamujoco-hopper_3x1/misodice-200e-1000p-greedy. "
          f"Build with `jaxil data build <recipe>`.")
    return 0


# -- registration --------------------------------------------------------------------


def register(sub) -> None:
    p = sub.add_parser("data", help="build, inspect, validate and list offline datasets",
                       description=__doc__.splitlines()[0])
    dsub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    b = dsub.add_parser("build", help="collect a named recipe into a dataset file")
    b.add_argument("recipe", help="e.g. smax-3m/misodice-200e-1000p (see `jaxil data list`)")
    b.add_argument("--seed", type=nonneg_int, default=0, help="build seed (default 0)")
    b.add_argument("--out", default=None,
                   help="output file (default runs/data/<env-short>-<recipe>[...].npz)")
    b.add_argument("--teacher", default=None, metavar="DIR",
                   help="teacher run directory for the tiers (default: look under runs/teachers)")
    b.add_argument("--no-teacher", action="store_true",
                   help="ignore trained teachers; use the scripted expert")
    b.add_argument("--scale", type=positive_float, default=1.0,
                   help="multiply every tier count (e.g. 0.01 for a tiny test version)")
    for t in TIERS:
        b.add_argument(f"--n-{t}", type=nonneg_int, default=None, metavar="N",
                       help=f"number of {t} trajectories (overrides the recipe and --scale; "
                            f"0 drops the tier)")
    add_env_kwargs(b, "environment keyword override (JSON value), e.g. max_steps=50; "
                      "without any, those the teacher was trained with")
    b.add_argument("--epsilon", type=_tier_epsilon, action="append", metavar="TIER=EPS",
                   help="ε of a noised-expert tier, e.g. medium=0.2 (defaults: 0.4 / 0.85)")
    b.add_argument("--chunk-size", type=positive_int, default=128,
                   help="episodes per compiled call (default 128)")
    b.add_argument("--measure-episodes", type=nonneg_int, default=128,
                   help="episodes per tier to measure every tier's return (0: skip)")
    b.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    b.set_defaults(func=_build)

    i = dsub.add_parser("info", help="tiers, returns, win rates, sizes, spec, recipe, versions")
    i.add_argument("path")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=_info)

    v = dsub.add_parser("validate", help="check a dataset file (exit 0 valid, 1 invalid)")
    v.add_argument("path")
    v.set_defaults(func=_validate)

    d = dsub.add_parser("diff", help="compare two dataset files (exit 0 byte-identical, "
                                     "1 different, 2 unreadable)")
    d.add_argument("a", metavar="A.npz")
    d.add_argument("b", metavar="B.npz")
    d.set_defaults(func=_diff)

    im = dsub.add_parser("import-omapl",
                         help="the O-MAPL authors' .h5 preference pairs -> dataset + preferences")
    im.add_argument("file", metavar="FILE", help="the authors' dataset/<env>.h5")
    im.add_argument("--env", required=True,
                    help="environment id the file must fit (e.g. smax:3m), or 'infer' to take "
                         "the spec from the file's shapes")
    im.add_argument("--out", required=True, metavar="OUT.npz", help="the dataset file to write")
    im.add_argument("--prefs", default=None, metavar="OUT_PREFS",
                    help="the preferences file to write (default OUT.prefs.npz beside --out)")
    im.set_defaults(func=_import_omapl)

    backends = ("auto", "flashbax", "tensorstore")
    iv = dsub.add_parser("import-vault",
                         help="an OG-MARL / flashbax vault -> a checked dataset file")
    iv.add_argument("vault", metavar="VAULT",
                    help="the vault directory <rel_dir>/<vault_name> (e.g. vaults/smac_v1/3m.vlt) "
                         "or its <vault_uid> directory")
    iv.add_argument("--vault-uid", default=None, metavar="UID",
                    help="which vault in VAULT, e.g. Good (needed when VAULT holds several)")
    iv.add_argument("--out", required=True, metavar="OUT.npz", help="the dataset file to write")
    iv.add_argument("--env", default=None,
                    help="environment id the vault must fit (e.g. smax:3m); default: the spec "
                         "stored by export-vault, else one inferred from the shapes")
    iv.add_argument("--tier", default="vault", help="tier name of a plain OG-MARL vault's "
                                                    "trajectories (default: vault)")
    iv.add_argument("--source", default=None,
                    help="source name of a plain OG-MARL vault (default <vault_name>/<uid>)")
    iv.add_argument("--expert", action="store_true",
                    help="mark a plain OG-MARL vault's trajectories as expert")
    iv.add_argument("--reward-reduction", choices=("mean", "sum", "first"), default="mean",
                    help="per-agent rewards -> team reward (default: mean)")
    iv.add_argument("--backend", choices=backends, default="auto",
                    help="flashbax, tensorstore, or auto (flashbax if installed)")
    iv.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    iv.set_defaults(func=_import_vault)

    ev = dsub.add_parser("export-vault",
                         help="a dataset file -> an OG-MARL / flashbax vault")
    ev.add_argument("dataset", metavar="DATASET.npz", help="the dataset file to export")
    ev.add_argument("--out", required=True, metavar="DIR",
                    help="the vaults' root (flashbax rel_dir); the vault is DIR/NAME/UID")
    ev.add_argument("--name", default=None, metavar="NAME",
                    help="vault name (default: DATASET's stem + .vlt)")
    ev.add_argument("--vault-uid", required=True, metavar="UID",
                    help="vault uid, e.g. Good, Medium, Mixed")
    ev.add_argument("--backend", choices=backends, default="auto",
                    help="flashbax, tensorstore, or auto (flashbax if installed)")
    ev.add_argument("--overwrite", action="store_true", help="replace an existing vault")
    ev.set_defaults(func=_export_vault)

    ls = dsub.add_parser("list", help="all named recipes")
    ls.add_argument("--env", default=None, help="only this environment (short name or id)")
    ls.set_defaults(func=_list)
