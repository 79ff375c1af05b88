#!/usr/bin/env bash
# Rehearse the three GPU calls on this machine, before a GPU is lent: proves that the parts made by
# bundle.py bring everything the GPU image lacks.
#
#   bash benchmarks/gpu/rehearse.sh
#
# 1. A venv at REHEARSE_DIR/venv (default /tmp/reflexdb-rehearse) with /usr/bin/python3.11, torch
#    (CPU) and only the image's packages our code can touch; anything else pip brought along is
#    uninstalled (it could hide a wheel the parts lack). Kept for later rehearsals;
#    REHEARSE_FRESH=1 rebuilds it.
# 2. A copy of the working tree as a device call sees it (tracked and untracked-not-ignored
#    files) at REHEARSE_DIR/repo, and bundle.py --python-version 3.11 into its .whl.
# 3. device.sh 1, 2, 3 there, one after the other, on one ROOT (a warm machine), with suite
#    args --dry-run. REHEARSE_SUITE=path puts that file at benchmarks/gpu/suite.py in the copy
#    (a stub until the real suite exists).
#
# Installs are the slow part (a few minutes, once). Exit status: 0 when all three calls passed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${REHEARSE_DIR:-/tmp/reflexdb-rehearse}
BASE_PYTHON=${REHEARSE_PYTHON:-/usr/bin/python3.11}
BUNDLE_PYTHON=${BUNDLE_PYTHON:-$REPO/.venv/bin/python}  # has the pins, the GGUF, torch for deepspeed
VENV=$DIR/venv
PYVER=$("$BASE_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

say() { printf '[rehearse] %s\n' "$*"; }

# The GPU image's packages that reflexdb, deepspeed, faiss and transformers can import. transformers
# as on the image (5.17); torch is 2.13 CPU here (2.11 cu130 there).
IMAGE_SUBSET=(
  numpy pyyaml safetensors "transformers==${REHEARSE_TRANSFORMERS:-5.17.0}" tokenizers huggingface-hub typer click
  rich shellingham pyarrow pandas psutil py-cpuinfo msgpack ninja einops nvidia-ml-py packaging tqdm protobuf
  requests cloudpickle jinja2 markupsafe filelock fsspec regex typing-extensions sympy mpmath networkx six
  python-dateutil urllib3 idna certifi charset-normalizer pygments markdown-it-py mdurl httpx anyio h11 httpcore
  attrs setuptools wheel zipp
)
# Not in the image's list, yet the image must have them for its own transformers to import.
IMAGE_IMPLIED=(huggingface-hub)

# --- 1. the image-like venv ---------------------------------------------------------------------------
if [[ ${REHEARSE_FRESH:-0} == 1 || ! -f $VENV/.complete ]]; then
  say "building $VENV (Python $PYVER): torch 2.13.0 CPU and ${#IMAGE_SUBSET[@]} image packages"
  "$BASE_PYTHON" -m venv --clear "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 "${IMAGE_SUBSET[@]}"
  extras=$("$VENV/bin/python" -I - "$REPO/benchmarks/gpu/bundle.py" "${IMAGE_IMPLIED[@]}" <<'EOF'
import importlib.metadata as md, importlib.util, sys
spec = importlib.util.spec_from_file_location("bundle", sys.argv[1])
bundle = sys.modules["bundle"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)
allowed = bundle.IMAGE_PACKAGES | {bundle.normalize(n) for n in sys.argv[2:]}
names = {bundle.normalize(d.metadata["Name"]) for d in md.distributions()}
print(" ".join(sorted(n for n in names if n not in allowed and not bundle.NEVER_CARRIED.match(n))))
EOF
)
  if [[ -n $extras ]]; then
    say "not in the image's list, uninstalled: $extras"
    "$VENV/bin/python" -m pip uninstall -q -y $extras
  fi
  touch "$VENV/.complete"
else
  say "reusing $VENV (REHEARSE_FRESH=1 rebuilds it)"
fi

# --- 2. the working tree a call sends, and its parts ------------------------------------------------
say "copying the working tree to $DIR/repo"
rm -rf "$DIR/repo" "$DIR/root" "$DIR"/out?
mkdir -p "$DIR/repo"
(cd "$REPO" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf -) | tar -xf - -C "$DIR/repo"
git -C "$DIR/repo" init -q  # bundle.py asks git for the tree's size and the exclude file
if [[ -n ${REHEARSE_SUITE:-} ]]; then
  cp "$REHEARSE_SUITE" "$DIR/repo/benchmarks/gpu/suite.py"
  say "suite: $REHEARSE_SUITE"
fi
[[ -f $DIR/repo/benchmarks/gpu/suite.py ]] || { say "no benchmarks/gpu/suite.py: set REHEARSE_SUITE=stub.py"; exit 2; }
"$BUNDLE_PYTHON" "$DIR/repo/benchmarks/gpu/bundle.py" --python-version "$PYVER" --out "$DIR/repo/.whl"

# --- 3. the three calls on one warm ROOT ------------------------------------------------------------
status=()
for call in 1 2 3; do
  say "call $call"
  start=$SECONDS
  if (cd "$DIR/repo" && PYTHON=$VENV/bin/python REFLEXDB_GPU_ROOT=$DIR/root OUT=$DIR/out$call \
        bash benchmarks/gpu/device.sh "$call" --dry-run); then
    status+=("call $call passed ($((SECONDS - start)) s)")
  else
    status+=("call $call FAILED ($((SECONDS - start)) s)")
  fi
done
printf '[rehearse] %s\n' "${status[@]}"
[[ ${status[*]} != *FAILED* ]]
