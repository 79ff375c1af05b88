#!/bin/bash
# Offline training on a finished run's experience (docs/export.md, "Training on imported groups").
#
# Exports the groups a finished quickstart run trained on (with their token ids and rewards),
# imports them into a new run in a fresh REFLEXDB_HOME, and trains on them alone
# (learner.imported_per_step = groups_per_step, no collector) for as many steps; then evaluates
# and compares each published version's sha256 with the source run's.
#
#   bash benchmarks/offline_replay.sh SOURCE_REFLEXDB_HOME [WORK_DIR]
#
# SOURCE_REFLEXDB_HOME: the REFLEXDB_HOME of a finished `reflexdb run examples/arithmetic-grpo.yaml`
# (benchmarks/experiments/vs_trl.py leaves one per reflexdb arm).
set -euo pipefail
SRC=${1:?the source run\'s REFLEXDB_HOME}
WORK=${2:-$(mktemp -d /tmp/offline-replay-XXXX)}
mkdir -p "$WORK"
R="python -m reflexdb.cli.main"
C=examples/arithmetic-grpo.yaml
S="--set run=offline-replay --set learner.imported_per_step=4"
export HF_HUB_OFFLINE=1
echo "$(date -u +%FT%T) load $(cut -d' ' -f1 /proc/loadavg); work in $WORK"
REFLEXDB_HOME=$SRC $R export --out "$WORK/rollouts.parquet" "
  SELECT t.id AS trajectory_id, t.reward, t.correct, k.task_key, k.ground_truth, g.policy_version
  FROM trajectories t JOIN groups g ON g.id = t.group_id JOIN tasks k ON k.id = t.task_id
  WHERE g.kind = 'fresh' AND EXISTS (SELECT 1 FROM consumption c WHERE c.group_id = g.id)
  ORDER BY g.id, t.index_in_group"
export REFLEXDB_HOME=$WORK/home
$R import "$WORK/rollouts.parquet" -c $C $S
steps=$(REFLEXDB_HOME=$SRC $R sql --max-width 0 "SELECT max(step) FROM learner_steps" | sed -n 3p | tr -d ' ')
/usr/bin/time -f "learn: %e s wall" $R learn -c $C $S --max-steps "$steps" --max-seconds 100000
$R eval -c $C $S --checkpoint latest --json
q="SELECT version, sha256 FROM policy_versions ORDER BY version"
if diff <(REFLEXDB_HOME=$SRC $R sql --max-width 0 "$q") <($R sql --max-width 0 "$q") > /dev/null; then
  echo "every published version has the source run's sha256"
else
  echo "the weights differ from the source run's"
fi
