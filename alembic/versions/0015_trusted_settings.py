"""conversation.trusted_settings: the Claude Code project files trusted for its folder

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 18:30:00

The project files (app/trust.py) a Claude Code conversation's folder had when it was created,
trusted then (the user's tick, Claude Code's own record, or none found); the files trusted
since from a line that named new ones. An agent start with a file not in it asks again. NULL
(every conversation so far, and those of other providers): the next start records what it
finds, asking nothing (the question was asked at creation, as before).
"""

from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trusted_settings', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.drop_column('trusted_settings')
