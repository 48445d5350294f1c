"""Giving up root for commands that need none (docs/SECURITY.md).

Only `memprof record` (eBPF) and `memprof doctor` (which checks what recording needs) use
root. Run through sudo, every other command — report, export, diff, check, import — reads
the user's recording and writes the user's files, so it gives root up for the whole
process before it reads anything: the kernel then checks every path, link and permission
as the user's, and every file it makes is the user's.
"""
from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Mapping

from memprof.errors import MemprofError

NEEDS_ROOT = frozenset({"record", "doctor"})


class PrivilegeDropError(MemprofError):
    """Running as root through sudo, memprof could not become the invoking user."""


@dataclass(frozen=True)
class SudoUser:
    """The user who ran `sudo memprof`, from the SUDO_* variables sudo sets."""

    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "SudoUser | None":
        """The invoking user, or None when there is none to become (SUDO_UID unset, or 0).
        PrivilegeDropError when SUDO_UID or SUDO_GID is not a number."""
        if "SUDO_UID" not in environ:
            return None
        try:
            uid = int(environ["SUDO_UID"])
            gid = int(environ.get("SUDO_GID") or _primary_gid(uid))
        except (ValueError, KeyError):
            raise PrivilegeDropError(f"SUDO_UID={environ.get('SUDO_UID')!r} SUDO_GID={environ.get('SUDO_GID')!r} "
                                     "name no user to run as", _HINT) from None
        if uid == 0:
            return None
        return cls(uid, gid, tuple(_groups(uid, gid, environ.get("SUDO_USER"))))


_HINT = "run memprof without sudo: only `memprof record` and `memprof doctor` need root"


def drop_root_if_sudo(environ: Mapping[str, str] = os.environ) -> SudoUser | None:
    """When the process runs as root through sudo (euid 0, SUDO_UID of another user), become
    that user for good: supplementary groups, then gid, then uid (real, effective and saved),
    so nothing can take root back. The user become, or None when nothing was changed.
    PrivilegeDropError when the change does not take (the process then must not go on)."""
    if os.geteuid() != 0:
        return None
    user = SudoUser.from_environ(environ)
    if user is None:
        return None
    try:
        os.setgroups(list(user.groups))
        os.setgid(user.gid)
        os.setuid(user.uid)
    except OSError as e:
        raise PrivilegeDropError(f"cannot become user {user.uid} (from sudo): {e.strerror or e}", _HINT) from None
    _verify(user)
    return user


def _verify(user: SudoUser) -> None:
    """PrivilegeDropError unless every uid and gid is the user's and no capability is left."""
    if os.getresuid() != (user.uid,) * 3 or os.getresgid() != (user.gid,) * 3 or _capabilities():
        raise PrivilegeDropError(f"root was not fully given up for user {user.uid}", _HINT)


def _capabilities() -> int:
    """The permitted and effective capability sets of this process, OR-ed (0: none)."""
    found = 0
    with open("/proc/self/status", encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith(("CapPrm:", "CapEff:")):
                found |= int(line.split()[1], 16)
    return found


def _primary_gid(uid: int) -> int:
    return pwd.getpwuid(uid).pw_gid


def _groups(uid: int, gid: int, name: str | None) -> list[int]:
    """The user's groups as login would give them (the account's name from the password
    database first, SUDO_USER second); only `gid` when the user has no entry."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        pass
    if not name:
        return [gid]
    try:
        return os.getgrouplist(name, gid)
    except OSError:
        return [gid]
