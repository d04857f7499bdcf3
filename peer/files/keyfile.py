"""Key files: one member's :class:`Identity` (protocols/identity.py) as a small text file.

A key file is written with mode 0600 and never overwritten; loading refuses a file that others
may read or that is corrupt, with a :class:`KeyFileError` that names the file and what to do.
The format: a magic line, then ``public-id`` (a check), ``ed25519-seed`` (base64) and
``curve-secret`` (Z85); ``#`` lines are comments.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocols.errors import HivemeshError
from protocols.identity import Identity, z85_decode

KEY_FILE_MAGIC = "hivemesh-identity 1"


class KeyFileError(HivemeshError):
    """A key file that is missing, corrupt, already present, or readable by others."""


def identity_text(identity: Identity) -> str:
    """The contents of ``identity``'s key file."""
    seed = base64.b64encode(identity.signing_key.private_bytes_raw()).decode("ascii")
    return (
        "# hivemesh identity key: keep it secret (mode 0600); share only the public id\n"
        f"{KEY_FILE_MAGIC}\n"
        f"public-id {identity.public_id}\n"
        f"ed25519-seed {seed}\n"
        f"curve-secret {identity.curve_secret_key}\n"
    )


def save_identity(identity: Identity, path: str | Path) -> None:
    """Write a new key file with mode 0600; refuse to overwrite an existing file."""
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path}: already exists; refusing to overwrite a key file") from None
    except OSError as error:
        raise KeyFileError(f"{path}: cannot create: {error.strerror}") from None
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        os.fchmod(handle.fileno(), 0o600)  # whatever the umask said
        handle.write(identity_text(identity))


def load_identity(path: str | Path) -> Identity:
    """Read a key file; KeyFileError if missing, readable by others, or corrupt."""
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file (create one with `hivemesh keygen`)") from None
    except OSError as error:
        raise KeyFileError(f"{path}: cannot read: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"{path}: not a regular file")
        if mode & 0o077:
            raise KeyFileError(
                f"{path}: key file is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                f"run `chmod 600 {path}`")
        data = handle.read(4096)
    return parse_identity(data, source=str(path))


def parse_identity(data: bytes, *, source: str = "<key>") -> Identity:
    """Parse key file contents; KeyFileError naming ``source`` if they are corrupt."""
    def corrupt(why: str) -> KeyFileError:
        return KeyFileError(f"{source}: not a valid hivemesh key file ({why})")

    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise corrupt("not ASCII text") from None
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines or lines[0] != KEY_FILE_MAGIC:
        raise corrupt(f"first line is not {KEY_FILE_MAGIC!r}")
    values: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        if key in values:
            raise corrupt(f"{key} given twice")
        values[key] = value.strip()
    missing = {"ed25519-seed", "curve-secret"} - values.keys()
    if missing:
        raise corrupt("missing " + ", ".join(sorted(missing)))
    try:
        seed = base64.b64decode(values["ed25519-seed"], validate=True)
    except (binascii.Error, ValueError):
        raise corrupt("ed25519-seed is not base64") from None
    if len(seed) != 32:
        raise corrupt("ed25519-seed is not 32 bytes")
    try:
        curve = z85_decode(values["curve-secret"])
    except ValueError as error:
        raise corrupt(f"curve-secret: {error}") from None
    if len(curve) != 32:
        raise corrupt("curve-secret is not 32 bytes")
    identity = Identity(Ed25519PrivateKey.from_private_bytes(seed), curve)
    if "public-id" in values and values["public-id"] != identity.public_id:
        raise corrupt("public-id does not match the secret key")
    return identity
