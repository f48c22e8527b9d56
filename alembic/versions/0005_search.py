"""full-text search over messages (SQLite FTS5)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 20:30:00

An external-content FTS5 table over entry.text for user and agent entries, kept in sync
by triggers. SQLite only: other databases search with LIKE (app/search.py).
"""

from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

KINDS = "('user', 'agent')"
STATEMENTS = [
    "CREATE VIRTUAL TABLE entry_fts USING fts5("
    "text, content='entry', content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
    f"INSERT INTO entry_fts(rowid, text) SELECT id, text FROM entry WHERE kind IN {KINDS}",
    f"CREATE TRIGGER entry_fts_insert AFTER INSERT ON entry WHEN new.kind IN {KINDS} BEGIN"
    " INSERT INTO entry_fts(rowid, text) VALUES (new.id, new.text); END",
    f"CREATE TRIGGER entry_fts_delete AFTER DELETE ON entry WHEN old.kind IN {KINDS} BEGIN"
    " INSERT INTO entry_fts(entry_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    # One trigger, its statements in order: two triggers could fire in either order.
    "CREATE TRIGGER entry_fts_update AFTER UPDATE OF text, kind ON entry BEGIN"
    " INSERT INTO entry_fts(entry_fts, rowid, text)"
    f" SELECT 'delete', old.id, old.text WHERE old.kind IN {KINDS};"
    f" INSERT INTO entry_fts(rowid, text) SELECT new.id, new.text WHERE new.kind IN {KINDS};"
    " END",
]


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for trigger in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS entry_fts_{trigger}")
    op.execute("DROP TABLE IF EXISTS entry_fts")
