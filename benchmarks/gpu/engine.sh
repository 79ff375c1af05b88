#!/usr/bin/env bash
# The engine stage in one device call, with nothing carried but SmolLM2's tokenizer (3.4 MB): install
# reflexdb without dependencies (the engines need only torch and transformers, which the GPU image
# has), then the suite's probe and engine stages on SmolLM2-135M's shapes with random weights (a
# decode step's speed does not depend on the weights' values; benchmarks/gpu/README.md).
#
#   here:   mkdir -p .gpu && cp -r "$(python -c 'from reflexdb.models import smollm2_tokenizer_dir as d; print(d())')" .gpu/tokenizer
#           echo /.gpu/ >> .git/info/exclude
#   device: run(carry=[".gpu"], command="bash benchmarks/gpu/engine.sh [SECONDS] [SUITE ARGS]")
set -uo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
rm -rf /tmp/rdb; python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/rdb . > /tmp/pip.log 2>&1 || { tail -30 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/rdb PYTHONSAFEPATH=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
TORCHINDUCTOR_COMPILE_THREADS=16 timeout ${1:-420} python3 benchmarks/gpu/suite.py --stages probe,engine --random-weights --tokenizer .gpu/tokenizer \
  --out "$OUT" ${2:-} --work /tmp/work 2>&1 | grep -v "Loading weights" | tee "$OUT/engine-log.txt"
