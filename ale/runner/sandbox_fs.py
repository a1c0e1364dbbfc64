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
import re
from pathlib import Path

MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2
BYTES_PER_INODE = 16 * 1024  # nr_inodes = size / this (a small file per 16 KiB on average)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def inodes_for(size_bytes: int) -> int:
    return max(1024, size_bytes // BYTES_PER_INODE)


def source_name(pid: int) -> str:
    """The mount's source, naming the harness process it belongs to (see :func:`sweep`)."""
    return f"ale-{pid}"


def mount_tmpfs(target: Path, *, size_bytes: int, inodes: int, uid: int, mode: int) -> None:
    """Mount a fresh tmpfs on ``target`` owned by ``uid`` (nosuid, nodev)."""
    data = f"size={size_bytes},nr_inodes={inodes},mode={mode:o},uid={uid},gid={uid}".encode()
    source = source_name(os.getpid()).encode()
    if _libc.mount(source, str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, data) != 0:
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


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Detach the tmpfs mounts a harness that died without cleaning up left (their source names a
    process that no longer exists); returns their mount points."""
    swept = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 2 or rest[0] != "tmpfs":
            continue
        owner = re.fullmatch(r"ale-([0-9]+)", rest[1])
        if owner is None or pid_alive(int(owner.group(1))):
            continue
        point = _unescape(fields[4])
        try:
            unmount(Path(point))
        except OSError:
            continue
        swept.append(point)
    return swept
