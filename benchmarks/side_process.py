"""Timing a side of a benchmark in a process of its own.

Two frameworks in one Python process do not leave each other alone: torch's
OpenMP pool, its allocator and its warm caches share the cores and memory
that XLA's calls run on. On a 2-core machine a jaxil SmolLM2 prefill at
B = 256 took 14.8 s timed in a process that also held and ran the
transformers model, and 10.9 s in a process of its own. A benchmark that
compares the two should give each its own process and still time them
alternately, one at a time, in the same run.

:class:`SideProcess` starts ``python side_process.py MODULE`` and talks to
it over a pipe, one JSON object per line. The child imports ``MODULE`` (a
file path) and runs its functions by name:

- ``setup(fn, **kwargs)``: ``MODULE.fn(state, **kwargs)``, where ``state`` is
  a dict the child keeps between requests (a loaded model); returns the
  function's JSON result.
- ``prepare(side, fn, info, **kwargs)``: ``MODULE.fn(state, info,
  **kwargs)`` returns a call of no arguments (compiled, not yet run), which
  the child keeps under ``side``; the facts it writes into ``info`` come
  back into the parent's ``info``. It returns a :class:`RemoteCall`.
- :meth:`RemoteCall.time` runs the call back to back in the child and
  returns the child's own wall and CPU seconds per call (the pipe is not in
  the timing), and on the first call its output as a numpy array.

A ``Skip`` raised in the child (any exception class of that name) and an
out-of-memory error become :class:`Skip` in the parent; any other error
becomes a ``RuntimeError`` carrying the child's message. The child writes
its own prints and logs to stderr, so they never reach the pipe.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional


class Skip(Exception):
    """A side that cannot run in its process; the message is the reason."""


class SideProcess:
    """A child process that runs the functions of one benchmark module
    (see the module docstring). Use as a context manager, or call
    :meth:`close`."""

    def __init__(self, label: str, module: str | Path, env: Optional[dict[str, str]] = None):
        self.label = label
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(Path(module).resolve())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, **(env or {})})

    def request(self, op: str, **fields) -> Any:
        """Send one request and return its result (raises :class:`Skip` or
        ``RuntimeError`` as the module docstring says)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"the {self.label} process has exited "
                               f"(code {self.proc.returncode}); see its stderr above")
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"the {self.label} process exited (code {code}) during {op!r}; "
                               "see its stderr above (an exit by signal 9 is usually the "
                               "kernel's out-of-memory killer)")
        reply = json.loads(line)
        if "skip" in reply:
            raise Skip(reply["skip"])
        if "error" in reply:
            raise RuntimeError(f"{self.label} process, {op!r}: {reply['error']}")
        return reply["result"]

    def setup(self, fn: str, /, **kwargs) -> Any:
        """``MODULE.fn(state, **kwargs)``'s result."""
        return self.request("setup", fn=fn, kwargs=kwargs)

    def prepare(self, side: str, fn: str, info: dict[str, Any], /, *,
                keep_output: bool = False, **kwargs) -> "RemoteCall":
        """``MODULE.fn(state, info, **kwargs)``'s call, kept in the child as
        ``side``."""
        info.update(self.request("prepare", side=side, fn=fn, kwargs=kwargs))
        return RemoteCall(self, side, keep_output)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "SideProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteCall:
    """A prepared call living in a :class:`SideProcess`."""

    def __init__(self, owner: SideProcess, side: str, keep_output: bool):
        self.owner, self.side, self.keep_output = owner, side, keep_output
        self.first = True

    def time(self, calls: int = 1) -> tuple[float, float, Any]:
        """``(wall s, cpu s, output)`` per call of ``calls`` back-to-back
        calls in the child; the output (a numpy array) only on the first
        timing of a side prepared with ``keep_output``, else None."""
        import numpy as np

        want = self.keep_output and self.first
        self.first = False
        r = self.owner.request("time", side=self.side, calls=int(calls), output=want)
        out = np.asarray(r["output"]) if r.get("output") is not None else None
        return r["wall_s"], r["cpu_s"], out


# -- the child ----------------------------------------------------------------------------


def _is_oom(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}".lower()
    return "out of memory" in text or "resource_exhausted" in text or isinstance(e, MemoryError)


def _as_output(out: Any) -> Any:
    import numpy as np

    if hasattr(out, "tokens"):  # a Generation
        out = out.tokens
    return np.asarray(out).tolist()


def _serve(module_path: str) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the module's prints go to stderr, never into the pipe
    sys.stdout = sys.stderr
    sys.path.insert(0, str(Path(module_path).parent))
    spec = importlib.util.spec_from_file_location(Path(module_path).stem, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state: dict[str, Any] = {}
    calls: dict[str, Callable[[], Any]] = {}
    import jax  # block_until_ready works on any pytree, numpy and torch outputs included

    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "exit":
            break
        try:
            if op == "setup":
                result = getattr(module, req["fn"])(state, **req["kwargs"])
            elif op == "prepare":
                calls.pop(req["side"], None)
                info: dict[str, Any] = {}
                calls[req["side"]] = getattr(module, req["fn"])(state, info, **req["kwargs"])
                result = info
            elif op == "time":
                call, n = calls[req["side"]], req["calls"]
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(n):
                    out = jax.block_until_ready(call())
                wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
                result = {"wall_s": wall, "cpu_s": cpu,
                          "output": _as_output(out) if req.get("output") else None}
                del out
            elif op == "drop":
                calls.pop(req["side"], None)
                result = None
            else:
                raise ValueError(f"unknown request {op!r}")
            reply = {"result": result}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the parent
            if type(e).__name__ == "Skip":
                reply = {"skip": str(e)}
            elif _is_oom(e):
                reply = {"skip": f"out of memory: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200] if str(e) else ''}"}
            else:
                traceback.print_exc()
                reply = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        proto.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    _serve(sys.argv[1])
