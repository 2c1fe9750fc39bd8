"""Settings: one declaration (app/config.py, pydantic-settings), the same
parsing rules as ever, and docs/operations.md's table checked against it."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT

from app.config import ALIASES, REMOVED, Settings, env_names, load_settings

DOCS_PATH = ROOT / "docs" / "operations.md"
ASYNCH_VAR = re.compile(r"\bASYNCH_[A-Z0-9_]+\b")
ROW = re.compile(r"^\| `(ASYNCH_[A-Z0-9_]+)` \|(.*)$", re.M)


def _doc_default(v) -> str:
    return "(empty)" if v == "" else f"`{v}`"


def test_operations_doc_lists_every_setting_once_with_its_default_and_nothing_else():
    text = DOCS_PATH.read_text()
    unknown = set(ASYNCH_VAR.findall(text)) - set(env_names().values()) - set(ALIASES) - set(REMOVED)
    assert not unknown, f"docs/operations.md names ASYNCH_ variables that do not exist: {sorted(unknown)}"
    rows: dict[str, list[str]] = {}
    for var, rest in ROW.findall(text):
        rows.setdefault(var, []).append(rest)
    names = env_names()
    assert set(rows) == set(names.values()), "the settings table and app/config.py name different variables"
    defaults = Settings()
    for name, field in Settings.model_fields.items():
        var = names[name]
        assert len(rows[var]) == 1, f"docs/operations.md needs one table row for {var}"
        cells = [c.strip() for c in rows[var][0].strip().strip("|").split("|")]
        assert cells[0] == _doc_default(getattr(defaults, name)), \
            f"{var}: documented default {cells[0]} != {_doc_default(getattr(defaults, name))}"
        assert cells[1], f"{var}: no meaning documented"
        assert field.description, f"{name}: declare what it does (Field(description=...))"


def test_every_variable_is_the_upper_case_field_name():
    assert len(Settings.model_fields) == len(env_names())
    for name, var in env_names().items():
        assert var == "ASYNCH_" + name.upper()
        kind = Settings.model_fields[name].annotation
        if kind is not str:  # a number or a boolean parses as its own type
            value = getattr(load_settings({var: "7"}), name)
            assert type(value) is kind and value == (False if kind is bool else 7), var
    assert load_settings({"asynch_queue_name": "lower", "OTHER_QUEUE_NAME": "x"}).queue_name == "asynch"


def test_a_bad_number_is_an_error_naming_its_variable():
    with pytest.raises(ValueError, match=r"^ASYNCH_DB_POOL_SIZE must be an integer, got 'many'$"):
        load_settings({"ASYNCH_DB_POOL_SIZE": "many"})
    with pytest.raises(ValueError, match=r"^ASYNCH_REDIS_TIMEOUT_SECONDS must be a number, got '1,5'$"):
        load_settings({"ASYNCH_REDIS_TIMEOUT_SECONDS": "1,5"})
    with pytest.raises(ValueError, match="ASYNCH_LIST_MAX_LIMIT must be an integer, got '2.5'"):
        load_settings({"ASYNCH_LIST_MAX_LIMIT": "2.5"})  # an integer is an integer, as int() has it


def test_the_cli_fails_on_a_bad_number_with_the_variable_in_its_message(test_env):
    import os

    env = {**os.environ, **test_env, "ASYNCH_WAITERS_MAX": "lots"}
    out = subprocess.run([sys.executable, "-m", "app.cli", "env"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode != 0 and "ASYNCH_WAITERS_MAX must be an integer, got 'lots'" in out.stderr


def test_empty_means_the_default_for_numbers_and_booleans_and_empty_for_strings():
    s = load_settings({"ASYNCH_DB_POOL_SIZE": "", "ASYNCH_REDIS_TIMEOUT_SECONDS": "  ", "ASYNCH_WAIT_PARKING": "",
                       "ASYNCH_REDIS_PREFIX": "", "ASYNCH_LOG_LEVEL": " DEBUG "})
    assert (s.db_pool_size, s.redis_timeout_seconds, s.wait_parking) == (16, 10.0, True)
    assert s.redis_prefix == "" and s.log_level == " DEBUG "  # strings as given
    s = load_settings({"ASYNCH_DB_POOL_SIZE": " 7 ", "ASYNCH_MAX_BODY_BYTES": "1_000",
                       "ASYNCH_RETRY_BACKOFF_SECONDS": "1e1"})
    assert (s.db_pool_size, s.max_body_bytes, s.retry_backoff_seconds) == (7, 1000, 10.0)


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), (" On ", True), ("0", False),
                                       ("false", False), ("no", False), ("off", False), ("maybe", False)])
def test_booleans_are_true_for_1_true_yes_on_and_false_for_anything_else(raw, value):
    assert load_settings({"ASYNCH_RECOVER_BY_HEARTBEAT": raw}).recover_by_heartbeat is value
    assert load_settings({"ASYNCH_DEV_MODE": raw}).dev_mode is value


def test_settings_are_frozen_and_overrides_are_copies_of_known_fields():
    s = load_settings({})
    assert s == Settings() and load_settings({}) == s
    with pytest.raises(ValueError):
        s.db_pool_size = 1  # type: ignore[misc]
    t = s.with_overrides(db_pool_size=3, redis_prefix="x")
    assert (t.db_pool_size, t.redis_prefix, s.db_pool_size) == (3, "x", 16)
    with pytest.raises(TypeError, match="no_such_setting"):
        s.with_overrides(no_such_setting=1)


def test_conflicting_settings_are_refused_as_before():
    with pytest.raises(ValueError, match="set ASYNCH_BROKER_URL"):
        load_settings({"ASYNCH_REDIS_URL": "redis+cluster://127.0.0.1:7000"})
    with pytest.raises(ValueError, match="ASYNCH_BROKER_URL cannot be a Redis Cluster"):
        load_settings({"ASYNCH_BROKER_URL": "redis+cluster://127.0.0.1:7000"})
    with pytest.raises(ValueError, match="key or gateway"):
        load_settings({"ASYNCH_AUTH_MODE": "open"})


def test_a_renamed_setting_reads_its_old_variable_and_the_new_name_wins():
    """ASYNCH_CALLBACK_* are aliases of the outbox's ASYNCH_DELIVERY_* settings
    (docs/operations.md names each in its row)."""
    assert ALIASES["ASYNCH_CALLBACK_MAX_ATTEMPTS"] == "ASYNCH_DELIVERY_MAX_ATTEMPTS"
    assert load_settings({"ASYNCH_CALLBACK_MAX_ATTEMPTS": "3"}).delivery_max_attempts == 3
    assert load_settings({"ASYNCH_CALLBACK_ALLOW_HOSTS": "a", "ASYNCH_DELIVERY_ALLOW_HOSTS": "b"}).delivery_allow_hosts == "b"
    with pytest.raises(ValueError, match="ASYNCH_DELIVERY_TIMEOUT_SECONDS must be a number"):
        load_settings({"ASYNCH_CALLBACK_TIMEOUT_SECONDS": "soon"})
    assert Settings().with_overrides(callback_queue_name="q").delivery_queue_name == "q"
    text = DOCS_PATH.read_text()
    for old, new in ALIASES.items():
        row = next(r for v, r in ROW.findall(text) if v == new)
        assert f"`{old}`" in row, f"docs/operations.md: the row of {new} names its alias {old}"
