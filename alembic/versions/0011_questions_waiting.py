"""conversation.questions: the questions that wait for the user's answer

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 02:40:00

A permission or AskUserQuestion question is a pending entry until it is answered, denied or
expired. The conversation counts them (kept by app/store.py with every entry it adds or
changes, as message_count is), so the conversation list shows which conversations wait for
the user without reading their timelines. Counted once here from the stored entries.
"""

from alembic import op
import sqlalchemy as sa

BIGINT = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')  # as 0006's message_count


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('questions', BIGINT, nullable=False, server_default='0'))
    op.execute(
        "UPDATE conversation SET questions = (SELECT count(*) FROM entry"
        " WHERE entry.conversation_id = conversation.id AND entry.state = 'pending')"
    )


def downgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.drop_column('questions')
