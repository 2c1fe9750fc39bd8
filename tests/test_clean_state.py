"""conftest's clean_state: the next test sees no row a test left and every
sequence restarted, though only the tables holding rows are truncated.
The two tests run in file order: the first leaves rows and a moved sequence."""
from __future__ import annotations

from helpers import make_key
from sqlalchemy import text

from app.infra.db import get_engine


def test_a_test_leaves_rows_and_a_moved_sequence(make_model):
    make_model("left-behind")
    with get_engine().begin() as conn:
        conn.execute(text("ALTER SEQUENCE asynch_api_keys_id_seq RESTART WITH 1000000"))
    make_key("t")


def test_the_next_one_starts_empty_with_sequences_restarted():
    with get_engine().begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM asynch_models")).scalar() == 0
        assert conn.execute(text("SELECT count(*) FROM asynch_api_keys")).scalar() == 0
    make_key("t")
    with get_engine().begin() as conn:
        assert conn.execute(text("SELECT id FROM asynch_api_keys")).scalars().all() == [1]
