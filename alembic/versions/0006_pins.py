"""pins, the message count, the carry-over record

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 22:40:00

A pin table (pinned messages, copied into a compacted conversation's successor),
conversation.message_count (user and agent messages that reached the agent, counted once
here and kept by app/store.py) and conversation.carry (what a compaction carried and left out).
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel

BIGINT = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')  # 64-bit ids on PostgreSQL


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pin',
    sa.Column('id', BIGINT, nullable=False),
    sa.Column('conversation_id', BIGINT, nullable=False),
    sa.Column('entry_id', BIGINT, nullable=False),
    sa.Column('source_id', BIGINT, nullable=False),
    sa.Column('source_seq', BIGINT, nullable=False),
    sa.Column('role', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('text', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversation.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('conversation_id', 'entry_id', name='uq_pin_conversation_entry')
    )
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('message_count', BIGINT, nullable=False, server_default='0')
        )
        batch_op.add_column(sa.Column('carry', sa.JSON(), nullable=True))
    op.execute(
        "UPDATE conversation SET message_count = (SELECT count(*) FROM entry"
        " WHERE entry.conversation_id = conversation.id AND entry.kind IN ('user', 'agent')"
        " AND entry.state != 'queued')"
    )


def downgrade() -> None:
    with op.batch_alter_table('conversation', schema=None) as batch_op:
        batch_op.drop_column('carry')
        batch_op.drop_column('message_count')
    op.drop_table('pin')
