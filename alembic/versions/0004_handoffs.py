"""handoffs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:00:00
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel

BIGINT = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')  # 64-bit ids on PostgreSQL


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('handoff',
    sa.Column('id', BIGINT, nullable=False),
    sa.Column('cwd', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('done', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('next', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('files', sa.JSON(), nullable=False),
    sa.Column('source', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('conversation_id', BIGINT, nullable=True),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversation.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('handoff', schema=None) as batch_op:
        batch_op.create_index('ix_handoff_cwd_id', ['cwd', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('handoff', schema=None) as batch_op:
        batch_op.drop_index('ix_handoff_cwd_id')
    op.drop_table('handoff')
