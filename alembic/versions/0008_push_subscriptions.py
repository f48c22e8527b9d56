"""push subscriptions

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 23:00:00
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel

BIGINT = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')  # 64-bit ids on PostgreSQL


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('push_subscription',
    sa.Column('id', BIGINT, nullable=False),
    sa.Column('endpoint', sqlmodel.sql.sqltypes.AutoString(length=2048), nullable=False),
    sa.Column('p256dh', sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
    sa.Column('auth', sqlmodel.sql.sqltypes.AutoString(length=50), nullable=False),
    sa.Column('session_key', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
    sa.Column('token_tag', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['session_key'], ['login_session.key'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('endpoint')
    )


def downgrade() -> None:
    op.drop_table('push_subscription')
