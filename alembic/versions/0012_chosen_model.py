"""conversation.chosen_model: the model the user chose for a Claude Code conversation

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 09:05:00

NULL (every conversation so far) is the provider's default (OARLOCK_CLAUDE_MODEL, or Claude
Code's own). conversation.model stays what the agent last said it uses.
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('chosen_model', sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.drop_column('chosen_model')
