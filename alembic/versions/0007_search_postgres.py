"""full-text search over messages on PostgreSQL (a GIN index over to_tsvector)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 22:40:00

An expression index over the user and agent entries' text, which app/search.py queries with
the same expression (the planner uses an expression index only for that exact expression).
PostgreSQL only: SQLite has its FTS5 table (0005).
"""

from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

# The same text as app/search.py's PG_VECTOR and PG_KINDS (a migration never imports the app).
CREATE = (
    "CREATE INDEX IF NOT EXISTS entry_fts_pg ON entry"
    " USING gin (to_tsvector('simple'::regconfig, text)) WHERE kind IN ('user', 'agent')"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(CREATE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP INDEX IF EXISTS entry_fts_pg")
