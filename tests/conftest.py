import importlib.metadata
import os
import re
import shutil
import tempfile

import pytest

# XLA flags for the test processes (xdist workers and the `jaxil` subprocesses
# of the CLI tests); a caller's XLA_FLAGS replace them.
# - No Eigen thread pool of XLA's own: the workers already share the cores.
# - Up to jaxlib 0.10, loop emitters instead of the MLIR fusion emitters, which
#   compile this suite's programs 2-3x more slowly; the default suite's CPU
#   time falls by about a third. Results agree up to the last bits of fused
#   float maths. jaxlib 0.11 has no such flag, and XLA aborts on an unknown one.
# XLA stops reading at the first word that is not a --flag.
_XLA_FLAGS = ["--xla_cpu_multi_thread_eigen=false"]
if tuple(int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2]) < (0, 11):
    _XLA_FLAGS.append("--xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("XLA_FLAGS", " ".join(_XLA_FLAGS))

# XLA's persistent compilation cache, one folder per test session, shared by
# the xdist workers and the `jaxil` subprocesses the CLI tests start (they
# inherit the environment). Many tests compile a program another test (or the
# same test's resumed run, whose environment object is new) compiled already;
# on 2 cores compiling is most of the suite's time. Starts empty on every
# session, so no result of an earlier checkout is reused. A folder set in
# JAX_COMPILATION_CACHE_DIR by the caller is used as it is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxil-tests-xla-")
    os.environ["JAXIL_TESTS_OWN_XLA_CACHE"] = str(os.getpid())
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")


def pytest_unconfigure(config):
    if os.environ.get("JAXIL_TESTS_OWN_XLA_CACHE") == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

# The default run uses two pytest-xdist workers (pyproject addopts): XLA
# compiles on one thread, so two processes compile about twice as fast on 2
# cores. A worker keeps what it compiled and computed (module fixtures,
# module-level caches, jitted programs), so tests that share those must run
# on the same worker. The scheduler below hands out whole scopes:
#
# - by default a whole module;
# - test_env_conformance.py: the tests of one ``eid`` (they share one
#   compiled probe per environment); its other tests one by one;
# - modules of independent tests (_SPLIT_MODULES): test by test.
#
# (xdist's own ``--dist loadgroup`` marks groups by editing node ids, which
# pytest >= 9.2 no longer honours: pytest-xdist issue #1386. This scheduler
# replaces it when ``--dist loadgroup`` is asked for.)
_SPLIT_MODULES = {"test_learners.py"}
_EID_MODULES = {"test_env_conformance.py"}
# Scheduled first, longest scopes first, so that no worker is left with a
# long one at the end. Only the order depends on this list.
_LONG_FIRST = ("test_policies.py", "test_train.py", "test_teachers.py", "test_interactive.py",
               "test_run_integrity.py", "test_sharding.py", "test_omapl.py",
               "test_env_conformance.py")


def _scope(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    if module in _EID_MODULES:
        eid = re.search(r"\[([^\]]+)\]$", name)
        return f"{path}[{eid.group(1)}]" if eid else nodeid
    if module in _SPLIT_MODULES:
        return nodeid
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # keep the collection's order
            super().schedule()

    return ScopeScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if "PYTEST_XDIST_WORKER" in os.environ:  # the order the scheduler hands scopes out
        rank = {m: i for i, m in enumerate(_LONG_FIRST)}
        items.sort(key=lambda it: rank.get(it.path.name, len(rank)))


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A tiny Llama-family GGUF checkpoint (the byte-level BPE and chat
    template of helpers.pretrained), written once per session."""
    from helpers.pretrained import GGUF_LLAMA, hf_tensors, write_gguf

    path = tmp_path_factory.mktemp("ckpt") / "tiny.gguf"
    write_gguf(path, hf_tensors("llama", config=GGUF_LLAMA), GGUF_LLAMA)
    return path
