"""Size- and inode-limited filesystems for the sandbox: a tmpfs with ``size=`` and ``nr_inodes=``.

The workspace (for a whole task: the agent writes it, the policy reads it, the harness takes
the policy from it) and each sandbox's ``/tmp`` are tmpfs mounts the root harness makes on the
host and binds into the sandbox, so preallocation (``fallocate``, also with
``FALLOC_FL_KEEP_SIZE``) and floods of empty files end in ``ENOSPC`` at the limit rather than in
a watchdog's next look. A tmpfs has no reserved blocks, and its pages count against the memory
cgroup of the process that writes them. Without root the runtime cannot mount: ``/tmp`` is then
bubblewrap's ``--size`` tmpfs (no inode limit) and the workspace a host folder the watchdog
measures, and ``check()`` says so.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2
BYTES_PER_INODE = 16 * 1024  # nr_inodes = size / this (a small file per 16 KiB on average)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def inodes_for(size_bytes: int) -> int:
    return max(1024, size_bytes // BYTES_PER_INODE)


def mount_tmpfs(target: Path, *, size_bytes: int, inodes: int, uid: int, mode: int) -> None:
    """Mount a fresh tmpfs on ``target`` owned by ``uid`` (nosuid, nodev)."""
    data = f"size={size_bytes},nr_inodes={inodes},mode={mode:o},uid={uid},gid={uid}".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs on {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Detach the mount on ``target`` (lazily: a process still holding a file there keeps it alive)."""
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot unmount {target}: {os.strerror(err)}")


def can_mount() -> str:
    """ "" when this process can mount tmpfs here, else why not."""
    if os.geteuid() != 0:
        return "not root: the runtime cannot mount size- and inode-limited filesystems"
    import tempfile

    probe = Path(tempfile.mkdtemp(prefix="ale-fsprobe-"))
    try:
        mount_tmpfs(probe, size_bytes=1024 * 1024, inodes=64, uid=0, mode=0o700)
        unmount(probe)
    except OSError as exc:
        return str(exc)
    finally:
        probe.rmdir()
    return ""
