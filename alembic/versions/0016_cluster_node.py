"""cluster_node: each live relay node's Redis epoch and lease, written at its heartbeats

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 19:00:00

Nodes whose OARLOCK_REDIS_URL names different Redis databases share PostgreSQL but nothing
else: a start beside a live node whose Redis has another epoch is refused
(app/cluster/same_redis.py). Empty on a single relay.
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'cluster_node',
        sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('epoch', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('lease', sa.Float(), nullable=False),
        sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )


def downgrade() -> None:
    op.drop_table('cluster_node')
