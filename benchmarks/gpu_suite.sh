#!/usr/bin/env bash
# The accelerator suite (benchmarks/gpu_suite.py): one command, one JSON.
#
#   bash benchmarks/gpu_suite.sh            # full suite, at most 8 minutes on one GPU
#   bash benchmarks/gpu_suite.sh --quick    # tiny sizes, a CPU smoke test
#
# On a machine with CUDA JAX but without jumanji or jaxmarl, put their wheels
# (and any of their dependencies that machine lacks) in benchmarks/wheels/,
# or in the folder JAXIL_WHEELS names; they are installed into a private
# folder on PYTHONPATH first, nothing else is touched. How to fill the folder
# (on a machine with internet; the README's "Accelerator suite" section):
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d benchmarks/wheels jumanji==1.1.2 jaxmarl==0.2.0 ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${JAXIL_WHEELS:-benchmarks/wheels}
if ! "$PY" -c "import jumanji, jaxmarl" 2>/dev/null; then
    if compgen -G "$WHEELS/*.whl" > /dev/null; then
        SITE=${JAXIL_WHEELS_SITE:-/tmp/jaxil-suite-site}
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$WHEELS"/*.whl
        export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "jumanji or jaxmarl is missing and $WHEELS holds no wheels: see the header of $0" >&2
        exit 2
    fi
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" benchmarks/gpu_suite.py "$@"
