#!/usr/bin/env bash
# Downloads, here, the wheels speed.sh installs on the device (Python 3.12, x86-64 Linux): the
# packages dpbert needs that the device image lacks (ml-collections, dp-accounting, grain,
# array-record, dm-tree, portpicker, tensorboardX, opacus, importlib-resources for etils.epath).
# They go into .whl/ (ignored by git); carry `.whl` in the device call.  The versions are those
# of the CPU environment (setup.py's ranges), opacus the one of issue 32's first GPU run.
#
#   benchmarks/accelerator/fetch_wheels.sh [PYTHON]     # PYTHON: the pip to use (python3)
set -eu
cd "$(dirname "$0")/../.."
PY=${1:-python3}
PACKAGES=(ml-collections==1.1.0 dp-accounting==0.6.0 grain==0.2.18 array-record==0.8.6
          dm-tree==0.1.10 portpicker==1.6.0 tensorboardX==2.6.5 opacus==1.6.0
          importlib-resources)
mkdir -p .whl
for p in "${PACKAGES[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$p"
done
ls -l .whl
