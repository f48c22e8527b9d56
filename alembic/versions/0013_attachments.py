"""attachment: images the user attaches to a message

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 15:10:00

Uploaded first (entry_id NULL), then claimed by the message they are sent with. The bytes are
in the database so that every node of a cluster can serve them and send them to an agent.
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel

BIGINT = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')  # 64-bit ids on PostgreSQL


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('attachment',
    sa.Column('id', BIGINT, nullable=False),
    sa.Column('conversation_id', BIGINT, nullable=False),
    sa.Column('entry_id', BIGINT, nullable=True),
    sa.Column('media_type', sqlmodel.sql.sqltypes.AutoString(length=20), nullable=False),
    sa.Column('size', BIGINT, nullable=False),
    sa.Column('content', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversation.id']),
    sa.PrimaryKeyConstraint('id'),
    sqlite_autoincrement=True,
    )
    op.create_index('ix_attachment_conversation_entry', 'attachment', ['conversation_id', 'entry_id'])


def downgrade() -> None:
    op.drop_index('ix_attachment_conversation_entry', table_name='attachment')
    op.drop_table('attachment')
