"""The cloud API key, kept in the OS keyring (`keyring`): never in a settings file or a log line.

Keys are stored per endpoint URL under the service name "halaman". On a machine without a usable
keyring backend (a bare Linux box with no Secret Service) saving fails with a clear message rather
than falling back to a plain-text file.
"""

from __future__ import annotations

import keyring
import keyring.errors

from engine.errors import SettingsError

SERVICE = "halaman"


def _account(base_url: str) -> str:
    return f"cloud-api-key:{base_url.strip().rstrip('/')}"


def save_api_key(base_url: str, api_key: str) -> None:
    """Store `api_key` for the endpoint `base_url`. Raises SettingsError if no keyring is usable."""
    try:
        if api_key:
            keyring.set_password(SERVICE, _account(base_url), api_key)
        else:
            delete_api_key(base_url)
    except keyring.errors.KeyringError as exc:
        raise SettingsError(
            f"cannot store the API key: no usable OS keyring ({type(exc).__name__}); "
            "install and unlock your desktop's keyring (GNOME Keyring, KWallet, Windows Credential Manager)"
        ) from None


def load_api_key(base_url: str) -> str | None:
    """The stored key for `base_url`, or None (also when no keyring is usable)."""
    try:
        return keyring.get_password(SERVICE, _account(base_url))
    except keyring.errors.KeyringError:
        return None


def delete_api_key(base_url: str) -> None:
    """Forget the key for `base_url` (no error if there was none)."""
    try:
        keyring.delete_password(SERVICE, _account(base_url))
    except keyring.errors.PasswordDeleteError:
        pass
    except keyring.errors.KeyringError:
        pass
