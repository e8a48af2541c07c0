"""The per-user token file: the one-time setup that lets launchers without a secret of their own
(srun, mpirun across hosts) form an authenticated group.

``pycollective token --create`` writes a fresh random token to ``~/.config/pycollective/token``
(or ``PYCOLLECTIVE_TOKEN_FILE``), mode 0600 in a 0700 folder. When ``PYCOLLECTIVE_TOKEN`` is
unset, every rank reads it from there; on a cluster whose home directories are shared, every
rank of the user's jobs then holds the same secret. A file that anyone but its owner can read or
write is refused: a token others can read authenticates nothing.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping

TOKEN_FILE_VARIABLE = "PYCOLLECTIVE_TOKEN_FILE"
CREATE_COMMAND = "pycollective token --create"


def token_file_path(env: Mapping[str, str]) -> str | None:
    """Where the token file is: ``PYCOLLECTIVE_TOKEN_FILE``, else
    ``$HOME/.config/pycollective/token``; None when neither variable is set."""
    explicit = env.get(TOKEN_FILE_VARIABLE)
    if explicit:
        return os.path.expanduser(explicit)
    home = env.get("HOME")
    if not home:
        return None
    return os.path.join(home, ".config", "pycollective", "token")


def read_token_file(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The token from the token file, and the file's path.

    Returns:
        ``(token, path)``, or None when the default file does not exist.

    Raises:
        ValueError: ``PYCOLLECTIVE_TOKEN_FILE`` names a missing file, or the file can be read
            or written by anyone but this user, belongs to another user, or is empty.
    """
    path = token_file_path(env)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        if env.get(TOKEN_FILE_VARIABLE):
            raise ValueError(
                f"{TOKEN_FILE_VARIABLE}={path} does not exist: create it with "
                f"`{TOKEN_FILE_VARIABLE}={path} {CREATE_COMMAND}`, or unset the variable"
            ) from None
        return None
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc}") from None
    with os.fdopen(fd) as f:
        _check_private(os.fstat(f.fileno()), path)
        token = f.read().strip()
    if not token:
        raise ValueError(
            f"the token file {path} is empty: recreate it with `{CREATE_COMMAND} --replace`"
        )
    return token, path


def create_token_file(env: Mapping[str, str], replace: bool = False) -> str:
    """Writes a fresh random token, readable by this user alone; returns the file's path.

    Raises:
        ValueError: Neither HOME nor PYCOLLECTIVE_TOKEN_FILE is set, or the file exists and
            ``replace`` is False (jobs running now hold the old token).
    """
    path = token_file_path(env)
    if path is None:
        raise ValueError(
            f"neither HOME nor {TOKEN_FILE_VARIABLE} is set: say where the token file goes"
        )
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    if os.path.lexists(path) and not replace:
        raise ValueError(
            f"{path} already exists; `{CREATE_COMMAND} --replace` writes a new token "
            "(jobs running now keep the old one)"
        )
    # Written beside the target and renamed over it: a reader never sees half a token, and the
    # file is 0600 from its first byte (the mode is given to open, not set afterwards).
    temporary = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
    return path


def describe_token_file(env: Mapping[str, str]) -> str:
    """One line saying where the token file is and whether it is usable (never its content)."""
    path = token_file_path(env)
    if path is None:
        return f"no token file: neither HOME nor {TOKEN_FILE_VARIABLE} is set"
    try:
        found = read_token_file(env)
    except ValueError as exc:
        return f"token file unusable: {exc}"
    if found is None:
        return f"no token file at {path}; `{CREATE_COMMAND}` writes one"
    return f"token file {path}: present, readable by its owner alone"


def _check_private(info: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"the token file {path} is not a regular file")
    if info.st_uid != os.getuid():
        raise ValueError(
            f"the token file {path} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.getuid()}): a token must be the user's own; write one with "
            f"`{CREATE_COMMAND}`"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ValueError(
            f"the token file {path} has mode {mode:04o}: others can read or change it, so it "
            f"authenticates nothing and is refused. Run `chmod 600 {path}` (and, since others "
            f"may have read it, `{CREATE_COMMAND} --replace`)"
        )
