"""cluster leases: which relay node runs each conversation's agent

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 23:00:00
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel

BIGINT = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')  # 64-bit ids on PostgreSQL


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('lease',
    sa.Column('conversation_id', BIGINT, autoincrement=False, nullable=False),
    sa.Column('node', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('conversation_id')
    )
    with op.batch_alter_table('lease', schema=None) as batch_op:
        batch_op.create_index('ix_lease_node', ['node'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('lease', schema=None) as batch_op:
        batch_op.drop_index('ix_lease_node')
    op.drop_table('lease')
