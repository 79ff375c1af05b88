"""The experience store's tables, declared once in SQLAlchemy Core.

Alembic migrations (``migrations/versions``, and each method's branch) create and evolve the real
schema; this module is the declaration that ``tests/store/test_migrations.py`` compares a migrated
database against. Change both together. A method declares its own tables on :data:`metadata` in
its package (``methods/<name>/tables.py``, registered in ``reflexdb.plugins.TABLES``);
:func:`full_metadata` imports them.

Layout rules:
- Narrow, scannable rows (``trajectories``, ``groups``) are separate from wide payloads
  (``token_bytes``, ``embeddings``) so views that scan outcomes never touch token arrays.
- Per-token arrays are little-endian ``bytea`` (``token_bytes``): written and read as one block
  each; the views ``token_payloads`` and ``trajectory_tokens`` give them back as ``int4[]``,
  ``real[]`` and ``bool[]``. Embedding vectors are native ``float4[]``.
- Every column is queryable: no pickled blobs. ``meta`` columns are JSONB for small extras.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, REAL, UUID

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: Values allowed in ``turns.role``.
ROLES = ("system", "user", "assistant", "tool", "observation")
#: Values allowed in ``trajectories.finish_reason``.
FINISH_REASONS = ("stop", "length", "error", "abort")
#: Rows of ``token_bytes`` up to this many bytes are stored inline and uncompressed, two to a page
#: (PostgreSQL's default, 2032, would compress or move out of line any response over ~150 tokens;
#: 8160, one row a page, left half of most pages empty for responses of 300 tokens: measured, 0015).
TOAST_TUPLE_TARGET = 4080


def one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def created_at() -> Column:
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now())


# One row per run (a YAML file's `run:`): the config it was started with, whole, and its method.
runs = Table(
    "runs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("algorithm", Text),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Fixed on the first group written with an embedding; later vectors must match it.
    Column("embedding_dim", Integer),
    Column("embedding_model", Text),
    created_at(),
)

# Per-run settings the SQL views read (e.g. NexGRPO's confidence gate), so views stay plain
# views a person can SELECT from. One row per key; value is JSON (number, string, bool, ...).
run_settings = Table(
    "run_settings",
    metadata,
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("key", Text, nullable=False),
    Column("value", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("run_id", "key"),
)

# The run's prompts (its train and eval splits) with their ground truth, and the collectors' claims.
tasks = Table(
    "tasks",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("dataset", Text, nullable=False),
    Column("split", Text, nullable=False, server_default="train"),
    # The task's identity inside its dataset (line number, hash, generator seed...).
    Column("task_key", Text, nullable=False),
    Column("prompt", Text, nullable=False),
    Column("ground_truth", Text),
    Column("meta", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Work claiming by collectors (FOR UPDATE SKIP LOCKED).
    Column("claimed_by", Text),
    Column("claimed_at", DateTime(timezone=True)),
    Column("times_collected", Integer, nullable=False, server_default=text("0")),
    # NexGRPO soft retirement (METHODS.md §3): turns a retired task was passed over (not drawn).
    # Whether a task is retired is the view nexgrpo_retired_tasks, computed from its groups.
    Column("times_passed", Integer, nullable=False, server_default=text("0")),
    created_at(),
    UniqueConstraint("run_id", "dataset", "split", "task_key"),
    Index(None, "run_id", "split"),
)

# Each published policy: the version collectors sample with, where its weights are, the step that made it.
policy_versions = Table(
    "policy_versions",
    metadata,
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("version", Integer, nullable=False),
    Column("checkpoint_uri", Text, nullable=False),
    Column("sha256", Text),
    Column("step", Integer, nullable=False, server_default=text("0")),
    Column("meta", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    created_at(),
    # the sha256 of the version's manifest.json as uploaded (0029): every file of a version in
    # object storage is checked through it; NULL for a local directory and for older versions
    Column("manifest_sha256", Text),
    PrimaryKeyConstraint("run_id", "version"),
    CheckConstraint("version >= 0", name="version_nonnegative"),
)

# What kind of group a group is, and what that means downstream (0020; reflexdb/origins.py): a
# method's revision inserts its own rows, as with origins.
group_kinds = Table(
    "group_kinds",
    metadata,
    Column("name", Text, primary_key=True),
    Column("trained", Boolean, nullable=False),
    Column("pass_at_1", Boolean, nullable=False),
    Column("method", Text),
    Column("summary", Text, nullable=False),
    # 0027: its groups hold the policy's rollouts of the task's plain prompt (task_latest_group,
    # admission control); the batch queue the learner ranks them in (untrained_groups)
    Column("rollouts", Boolean, nullable=False, server_default=text("false")),
    Column("queue", Text, nullable=False, server_default="main"),
)

# A group: the trajectories sampled for one task, written in one transaction; its kind a row of group_kinds.
groups = Table(
    "groups",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("task_id", BigInteger, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("workflow", Text, nullable=False, server_default="group"),
    Column("kind", Text, ForeignKey("group_kinds.name"), nullable=False, server_default="fresh"),
    # The policy version the group's on-policy samples were generated with.
    Column("policy_version", Integer, nullable=False),
    Column("size", SmallInteger, nullable=False),
    Column("collector", Text),
    Column("meta", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    created_at(),
    # The writing transaction's id (pg_current_xact_id()): with a learner step's recorded snapshot
    # it tells whether the step could see the group (view untrained_groups). NULL before 0005.
    Column("xact_id", BigInteger, server_default=text("(pg_current_xact_id())::text::bigint")),
    # Chosen by the writer once per group: a retried write whose first attempt did commit (the
    # connection dropped before the acknowledgement) finds its group instead of writing it twice.
    Column("write_key", UUID(as_uuid=True), unique=True),
    CheckConstraint("size > 0", name="size_positive"),
    Index(None, "run_id", "id"),
    Index(None, "run_id", "policy_version"),
    Index(None, "task_id"),
)

# Partitioned by run (0015): trajectories and the per-trajectory tables (turns, token_bytes,
# embeddings, consumption, and token_signals since 0028) have one partition per run, named <table>_r<run id>, created when the run
# is (the trigger on runs; sql/functions/create_run_partitions.sql) and dropped with it
# (drop_run_partitions.sql): a run's rows are scanned, vacuumed and dropped on their own. A key of
# a partitioned table includes run_id, so the tables that refer to a trajectory carry its run_id.
PARTITIONED = ("trajectories", "turns", "token_bytes", "embeddings", "consumption", "token_signals")
_BY_RUN = {"postgresql_partition_by": "LIST (run_id)"}

# Where a trajectory may come from, and what that means downstream (0018; reflexdb/origins.py): a
# method's revision inserts its own rows.
origins = Table(
    "origins",
    metadata,
    Column("name", Text, primary_key=True),
    Column("pi_old", Text, nullable=False),
    Column("pass_at_1", Boolean, nullable=False),
    Column("sampled", Boolean, nullable=False),
    Column("method", Text),
    Column("summary", Text, nullable=False),
    # its failed rows are listed in view failures (0021): false for a copy or a part of an attempt
    Column("in_failures", Boolean, nullable=False, server_default=true()),
    CheckConstraint(one_of("pi_old", ("policy", "stored", "learner")), name="pi_old"),
)

# The views that are the UNION ALL of the parts methods contribute (0021; the SQL function
# compose_view): group_holds, failure_notes, with their columns and types.
composed_views = Table(
    "composed_views",
    metadata,
    Column("name", Text, primary_key=True),
    Column("columns", ARRAY(Text), nullable=False),
    Column("types", ARRAY(Text), nullable=False),
)

# One sampled (or replayed, imported, ...) response with its outcome, in its group; its token arrays are in
# token_bytes, its turns in turns. A method's links from a row to its own rows (a reflection, a hint)
# live in the method's tables (trajectory_reflections, trajectory_hints), not here: the columns
# reflection_id and hint_id moved out in the methods' branches (r3l_0001, lte_0001).
trajectories = Table(
    "trajectories",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("group_id", BigInteger, ForeignKey("groups.id", ondelete="CASCADE"), nullable=False),
    # run_id and task_id repeat the group's so pool views scan one table.
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("task_id", BigInteger, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("index_in_group", SmallInteger, nullable=False),
    Column("origin", Text, nullable=False, server_default="base"),
    # Lineage: distilled / guided retry -> base, purified -> raw, replayed -> stored original. No
    # foreign key (0015; a partition referring to itself could not be dropped): the store checks that
    # the parent exists when it writes the row.
    Column("parent_trajectory_id", BigInteger),
    # The policy version that sampled the row (a replayed copy keeps its original's).
    Column("policy_version", Integer, nullable=False),
    Column("reward", Float),  # NULL when the reward function failed (see error)
    Column("correct", Boolean),
    Column("truncated", Boolean, nullable=False, server_default=text("false")),
    Column("finish_reason", Text, nullable=False, server_default="stop"),
    Column("extracted_answer", Text),
    # exp(mean token log-prob under the behaviour policy), NexGRPO's confidence.
    Column("confidence", Float),
    Column("num_turns", SmallInteger, nullable=False, server_default=text("1")),
    Column("response_length", Integer, nullable=False),
    Column("times_sampled", Integer, nullable=False, server_default=text("0")),
    Column("error", Text),
    Column("meta", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    created_at(),
    PrimaryKeyConstraint("id", "run_id"),
    UniqueConstraint("group_id", "index_in_group", "run_id"),
    CheckConstraint(one_of("finish_reason", FINISH_REASONS), name="finish_reason"),
    CheckConstraint("reward IS NULL OR reward = reward", name="reward_not_nan"),
    CheckConstraint("confidence IS NULL OR (confidence >= 0 AND confidence <= 1)", name="confidence_range"),
    # A row of table origins (0018): what the collector and the learner read of a row's origin.
    ForeignKeyConstraint(["origin"], ["origins.name"]),
    Index(None, "task_id", "correct"),
    Index(None, "parent_trajectory_id"),
    **_BY_RUN,
)


def of_trajectory(ondelete: str = "CASCADE") -> ForeignKeyConstraint:
    """The composite reference to a trajectory: (trajectory_id, run_id) -> trajectories (id, run_id)."""
    return ForeignKeyConstraint(["trajectory_id", "run_id"], ["trajectories.id", "trajectories.run_id"],
                                ondelete=ondelete)

# The conversation of a trajectory, one row per turn: the prompt's turns, then the assistant's and the
# environment's, each with its span of the response tokens.
turns = Table(
    "turns",
    metadata,
    Column("trajectory_id", BigInteger, nullable=False),
    Column("turn_index", SmallInteger, nullable=False),
    Column("role", Text, nullable=False),
    Column("text", Text, nullable=False),
    # [token_start, token_end) in the trajectory's response_ids; NULL for turns that are part of
    # the prompt (the system and first user message).
    Column("token_start", Integer),
    Column("token_end", Integer),
    Column("trainable", Boolean, nullable=False, server_default=text("false")),
    Column("tool_error", Boolean, nullable=False, server_default=text("false")),
    # Multi-turn episodes (0007): the attempt the turn belongs to (an assistant turn and the
    # environment's feedback on it share it; NULL for prompt turns) and, on assistant turns, what
    # the environment made of the turn.
    Column("attempt", SmallInteger),
    Column("answer", Text),
    Column("correct", Boolean),
    Column("reward", Float),
    Column("run_id", BigInteger, nullable=False),  # the trajectory's (0015: the partition key)
    # On a tool turn, the call's record (0017): status, exit code, wall and CPU time, peak memory,
    # bytes of output, the code's size and SHA-256 (collector/sandbox.py, ToolResult.record; view
    # tool_calls). NULL on other turns.
    Column("tool_call", JSONB),
    PrimaryKeyConstraint("trajectory_id", "turn_index", "run_id"),
    of_trajectory(),
    CheckConstraint(one_of("role", ROLES), name="role"),
    CheckConstraint("token_start IS NULL OR (token_start >= 0 AND token_end >= token_start)", name="span"),
    **_BY_RUN,
)

# Per-token arrays, one bytea of little-endian values each (0014; docs/store.md, "Payload format"):
# the server sends a bytea as one block and numpy reads it with frombuffer, where native arrays
# cost a per-element encode and decode on both sides. People read them as arrays through the views
# token_payloads and trajectory_tokens (the SQL functions int4_array, float4_array, bool_array).
# Rows up to toast_tuple_target bytes stay inline and uncompressed (one heap fetch per read).
token_bytes = Table(
    "token_bytes",
    metadata,
    Column("trajectory_id", BigInteger, nullable=False),
    Column("prompt_ids", BYTEA, nullable=False),  # int32 LE
    Column("response_ids", BYTEA, nullable=False),  # int32 LE
    # log pi_beh(o_t) of each response token, as sampled (see docs/store.md), float32 LE; NULL when
    # unknown (imported trajectories, origin 'imported').
    Column("logprobs", BYTEA),
    # Policy version that produced each response token (partial rollouts can span versions), int32 LE.
    Column("token_policy_versions", BYTEA, nullable=False),
    Column("loss_mask", BYTEA, nullable=False),  # one byte per response token, 0 or 1
    CheckConstraint("length(prompt_ids) % 4 = 0 AND length(response_ids) % 4 = 0", name="whole_int4s"),
    CheckConstraint("logprobs IS NULL OR length(logprobs) = length(response_ids)", name="logprobs_length"),
    CheckConstraint("length(token_policy_versions) = length(response_ids)", name="versions_length"),
    CheckConstraint("4 * length(loss_mask) = length(response_ids)", name="mask_length"),
    Column("run_id", BigInteger, nullable=False),
    PrimaryKeyConstraint("trajectory_id", "run_id"),
    of_trajectory(),
    **_BY_RUN,  # each partition is created WITH (toast_tuple_target = TOAST_TUPLE_TARGET)
)

embeddings = Table(
    "embeddings",
    metadata,
    Column("trajectory_id", BigInteger, nullable=False),
    Column("model", Text, nullable=False),
    Column("layer", Integer, nullable=False),
    Column("dim", Integer, nullable=False),
    Column("vector", ARRAY(REAL), nullable=False),
    CheckConstraint("array_length(vector, 1) = dim", name="dim_matches"),
    Column("run_id", BigInteger, nullable=False),
    PrimaryKeyConstraint("trajectory_id", "run_id"),
    of_trajectory(),
    **_BY_RUN,
)

# One row per learner step: its loss and metrics (a method's hooks add theirs), the version it started from.
learner_steps = Table(
    "learner_steps",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("step", Integer, nullable=False),
    # The policy version the learner's weights had when the step started.
    Column("policy_version", Integer, nullable=False),
    Column("loss", Float),
    Column("metrics", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # pg_current_snapshot() of the query that chose the step's groups: which groups were committed
    # (visible) when the learner chose (view untrained_groups). NULL before 0005.
    Column("batch_snapshot", Text),
    created_at(),
    # The names of the step's advantage stages in order (0023): "group" (the group normalisation),
    # then each advantage transform by its registered name. NULL before 0023.
    Column("advantage_stages", ARRAY(Text)),
    UniqueConstraint("run_id", "step"),
)

# Which trajectories each learner step trained on (a row each), with their advantages.
consumption = Table(
    "consumption",
    metadata,
    Column("step_id", BigInteger, ForeignKey("learner_steps.id", ondelete="CASCADE"), nullable=False),
    Column("trajectory_id", BigInteger, nullable=False),
    Column("group_id", BigInteger, ForeignKey("groups.id", ondelete="CASCADE"), nullable=False),
    Column("run_id", BigInteger, nullable=False),  # the trajectory's (0015: the partition key)
    # The row's advantage after each of its step's advantage_stages (0023; the last is what the loss
    # used); an element NULL where the value was not finite. NULL for a row without an advantage (a
    # method's auxiliary rows) and before 0023.
    Column("advantages", ARRAY(REAL)),
    PrimaryKeyConstraint("step_id", "trajectory_id", "run_id"),
    of_trajectory(),
    Index(None, "trajectory_id"),
    Index(None, "group_id"),
    **_BY_RUN,
)

# What a learner step's loss used at each response token of a row it consumed (0028;
# trainer/losses/signals.py), one row beside the row's consumption record, written when
# learner.record_token_signals is on. Arrays of the row's response length, little-endian bytea like
# token_bytes: float16 (read as real[] with the SQL function float2_array; NaN where the loss gave the
# token no value), flags one byte each (bool_array).
token_signals = Table(
    "token_signals",
    metadata,
    Column("step_id", BigInteger, nullable=False),
    Column("trajectory_id", BigInteger, nullable=False),
    Column("run_id", BigInteger, nullable=False),  # the trajectory's (the partition key)
    # The advantage that multiplied each token's term (the row's, or per token: GRPO-λ's ε-weight),
    # float16; NULL when the loss gave the row none (SFT, or no loss token).
    Column("advantage", BYTEA),
    # log of the importance ratio that entered the clip: log π_θ − log π_old per token (GSPO: the
    # sequence's; GRPO-λ's ε-trace: the traced one), float16; NULL when the loss has no ratio.
    Column("log_ratio", BYTEA),
    # 1 where the clipped branch of the surrogate was the active one (its gradient removed), else 0.
    Column("clipped", BYTEA, nullable=False),
    # Entropy of the policy's distribution at each token at the step (nats, the sampling
    # temperature applied), float16.
    Column("entropy", BYTEA, nullable=False),
    CheckConstraint("length(entropy) = 2 * length(clipped)", name="entropy_length"),
    CheckConstraint("advantage IS NULL OR length(advantage) = length(entropy)", name="advantage_length"),
    CheckConstraint("log_ratio IS NULL OR length(log_ratio) = length(entropy)", name="log_ratio_length"),
    PrimaryKeyConstraint("trajectory_id", "step_id", "run_id"),
    ForeignKeyConstraint(["step_id", "trajectory_id", "run_id"],
                         ["consumption.step_id", "consumption.trajectory_id", "consumption.run_id"], ondelete="CASCADE"),
    **_BY_RUN,  # each partition is created WITH (toast_tuple_target = TOAST_TUPLE_TARGET)
)

# One row per collector process: liveness (heartbeat) and the run's collection statistics.
collectors = Table(
    "collectors",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("engine", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("policy_version", Integer),
    Column("status", Text, nullable=False, server_default="running"),
    Column("groups_written", Integer, nullable=False, server_default=text("0")),
    Column("trajectories_written", Integer, nullable=False, server_default=text("0")),
    Column("tokens_generated", BigInteger, nullable=False, server_default=text("0")),
    Column("reward_errors", Integer, nullable=False, server_default=text("0")),
    Column("skipped_rows", Integer, nullable=False, server_default=text("0")),
    # Groups the store refused for their content (0017): counted and skipped, never a crash; the
    # last refusal's reason beside it.
    Column("rejected_groups", Integer, nullable=False, server_default=text("0")),
    Column("last_rejection", Text),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_seen", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("stopped_at", DateTime(timezone=True)),
    # Rewards scored 0 for want of a verdict (0025): past collector.reward_timeout_s, or an answer
    # the verifier could not check (over its size cap, or past its own time limit).
    Column("unverified_rewards", Integer, nullable=False, server_default=text("0")),
    # Where its time went (0026): cumulative seconds per phase (generate, score, reward, write)
    # and `wall`, set by each heartbeat; the learner logs the run's sums to MLflow.
    Column("phase_seconds", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    CheckConstraint("status IN ('running', 'stopped', 'failed')", name="status"),
    UniqueConstraint("run_id", "name"),
)

#: reflexdb's own views, created by migrations from ``reflexdb/sql/views/<name>.sql``, in creation
#: order; a method's are the files of its package's ``sql/views/`` (:func:`views`).
VIEWS = (
    "failures", "group_stats", "staleness", "learner_eligible", "task_latest_group", "untrained_groups",
    "episode_turns", "token_payloads", "trajectory_tokens", "tool_calls",
)


def views() -> list[str]:
    """Every view: reflexdb's (:data:`VIEWS`), then each registered SQL folder's (``reflexdb.plugins.SQL``)."""
    from .sqlfile import folders

    return [*VIEWS, *(p.stem for _, folder in folders()[1:] for p in sorted((folder / "views").glob("*.sql")))]


def full_metadata() -> MetaData:
    """:data:`metadata` with every installed method's tables declared on it too (each package's module
    registered in ``reflexdb.plugins.TABLES``, imported here): what a migrated database holds."""
    import importlib

    from .plugins import LOADED, TABLES

    for _, module in TABLES.items():
        importlib.import_module(module)
    for _, plugin, _ in LOADED.values():  # a plug-in's archived tables: declared, or say which is not
        if plugin is not None and plugin.archived:
            plugin.check(tables=True)
    return metadata


#: SQL functions created by migrations from ``reflexdb/sql/functions/<name>.sql`` (the views call them).
FUNCTIONS = ("run_setting", "int4_array", "float4_array", "bool_array", "create_run_partitions", "drop_run_partitions",
             "runs_create_partitions", "run_partitions_size", "compose_view", "float2_array")
#: Views made by the function compose_view from the parts methods contribute (``<method>_<name>``).
COMPOSED_VIEWS = ("group_holds", "failure_notes", "group_hold_ends")
