"""Initial schema: every table of docs/store.md and the views failures, group_stats, staleness.

Revision ID: 0001
Revises: 
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

# Views this revision creates, from reflexdb/sql/views/<name>.sql.
VIEWS = ('failures', 'group_stats', 'staleness')


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('algorithm', sa.Text(), nullable=True),
    sa.Column('config', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('embedding_dim', sa.Integer(), nullable=True),
    sa.Column('embedding_model', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('name', name=op.f('uq_runs_name'))
    )
    op.create_table('learner_steps',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('metrics', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_learner_steps_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_learner_steps')),
    sa.UniqueConstraint('run_id', 'step', name=op.f('uq_learner_steps_run_id_step'))
    )
    op.create_table('policy_versions',
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('checkpoint_uri', sa.Text(), nullable=False),
    sa.Column('sha256', sa.Text(), nullable=True),
    sa.Column('step', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('version >= 0', name=op.f('ck_policy_versions_version_nonnegative')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_policy_versions_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'version', name=op.f('pk_policy_versions'))
    )
    op.create_table('run_settings',
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_run_settings_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'key', name=op.f('pk_run_settings'))
    )
    op.create_table('tasks',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('dataset', sa.Text(), nullable=False),
    sa.Column('split', sa.Text(), server_default='train', nullable=False),
    sa.Column('task_key', sa.Text(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('ground_truth', sa.Text(), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('retired', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('claimed_by', sa.Text(), nullable=True),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('times_collected', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_tasks_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tasks')),
    sa.UniqueConstraint('run_id', 'dataset', 'split', 'task_key', name=op.f('uq_tasks_run_id_dataset_split_task_key'))
    )
    op.create_index(op.f('ix_tasks_run_id_split_retired'), 'tasks', ['run_id', 'split', 'retired'], unique=False)
    op.create_table('groups',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('task_id', sa.BigInteger(), nullable=False),
    sa.Column('workflow', sa.Text(), server_default='group', nullable=False),
    sa.Column('kind', sa.Text(), server_default='fresh', nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('size', sa.SmallInteger(), nullable=False),
    sa.Column('collector', sa.Text(), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('fresh', 'replay', 'hinted', 'retry', 'eval')", name=op.f('ck_groups_kind')),
    sa.CheckConstraint('size > 0', name=op.f('ck_groups_size_positive')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_groups_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_groups_task_id_tasks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_groups'))
    )
    op.create_index(op.f('ix_groups_run_id_id'), 'groups', ['run_id', 'id'], unique=False)
    op.create_index(op.f('ix_groups_task_id'), 'groups', ['task_id'], unique=False)
    op.create_table('hints',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('group_id', sa.BigInteger(), nullable=False),
    sa.Column('task_id', sa.BigInteger(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('wrong_answers', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'::text[]"), nullable=False),
    sa.Column('hinted_prompt', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('concise', 'wrong_answers', 'concise_wrong_answers')", name=op.f('ck_hints_kind')),
    sa.ForeignKeyConstraint(['group_id'], ['groups.id'], name=op.f('fk_hints_group_id_groups'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_hints_task_id_tasks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_hints'))
    )
    op.create_index(op.f('ix_hints_group_id'), 'hints', ['group_id'], unique=False)
    op.create_table('trajectories',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('group_id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('task_id', sa.BigInteger(), nullable=False),
    sa.Column('index_in_group', sa.SmallInteger(), nullable=False),
    sa.Column('origin', sa.Text(), server_default='base', nullable=False),
    sa.Column('parent_trajectory_id', sa.BigInteger(), nullable=True),
    sa.Column('reflection_id', sa.BigInteger(), nullable=True),
    sa.Column('hint_id', sa.BigInteger(), nullable=True),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('correct', sa.Boolean(), nullable=True),
    sa.Column('truncated', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('finish_reason', sa.Text(), server_default='stop', nullable=False),
    sa.Column('extracted_answer', sa.Text(), nullable=True),
    sa.Column('confidence', sa.Float(), nullable=True),
    sa.Column('num_turns', sa.SmallInteger(), server_default=sa.text('1'), nullable=False),
    sa.Column('response_length', sa.Integer(), nullable=False),
    sa.Column('times_sampled', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("finish_reason IN ('stop', 'length', 'error', 'abort')", name=op.f('ck_trajectories_finish_reason')),
    sa.CheckConstraint("origin IN ('base', 'distilled', 'guided_retry', 'hinted', 'purified', 'raw', 'replayed')", name=op.f('ck_trajectories_origin')),
    sa.CheckConstraint('confidence IS NULL OR (confidence >= 0 AND confidence <= 1)', name=op.f('ck_trajectories_confidence_range')),
    sa.CheckConstraint('reward IS NULL OR reward = reward', name=op.f('ck_trajectories_reward_not_nan')),
    sa.ForeignKeyConstraint(['group_id'], ['groups.id'], name=op.f('fk_trajectories_group_id_groups'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['parent_trajectory_id'], ['trajectories.id'], name=op.f('fk_trajectories_parent_trajectory_id_trajectories'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_trajectories_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_trajectories_task_id_tasks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_trajectories')),
    sa.UniqueConstraint('group_id', 'index_in_group', name=op.f('uq_trajectories_group_id_index_in_group'))
    )
    op.create_index(op.f('ix_trajectories_parent_trajectory_id'), 'trajectories', ['parent_trajectory_id'], unique=False)
    op.create_index(op.f('ix_trajectories_run_id_id'), 'trajectories', ['run_id', 'id'], unique=False)
    op.create_index(op.f('ix_trajectories_task_id_correct'), 'trajectories', ['task_id', 'correct'], unique=False)
    op.create_table('consumption',
    sa.Column('step_id', sa.BigInteger(), nullable=False),
    sa.Column('trajectory_id', sa.BigInteger(), nullable=False),
    sa.Column('group_id', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['group_id'], ['groups.id'], name=op.f('fk_consumption_group_id_groups'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['step_id'], ['learner_steps.id'], name=op.f('fk_consumption_step_id_learner_steps'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_consumption_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('step_id', 'trajectory_id', name=op.f('pk_consumption'))
    )
    op.create_index(op.f('ix_consumption_group_id'), 'consumption', ['group_id'], unique=False)
    op.create_index(op.f('ix_consumption_trajectory_id'), 'consumption', ['trajectory_id'], unique=False)
    op.create_table('embeddings',
    sa.Column('trajectory_id', sa.BigInteger(), nullable=False),
    sa.Column('model', sa.Text(), nullable=False),
    sa.Column('layer', sa.Integer(), nullable=False),
    sa.Column('dim', sa.Integer(), nullable=False),
    sa.Column('vector', postgresql.ARRAY(sa.REAL()), nullable=False),
    sa.CheckConstraint('array_length(vector, 1) = dim', name=op.f('ck_embeddings_dim_matches')),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_embeddings_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('trajectory_id', name=op.f('pk_embeddings'))
    )
    op.create_table('purifications',
    sa.Column('trajectory_id', sa.BigInteger(), nullable=False),
    sa.Column('turn_index', sa.SmallInteger(), nullable=False),
    sa.Column('attempts', sa.SmallInteger(), nullable=False),
    sa.Column('recovered', sa.Boolean(), nullable=False),
    sa.Column('similarity', sa.Float(), nullable=True),
    sa.Column('replacement', sa.Text(), nullable=True),
    sa.Column('error_text', sa.Text(), nullable=True),
    sa.Column('failed_code', sa.Text(), nullable=True),
    sa.Column('corrected_code', sa.Text(), nullable=True),
    sa.CheckConstraint("replacement IS NULL OR replacement IN ('shallow', 'deep')", name=op.f('ck_purifications_replacement')),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_purifications_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('trajectory_id', 'turn_index', name=op.f('pk_purifications'))
    )
    op.create_table('reflections',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('trajectory_id', sa.BigInteger(), nullable=False),
    sa.Column('raw_text', sa.Text(), nullable=False),
    sa.Column('parsed', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('pivot', sa.Integer(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.Column('root_cause', sa.Text(), nullable=True),
    sa.Column('valid', sa.Boolean(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("outcome IS NULL OR outcome IN ('success', 'success_but_inefficient', 'failure')", name=op.f('ck_reflections_outcome')),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_reflections_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_reflections'))
    )
    op.create_index(op.f('ix_reflections_trajectory_id'), 'reflections', ['trajectory_id'], unique=False)
    op.create_table('token_payloads',
    sa.Column('trajectory_id', sa.BigInteger(), nullable=False),
    sa.Column('prompt_ids', postgresql.ARRAY(sa.Integer()), nullable=False),
    sa.Column('response_ids', postgresql.ARRAY(sa.Integer()), nullable=False),
    sa.Column('logprobs', postgresql.ARRAY(sa.REAL()), nullable=False),
    sa.Column('token_policy_versions', postgresql.ARRAY(sa.Integer()), nullable=False),
    sa.Column('loss_mask', postgresql.ARRAY(sa.Boolean()), nullable=False),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_token_payloads_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('trajectory_id', name=op.f('pk_token_payloads'))
    )
    op.create_table('turns',
    sa.Column('trajectory_id', sa.BigInteger(), nullable=False),
    sa.Column('turn_index', sa.SmallInteger(), nullable=False),
    sa.Column('role', sa.Text(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('token_start', sa.Integer(), nullable=True),
    sa.Column('token_end', sa.Integer(), nullable=True),
    sa.Column('trainable', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('tool_error', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.CheckConstraint("role IN ('system', 'user', 'assistant', 'tool', 'observation')", name=op.f('ck_turns_role')),
    sa.CheckConstraint('token_start IS NULL OR (token_start >= 0 AND token_end >= token_start)', name=op.f('ck_turns_span')),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name=op.f('fk_turns_trajectory_id_trajectories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('trajectory_id', 'turn_index', name=op.f('pk_turns'))
    )

    # trajectories <-> reflections / hints reference each other: add these after both exist.
    op.create_foreign_key(op.f('fk_trajectories_reflection_id_reflections'), 'trajectories', 'reflections',
                          ['reflection_id'], ['id'], ondelete='SET NULL')
    op.create_foreign_key(op.f('fk_trajectories_hint_id_hints'), 'trajectories', 'hints',
                          ['hint_id'], ['id'], ondelete='SET NULL')
    create_views(('group_stats',))
    create_views(('failures',), version="0001")  # 0012 changed failures: this revision's copy
    create_views(('staleness',), version="0001")  # 0011 changed staleness: this revision's copy

def downgrade() -> None:
    drop_views(VIEWS)
    op.drop_constraint(op.f('fk_trajectories_reflection_id_reflections'), 'trajectories', type_='foreignkey')
    op.drop_constraint(op.f('fk_trajectories_hint_id_hints'), 'trajectories', type_='foreignkey')
    op.drop_table('turns')
    op.drop_table('token_payloads')
    op.drop_index(op.f('ix_reflections_trajectory_id'), table_name='reflections')
    op.drop_table('reflections')
    op.drop_table('purifications')
    op.drop_table('embeddings')
    op.drop_index(op.f('ix_consumption_trajectory_id'), table_name='consumption')
    op.drop_index(op.f('ix_consumption_group_id'), table_name='consumption')
    op.drop_table('consumption')
    op.drop_index(op.f('ix_trajectories_task_id_correct'), table_name='trajectories')
    op.drop_index(op.f('ix_trajectories_run_id_id'), table_name='trajectories')
    op.drop_index(op.f('ix_trajectories_parent_trajectory_id'), table_name='trajectories')
    op.drop_table('trajectories')
    op.drop_index(op.f('ix_hints_group_id'), table_name='hints')
    op.drop_table('hints')
    op.drop_index(op.f('ix_groups_task_id'), table_name='groups')
    op.drop_index(op.f('ix_groups_run_id_id'), table_name='groups')
    op.drop_table('groups')
    op.drop_index(op.f('ix_tasks_run_id_split_retired'), table_name='tasks')
    op.drop_table('tasks')
    op.drop_table('run_settings')
    op.drop_table('policy_versions')
    op.drop_table('learner_steps')
    op.drop_table('runs')
