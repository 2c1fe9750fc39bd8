"""Secrets at rest (model head_msg values, tenant secrets): encrypted with MultiFernet.

Stored form: ``enc1:<Fernet token>``.  ASYNCH_SECRETS_KEYS is a comma-separated list of Fernet
keys: the first encrypts, every one decrypts, so a key is rotated by putting a new one first,
running ``asynch secrets rotate`` (re-encrypts every stored value) and dropping the old one.
Empty: a key derived from ASYNCH_KEY_PEPPER (HKDF-SHA256), for dev mode and upgrades.

Invariants: a value without the prefix is plaintext (rows from before encryption) and reads as
itself; empty and None stay as they are; a value with the prefix that no configured key
decrypts raises SecretsKeyMissing (never returns ciphertext as if it were the secret).
"""
from __future__ import annotations

import base64
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.config import get_settings

PREFIX = "enc1:"


class SecretsKeyMissing(RuntimeError):
    """A stored secret was encrypted with a key ASYNCH_SECRETS_KEYS no longer holds."""


def new_key() -> str:
    return Fernet.generate_key().decode()


def derived_key(pepper: str) -> str:
    """The key used without ASYNCH_SECRETS_KEYS (dev mode, deployments before
    it was required): an upgrade lists it after a new key, then rotates."""
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"model-asynch secrets at rest",
               info=b"fernet key v1").derive(pepper.encode())
    return base64.urlsafe_b64encode(raw).decode()


@lru_cache(maxsize=8)
def _box(keys: str, pepper: str) -> MultiFernet:
    listed = [k.strip() for k in keys.split(",") if k.strip()]
    try:
        fernets = [Fernet(k.encode()) for k in listed] or [Fernet(derived_key(pepper))]
    except ValueError as exc:
        raise ValueError("ASYNCH_SECRETS_KEYS: every key must be a Fernet key (urlsafe base64 of 32 bytes; "
                         "make one with `asynch secrets new-key`)") from exc
    return MultiFernet(fernets)


def box() -> MultiFernet:
    s = get_settings()
    return _box(s.secrets_keys, s.key_pepper)


def is_encrypted(stored: str | None) -> bool:
    return isinstance(stored, str) and stored.startswith(PREFIX)


def encrypt(plain: str | None) -> str | None:
    """The stored form of ``plain`` (None and "" unchanged; already encrypted unchanged)."""
    if not plain or is_encrypted(plain):
        return plain
    return PREFIX + box().encrypt(plain.encode()).decode()


def encrypt_bytes(raw: bytes) -> str:
    return PREFIX + box().encrypt(raw).decode()


def _opened(op, stored: str) -> bytes:
    try:
        return op(stored[len(PREFIX):].encode())
    except InvalidToken:
        raise SecretsKeyMissing("a stored secret does not decrypt with any ASYNCH_SECRETS_KEYS key") from None


def decrypt_bytes(stored: str) -> bytes:
    return _opened(box().decrypt, stored)


def decrypt(stored: str | None) -> str | None:
    """The plaintext of a stored value (plaintext rows read as themselves)."""
    if not is_encrypted(stored):
        return stored
    return decrypt_bytes(stored).decode()


def rotate(stored: str | None) -> str | None:
    """``stored`` re-encrypted with the first key, or encrypted if it was
    plaintext; None when there is nothing to change (empty)."""
    if not stored:
        return None
    return PREFIX + _opened(box().rotate, stored).decode() if is_encrypted(stored) else encrypt(stored)
