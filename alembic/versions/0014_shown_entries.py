"""entry: an index of the entries a timeline page shows (those not queued)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:50:00

A page of a conversation is its last entries that are not queued. Read from the index of every
entry, a long queue took its place (a page of 20 with 20 queued showed no history); filtered
there, every queued row was read to skip it. This partial index holds only what a page shows.
"""

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

NOT_QUEUED = sa.text("state != 'queued'")


def upgrade() -> None:
    op.create_index(
        'ix_entry_conversation_shown_seq',
        'entry',
        ['conversation_id', 'seq'],
        sqlite_where=NOT_QUEUED,
        postgresql_where=NOT_QUEUED,
    )


def downgrade() -> None:
    op.drop_index('ix_entry_conversation_shown_seq', table_name='entry')
