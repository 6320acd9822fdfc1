"""The accelerator suite: one command, one JSON, at most 8 minutes on one GPU.

Parts, each under its own time budget (what does not fit is listed under
``skipped`` with the reason, never silently dropped):

1. ``env``: env-steps/s of every adapter and of its raw upstream env at
   1 … 65,536 parallel environments (:mod:`benchmarks.env_throughput`).
2. ``learners``: updates/s and transitions/s of every learner over batch
   256 … 65,536 and 1 … 256 vmapped seeds (:mod:`benchmarks.learner_throughput`).
3. ``paper``: the MisoDICE and O-MAPL updates at the paper shapes, one
   update per call and 16 fused.
4. ``precision``: achieved TFLOP/s of a square matmul probe and of the fused
   MisoDICE update at the paper shapes (BC at small shapes with ``--quick``)
   with fp32, TF32 and bf16 operands (:mod:`jaxil.runs.precision`), and how far
   the losses of the 16th update from the same state and keys move from fp32's
   at each.
5. ``collect``: dataset-collection throughput (:mod:`benchmarks.collect_throughput`).
6. ``tokens``: tokens/s of the transformer's KV-cache decoding and token-env
   rollout against recomputation without a cache, and against
   ``transformers``' ``generate`` where torch and transformers import
   (:mod:`benchmarks.token_rollout`).
7. ``peer``: where ``JAXIL_OMAPL_PEER`` points at a copy of the O-MAPL
   authors' code (github.com/vietbt/OMAPL) and PyTorch is importable, their
   ``TrainerDiscrete.update`` timed at the same shapes, their code imported
   at run time by a child process (none of it is copied here); skipped
   otherwise.

``summary`` holds the headlines: env-steps/s at the largest size, the
paper-shape update time against the peer's, and the speedup of 256 vmapped
seeds over 256 sequential ones (256 × one seed's call time over the
256-seed call's).

    bash benchmarks/gpu_suite.sh                # the full suite (GPU)
    bash benchmarks/gpu_suite.sh --quick        # tiny sizes, about 2 minutes on a CPU (smoke test)
    python -m benchmarks.gpu_suite --parts env,paper --out-dir /tmp/suite

The parts import the other benchmarks as ``benchmarks.<name>``, so the suite
runs where the repository root is importable: from the root with
``python -m``, or through ``gpu_suite.sh``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxil.runs import measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"

PARTS = ("env", "learners", "paper", "precision", "collect", "tokens", "peer")
PRECISIONS = ("fp32", "tf32", "bf16")

#: per-part budgets in seconds on a GPU; they sum to 7.8 minutes. ``--quick``
#: (a smoke test of every code path) has none: each part runs all of its points.
BUDGETS = {"env": 120, "learners": 110, "paper": 60, "precision": 45, "collect": 45, "tokens": 60,
           "peer": 30}
NO_BUDGET = 1e9
#: The peer's child process (PyTorch start-up included) is stopped after this long.
PEER_TIMEOUT_S = 1800.0


def _quiet(fn: Callable, *args, **kwargs):
    """Run a benchmark's ``main`` with its tables kept out of the log; returns
    its payload and the last lines it printed."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        out = fn(*args, **kwargs)
    return out, buf.getvalue().strip().splitlines()[-3:]


# -- parts ---------------------------------------------------------------------


def part_env(args, budget: float, tmp: Path) -> dict[str, Any]:
    from jaxil import envs
    from benchmarks import env_throughput

    ids = ["mpe:simple_spread"] if args.quick else envs.list()
    sizes = [1, 8] if args.quick else [1, 256, 4096, 65536]
    steps, repeats = (10, 2) if args.quick else (100, 3)
    rows, skipped, t0 = [], [], time.perf_counter()
    for i, eid in enumerate(ids):
        if time.perf_counter() - t0 > budget:
            skipped += [{"env": e, "reason": f"budget ({budget:.0f} s)"} for e in ids[i:]]
            break
        out, _ = _quiet(env_throughput.main, ["--envs", eid, "--num-envs", *map(str, sizes),
                                              "--steps", str(steps), "--repeats", str(repeats),
                                              "--out", str(tmp / f"env-{i}.json")])
        rows += out["rows"]
        skipped += [{"env": e, "reason": r} for e, r in out["skipped"].items()]
        print(f"  env {eid}: {len(out['rows'])} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"sizes": sizes, "steps": steps, "rows": rows, "skipped": skipped}


def part_learners(args, budget: float, tmp: Path) -> dict[str, Any]:
    from benchmarks import learner_throughput as lt

    if args.quick:
        argv = ["--quick", "--learners", "bc_union,misodice", "--batch-values", "64,128",
                "--seeds-values", "1,2", "--trajectories", "8"]
    else:
        argv = ["--learners", ",".join(lt.LEARNERS), "--batch-values", "256,1024,4096,16384,65536",
                "--seeds-values", "1,4,16,64,256", "--trajectories", "1000", "--repeats", "5",
                "--target-s", "1"]
    out, _ = _quiet(lt.main, argv + ["--axes", "batch,seeds", "--no-paper", "--no-peak-subprocess",
                                     "--budget-s", str(budget), "--out-dir", str(tmp)])
    return {"rows": out["rows"], "skipped": out["skipped"], "config": out["config"]}


def part_paper(args, budget: float, tmp: Path) -> dict[str, Any]:
    from benchmarks import learner_throughput as lt

    argv = ["--no-sweep", "--paper-learners", "misodice,omapl", "--no-op-profile",
            "--no-peak-subprocess", "--out-dir", str(tmp)]
    if args.quick:  # the paper shapes at 3 repeats and 120 trajectories, single updates only
        argv += ["--quick", "--paper-trajectories", "120", "--paper-repeats", "2"]
    else:
        argv += ["--paper-repeats", "7", "--paper-fused-repeats", "3"]
    out, _ = _quiet(lt.main, argv)
    return {"paper": out.get("paper"), "summary": out.get("summary")}


def _matmul_tflops(n: int, dtype, repeats: int) -> float:
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (n, n), dtype)
    b = jax.random.normal(jax.random.fold_in(key, 1), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    t = measure.time_call(f, a, b, warmup=2, repeats=repeats)
    return 2 * n ** 3 / t.median_s / 1e12


def part_precision(args, budget: float, tmp: Path) -> dict[str, Any]:
    """Matmul probe and the fused MisoDICE update at each precision, and the
    losses of one update from the same state and batch against fp32's."""
    from benchmarks.learner_throughput import PAPER, Shapes, _learner, synthetic_data, synthetic_spec
    from jaxil.algorithms.offline import update_n
    from jaxil.runs.precision import matmul_precision

    if args.quick:
        shapes, batch, trajs, n_mm, k = Shapes(obs_dim=32, state_per_agent=16, hidden=(64, 64),
                                               mixer_hidden=16, episode_len=20), 128, 20, 256, 4
    else:
        shapes, batch, trajs, n_mm, k = Shapes(), PAPER.batch, 1200, 8192, 16
    spec = synthetic_spec(5, shapes)
    data = synthetic_data(jax.random.PRNGKey(0), spec, trajs, shapes.episode_len)
    # --quick: BC, which compiles in a fraction of MisoDICE's time (6 programs here)
    name = "bc_union" if args.quick else "misodice"
    learner = _learner(name, spec, batch, shapes)
    state = learner.init(jax.random.PRNGKey(0))
    rows, ref, t0 = {}, None, time.perf_counter()
    for prec in PRECISIONS:
        if time.perf_counter() - t0 > budget:
            rows[prec] = {"skipped": f"budget ({budget:.0f} s)"}
            continue
        with matmul_precision(prec):
            probe = _matmul_tflops(n_mm, jnp.float32, 5)
            fused = jax.jit(lambda s, d: update_n(learner, s, d, k))
            compiled = fused.lower(state, data).compile()
            flops = measure.xla_cost(compiled).get("flops")
            t = measure.time_call(compiled, state, data, warmup=1, repeats=3)
            # the K-th update's metrics from the same state and keys: the drift of K updates
            losses = {m: float(v) for m, v in jax.device_get(compiled(state, data)[1]).items()}
        if ref is None:
            ref = losses
        rows[prec] = {
            "matmul_n": n_mm, "matmul_tflops": probe, "update_ms": 1e3 * t.median_s / k,
            "update_tflops": (flops / t.median_s / 1e12) if flops else None,
            "losses": losses,
            "loss_rel_change_vs_fp32": {m: abs(v - ref[m]) / max(abs(ref[m]), 1e-12)
                                        for m, v in losses.items()},
        }
        print(f"  precision {prec}: matmul {probe:.2f} TFLOP/s, update {rows[prec]['update_ms']:.2f} ms",
              flush=True)
    bf = _matmul_tflops(n_mm, jnp.bfloat16, 5)
    return {"learner": name, "rows": rows, "bf16_inputs_matmul_tflops": bf,
            "note": "fp32 parameters and element-wise maths throughout; only the operands of the "
                    "products are rounded (jax.default_matmul_precision). losses: the metrics of "
                    "the K-th fused update from the same state and keys (K updates of drift)"}


def part_collect(args, budget: float, tmp: Path) -> dict[str, Any]:
    from benchmarks import collect_throughput

    argv = (["--envs", "mpe:simple_spread", "--num-envs", "4", "--repeats", "2"] if args.quick
            else ["--num-envs", "64", "1024", "16384", "--repeats", "3"])
    out, _ = _quiet(collect_throughput.main, argv + ["--out-dir", str(tmp)])
    return {"rows": out["rows"]}


def part_tokens(args, budget: float, tmp: Path) -> dict[str, Any]:
    """:func:`benchmarks.token_rollout.measure`: tiny at batches 1 and 8 with
    ``--quick``; tiny and small at 1 … 4,096 sequences otherwise."""
    from benchmarks import token_rollout

    if args.quick:
        kw = dict(sizes=["tiny"], batches=[1, 8], repeats=2, target_s=0.5)
    else:
        kw = dict(sizes=["tiny", "small"], batches=[1, 8, 64, 512, 4096], repeats=3,
                  target_s=1.0, max_call_s=20.0, budget_s=budget)
    out, _ = _quiet(token_rollout.measure, **kw)
    return {k: out[k] for k in ("config", "peer", "rows") if k in out}


def part_peer(args, budget: float, tmp: Path) -> dict[str, Any]:
    """The O-MAPL authors' PyTorch update at the paper shapes (8 pairs × 70
    steps, N = 5, obs 124, state 780, 12 actions, their 256-unit networks),
    timed by :func:`peer_update` in a child process with their folder on its
    ``PYTHONPATH`` (their modules import each other by top-level names:
    ``config``, ``algos``, ``trainers``)."""
    root = os.environ.get("JAXIL_OMAPL_PEER")
    if not root:
        return {"skipped": "JAXIL_OMAPL_PEER is not set (point it at a copy of github.com/vietbt/OMAPL)"}
    if not (Path(root) / "trainers" / "omarl.py").exists():
        return {"skipped": f"JAXIL_OMAPL_PEER={root} holds no trainers/omarl.py"}
    if importlib.util.find_spec("torch") is None:
        return {"skipped": "PyTorch is not installed"}
    pythonpath = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer-child"] + (["--quick"] if args.quick else [])
    return measure.run_json_child(cmd, timeout_s=PEER_TIMEOUT_S, env={"PYTHONPATH": pythonpath})


def stub_summary_writer() -> bool:
    """Give ``torch.utils.tensorboard`` a no-op ``SummaryWriter`` when the
    real one cannot be imported (it needs the ``tensorboard`` package, which
    the peer's trainer imports only to log). Returns whether it stubbed.

    Only the child process that times the peer calls this: the timed update
    never writes a summary, so the stub changes no measured work.
    """
    try:
        import torch.utils.tensorboard  # noqa: F401
        return False
    except ImportError:
        pass

    class SummaryWriter:
        def __init__(self, *args, **kwargs):
            pass

        def __getattr__(self, name):  # add_scalar, add_histogram, flush, close, ...
            return lambda *args, **kwargs: None

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = SummaryWriter
    sys.modules["torch.utils.tensorboard"] = module
    return True


def peer_update(quick: bool) -> dict[str, Any]:
    """:func:`part_peer`'s measurement, in the child process it starts."""
    import torch

    stubbed = stub_summary_writer()
    try:
        from algos.omarl import PolicyDiscrete
        from config import Args
        from tensordict import TensorDict
        from trainers.omarl import TrainerDiscrete
    except ImportError as e:
        return {"skipped": f"the peer's code did not import: {e}"}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, N, O, S, A = (2, 10, 5, 32, 80, 12) if quick else (8, 70, 5, 124, 780, 12)
    g = torch.Generator().manual_seed(0)

    def side():
        actions = torch.randint(0, A, (B, T, N), generator=g)
        avails = torch.ones(B, T + 1, N, A)
        return dict(states=torch.randn(B, T + 1, S, generator=g), obs=torch.randn(B, T + 1, N, O, generator=g),
                    avails=avails, actions=actions, dones=torch.zeros(B, T, dtype=torch.bool))

    x, y = side(), side()
    batch = {f"{k}_{s}": v for s, d in (("x", x), ("y", y)) for k, v in d.items()}
    batch["labels"] = torch.randint(0, 2, (B,), generator=g)
    data = TensorDict(batch, batch_size=[B]).to(device)
    errors = []
    for ob_dim in (O, O + N):  # their networks may count the agent id in ob_dim or add it
        try:
            with tempfile.TemporaryDirectory() as logdir:
                trainer = TrainerDiscrete(PolicyDiscrete(S, ob_dim, A, N).to(device), logdir, [], N,
                                          Args(device=device))
                trainer.update(data)  # warm-up
                times = []
                for _ in range(3 if quick else 10):
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    trainer.update(data)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
            return {"device": device, "torch": torch.__version__, "ob_dim_arg": ob_dim,
                    "tensorboard": "stubbed (not installed)" if stubbed else "installed",
                    "shapes": dict(pairs=B, steps=T, agents=N, obs=O, state=S, actions=A),
                    "update_ms": 1e3 * measure.median(times), "times_s": times}
        except RuntimeError as e:
            errors.append(f"ob_dim={ob_dim}: {str(e)[:300]}")
    return {"error": "; ".join(errors)}


RUNNERS = {"env": part_env, "learners": part_learners, "paper": part_paper,
           "precision": part_precision, "collect": part_collect, "tokens": part_tokens,
           "peer": part_peer}


# -- summary -------------------------------------------------------------------


def summarize(parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = parts.get("env", {})
    if env.get("rows"):
        biggest = max(r["num_envs"] for r in env["rows"])
        out["env_steps_per_s_at"] = biggest
        out["env_steps_per_s"] = {r["env"]: {k: r.get(k) for k in r if "steps_per_s" in k}
                                  for r in env["rows"] if r["num_envs"] == biggest}
    paper = (parts.get("paper") or {}).get("summary") or {}
    out["paper_update_ms"] = {k: v["update_ms"] for k, v in paper.items() if "update_ms" in v}
    peer = parts.get("peer") or {}
    if "update_ms" in peer:
        out["peer_omapl_update_ms"] = peer["update_ms"]
        for label in ("single", "fused"):
            ours = out["paper_update_ms"].get(f"omapl_{label}")
            if ours:
                out[f"peer_over_jaxil_omapl_{label}"] = peer["update_ms"] / ours
    tokens = (parts.get("tokens") or {}).get("rows") or []
    if tokens:
        top = max(tokens, key=lambda r: (r["batch"], r["size"] == "small"))
        out["token_decode"] = {k: top.get(k) for k in (
            "size", "batch", "decode_cached_over_recompute", "jaxil_over_hf_cached")}
    rows = (parts.get("learners") or {}).get("rows") or []
    speed = {}
    for r in rows:
        if r.get("axis") != "seeds":
            continue
        speed.setdefault(r["learner"], {})[r["seeds"]] = r["updates_per_s"]
    for name, by in speed.items():
        if 1 in by and len(by) > 1:
            top = max(by)
            # updates/s is summed over seeds: top seeds vmapped vs top sequential one-seed calls
            out.setdefault("vmapped_seeds_speedup", {})[name] = {"seeds": top,
                                                                 "speedup": by[top] / by[1]}
    prec = (parts.get("precision") or {}).get("rows") or {}
    out["precision"] = {p: {k: r.get(k) for k in ("matmul_tflops", "update_ms", "update_tflops")}
                        for p, r in prec.items() if "skipped" not in r}
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke test)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--out-dir", type=Path, default=None, help="where the JSON goes (default benchmarks/results)")
    p.add_argument("--name", default="gpu_suite", help="JSON file name prefix")
    p.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [x for x in args.parts.split(",") if x]
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"--parts: unknown {', '.join(bad)}; choose from {', '.join(PARTS)}")
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.peer_child:  # part_peer's child process
        print(json.dumps(peer_update(args.quick)))
        return {}
    if set(args.parts) - {"peer"} and importlib.util.find_spec("benchmarks") is None:
        raise SystemExit("the suite's parts import the other benchmarks as benchmarks.<name>: run it from "
                         "the repository root as `python -m benchmarks.gpu_suite` or `bash benchmarks/gpu_suite.sh`")
    t0 = time.perf_counter()
    payload: dict[str, Any] = {"machine": measure.machine_info(), "versions": measure.library_versions(),
                               "config": {"quick": args.quick, "parts": args.parts}, "parts": {},
                               "errors": {}}
    m = payload["machine"]
    print(f"jaxil accelerator suite on {m['device_kind']} ({m['backend']}), jax {payload['versions']['jax']}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            budget = NO_BUDGET if args.quick else BUDGETS[part]
            t = time.perf_counter()
            print(f"[{part}]" + ("" if args.quick else f" budget {budget} s"), flush=True)
            try:
                payload["parts"][part] = RUNNERS[part](args, budget, Path(tmp))
            except Exception as e:  # one broken part must not lose the others' numbers
                payload["errors"][part] = f"{type(e).__name__}: {e}"
                payload["parts"][part] = {"error": traceback.format_exc()[-3000:]}
                print(f"  {part} failed: {type(e).__name__}: {e}", flush=True)
            payload["parts"][part] = dict(payload["parts"][part], seconds=time.perf_counter() - t)
    payload["summary"] = summarize(payload["parts"])
    payload["wall_s"] = time.perf_counter() - t0
    path = measure.write_json(args.name + ("_quick" if args.quick else ""), payload, args.out_dir or RESULTS_DIR)
    print(f"wrote {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
