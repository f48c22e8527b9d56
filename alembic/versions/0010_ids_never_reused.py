"""conversation and entry ids are never reused on SQLite (AUTOINCREMENT)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 12:00:00

Without AUTOINCREMENT SQLite gives a new row the largest id + 1, so deleting the newest
conversation handed its id to the next one: its links, its push notifications and its tabs'
places in the timeline then led to another conversation. SQLite cannot add AUTOINCREMENT
to a table: both tables are copied (batch mode, foreign keys off: alembic/env.py), ids kept.
The copy drops the old entry table's triggers, so the search index's are made again (as
0005 made them). PostgreSQL's sequences never reuse an id: nothing to do there.
"""

from alembic import op


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

KINDS = "('user', 'agent')"
SEARCH_TRIGGERS = [  # 0005's, unchanged
    f"CREATE TRIGGER entry_fts_insert AFTER INSERT ON entry WHEN new.kind IN {KINDS} BEGIN"
    " INSERT INTO entry_fts(rowid, text) VALUES (new.id, new.text); END",
    f"CREATE TRIGGER entry_fts_delete AFTER DELETE ON entry WHEN old.kind IN {KINDS} BEGIN"
    " INSERT INTO entry_fts(entry_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER entry_fts_update AFTER UPDATE OF text, kind ON entry BEGIN"
    " INSERT INTO entry_fts(entry_fts, rowid, text)"
    f" SELECT 'delete', old.id, old.text WHERE old.kind IN {KINDS};"
    f" INSERT INTO entry_fts(rowid, text) SELECT new.id, new.text WHERE new.kind IN {KINDS};"
    " END",
]


def _copy(autoincrement: bool) -> None:
    for table in ("conversation", "entry"):
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass
    for statement in SEARCH_TRIGGERS:
        op.execute(statement)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _copy(autoincrement=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _copy(autoincrement=False)
