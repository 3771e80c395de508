"""Secrets at rest: Fernet encryption of secret-named values, key management, redaction."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeGuard

from cryptography.fernet import Fernet, InvalidToken

SECRET_MARKERS = ("key", "token", "secret", "password", "credential", "auth")
REDACTED = "••••••"
ENC_TAG = "$enc"
LIT_TAG = "$lit"  # wraps data that only looks sealed: it is data, never decrypted

_norm_re = re.compile(r"[^a-z0-9]+")


def normalize_key(key: str) -> str:
    """``--api-token`` / ``Api-Token`` → ``api_token``."""
    return _norm_re.sub("_", key.strip().lower()).strip("_")


_SECRET_KEYS: dict[str, bool] = {}  # answers so far for short keys (field names are few)


def is_secret_key(key: str) -> bool:
    """SPEC §2: any key containing a secret marker (substring match) is a secret."""
    hit = _SECRET_KEYS.get(key)
    if hit is None:
        k = key.lower()
        hit = any(m in k for m in SECRET_MARKERS)
        if len(key) <= 64 and len(_SECRET_KEYS) < 10_000:
            _SECRET_KEYS[key] = hit
    return hit


def load_or_create_key(data_dir: Path, configured: str | None) -> bytes:
    """The configured Fernet key, or one generated once into ``<data_dir>/secret.key``."""
    if configured:
        key = configured.encode()
        Fernet(key)  # raises ValueError with a clear message on a malformed key
        return key
    path = data_dir / "secret.key"
    if path.exists():
        return path.read_bytes().strip()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Fernet.generate_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


class SecretBox:
    """Encrypts the values of secret-named keys anywhere in a JSON-like structure."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    def encrypt(self, value: object) -> dict[str, str]:
        import json

        return {ENC_TAG: self._fernet.encrypt(json.dumps(value).encode()).decode()}

    def decrypt(self, sealed: dict[str, str]) -> Any:
        import json

        try:
            return json.loads(self._fernet.decrypt(sealed[ENC_TAG].encode()))
        except InvalidToken as exc:
            raise ValueError(
                "cannot decrypt a stored secret: SKILLJOBS_SECRET_KEY differs from the key "
                "it was written with"
            ) from exc

    def ours(self, v: object) -> bool:
        """A sealed value this key wrote (not data that merely has the same shape)."""
        if not _is_sealed(v) or not isinstance(v[ENC_TAG], str):
            return False
        try:
            self._fernet.decrypt(v[ENC_TAG].encode())
        except (InvalidToken, ValueError):
            return False
        return True

    def seal(self, obj: object) -> Any:
        """Copy of ``obj`` with every secret-named key's value encrypted. Values sealed
        already are kept; anything else shaped like a sealed value (``{"$enc": …}``,
        ``{"$lit": …}``) is wrapped as ``{"$lit": …}`` so that unsealing returns it as the
        data it is and never tries to decrypt it."""
        if isinstance(obj, dict):
            if self.ours(obj):
                return obj
            out = {}
            for k, v in obj.items():
                if isinstance(k, str) and is_secret_key(k) and v not in (None, ""):
                    out[k] = v if self.ours(v) else self.encrypt(v)
                elif type(v) in _SCALARS:  # nothing to seal below (most values)
                    out[k] = v
                else:
                    out[k] = self.seal(v)
            return {LIT_TAG: out} if _looks_sealed(obj) else out
        if isinstance(obj, list):
            return [self.seal(v) for v in obj]
        return obj

    def unseal(self, obj: object) -> Any:
        if isinstance(obj, dict):
            if _is_sealed(obj):
                return self.decrypt(obj)
            data = obj[LIT_TAG] if len(obj) == 1 and isinstance(obj.get(LIT_TAG), dict) else obj
            # (scalars, most values, are taken as they are: no call each)
            return {k: v if type(v) in _SCALARS else self.unseal(v) for k, v in data.items()}
        if isinstance(obj, list):
            return [v if type(v) in _SCALARS else self.unseal(v) for v in obj]
        return obj


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _is_sealed(v: object) -> TypeGuard[dict[Any, Any]]:
    return isinstance(v, dict) and len(v) == 1 and ENC_TAG in v


def _looks_sealed(v: dict[Any, Any]) -> bool:
    return len(v) == 1 and (ENC_TAG in v or LIT_TAG in v)


def redact(obj: object) -> Any:
    """Copy of ``obj`` fit for logs and the dashboard: secret-named values masked."""
    if isinstance(obj, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and is_secret_key(k) and v not in (None, "")
                else redact(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj
