#!/bin/bash
# Another framework's rollouts replayed in reflexdb (docs/export.md, "Training on imported groups").
#
# Takes the completions a TRL GRPOTrainer run trained on (benchmarks/experiments/vs_trl.py leaves them as
# <TRL arm's home>/rollouts.jsonl: chat prompt, completion text, reward), imports them, and trains
# on them two ways, each in a fresh REFLEXDB_HOME, for as many steps as TRL took:
#
#   offline  the learner alone on the imported groups (learner.imported_per_step = groups_per_step,
#            no collector): off-policy data, π_old = the learner's own weights;
#   beside   the quickstart (`reflexdb run`) with 1 imported group + 3 of its own per step.
#
# Each prints held-out pass@1 (reflexdb eval, the quickstart's 8 tasks x 16 samples) and its time.
#
#   bash benchmarks/replay_trl.sh TRL_ROLLOUTS_JSONL [WORK_DIR]
#
# TRL_STEPS=11-20 keeps only the rollouts of those TRL steps (e.g. a trained policy's, far from
# the base weights the learner starts from); MODES=offline runs only the first way.
set -euo pipefail
SRC=${1:?a rollouts.jsonl from benchmarks/experiments/vs_trl.py}
WORK=${2:-$(mktemp -d /tmp/replay-trl-XXXX)}
MODES=${MODES:-offline beside}
mkdir -p "$WORK"
R="python -m reflexdb.cli.main"
C=examples/arithmetic-grpo.yaml
export HF_HUB_OFFLINE=1
if [ -n "${TRL_STEPS:-}" ]; then
  [[ $TRL_STEPS =~ ^[0-9]+-[0-9]+$ ]] || { echo "TRL_STEPS must be FIRST-LAST, e.g. 11-20 (got '$TRL_STEPS')" >&2; exit 2; }
  python -c "
import json, sys
lo, hi = map(int, sys.argv[1].split('-'))
for line in open(sys.argv[2]):
    if lo <= json.loads(line)['trl_step'] <= hi:
        sys.stdout.write(line)" "$TRL_STEPS" "$SRC" > "$WORK/rollouts.jsonl"
  SRC=$WORK/rollouts.jsonl
fi
steps=$(python -c "import json,sys; print(len({json.loads(l)['trl_step'] for l in open(sys.argv[1])}))" "$SRC")
echo "$(date -u +%FT%T) load $(cut -d' ' -f1 /proc/loadavg); $(wc -l < "$SRC") TRL rollouts of ${TRL_STEPS:-all} steps, $steps steps; work in $WORK"

if [[ " $MODES " == *" offline "* ]]; then
echo "== offline: imported groups only"
export REFLEXDB_HOME=$WORK/offline
S="--set run=trl-offline --set learner.imported_per_step=4"
$R import "$SRC" -c $C $S --dataset trl --batch-size 32
/usr/bin/time -f "learn: %e s wall" $R learn -c $C $S --max-steps "$steps" --max-seconds 100000
$R eval -c $C $S --checkpoint latest --json
$R sql "SELECT count(*) AS steps, round(avg((metrics->>'imported/groups')::numeric), 2) AS imported_groups,
        round(avg((metrics->>'imported/reward_mean')::numeric), 3) AS imported_reward FROM learner_steps"

fi

if [[ " $MODES " == *" beside "* ]]; then
echo "== beside: 1 imported + 3 own groups per step"
export REFLEXDB_HOME=$WORK/beside
S="--set run=trl-beside --set learner.imported_per_step=1"
$R import "$SRC" -c $C $S --dataset trl --batch-size 32
/usr/bin/time -f "run: %e s wall" $R run $C $S --max-steps "$steps" --max-seconds 100000
$R sql "SELECT count(*) AS steps, sum((metrics->>'imported/groups')::numeric) AS imported_groups,
        round(avg((metrics->>'reward/pass_at_1')::numeric), 3) AS own_pass_at_1,
        round(extract(epoch FROM max(created_at) - min(created_at))::numeric, 1) AS seconds_first_to_last_step
        FROM learner_steps"
fi
