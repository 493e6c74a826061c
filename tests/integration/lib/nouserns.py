#!/usr/bin/env python3
"""Runs a command on a machine without user namespaces, for real.

    nouserns.py UID CMD [ARG...]    exec CMD in the namespace, as UID
    nouserns.py --check             prints "ok" if the setup works here
    nouserns.py --ids-only CMD ...  only the ids: exec CMD as root of a user
                                    namespace that maps 0..65535 and may make
                                    more (as a pod with hostUsers: false)

How: this process enters a new user namespace (ids 0..65535 mapped to the
same ids outside, written by a helper child that stays outside), is root
there, writes 0 to /proc/sys/user/max_user_namespaces - a limit that
belongs to that namespace, so the machine's own is untouched - then drops
to UID (0 = stay root) and executes CMD, which keeps this pid. Anything
CMD tries, clone(CLONE_NEWUSER) included, now fails with ENOSPC, as on a
platform that grants no user namespaces (Cloud Run gen1 / gVisor). Needs
root outside. Exit 77 when the setup is impossible here (the caller
skips, loudly)."""
import ctypes
import errno
import os
import sys

CLONE_NEWUSER = 0x10000000


def fail(why):
    sys.stderr.write(f"nouserns: {why}\n")
    sys.exit(77)


def enter(no_more=True):
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() != 0:
        fail("needs root outside (to map the ids of the new user namespace)")
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        try:
            for f in ("uid_map", "gid_map"):
                with open(f"/proc/{parent}/{f}", "w") as fh:
                    fh.write("0 0 65536\n")
        except OSError:
            os._exit(1)
        os._exit(0)
    os.close(r)
    if libc.unshare(CLONE_NEWUSER) != 0:
        e = ctypes.get_errno()
        os.write(w, b"x")
        os.waitpid(pid, 0)
        fail(f"unshare(CLONE_NEWUSER): {os.strerror(e)}")
    os.write(w, b"x")
    os.close(w)
    _, st = os.waitpid(pid, 0)
    if st != 0:
        fail("cannot write the new namespace's uid_map/gid_map")
    if not no_more:
        return libc
    try:
        with open("/proc/sys/user/max_user_namespaces", "w") as fh:
            fh.write("0\n")
    except OSError as e:
        fail(f"cannot write /proc/sys/user/max_user_namespaces in the new namespace: {e}")
    return libc


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--check":
        libc = enter()
        pid = os.fork()
        if pid == 0:
            ok = libc.unshare(CLONE_NEWUSER) != 0 and ctypes.get_errno() == errno.ENOSPC
            os._exit(0 if ok else 1)
        _, st = os.waitpid(pid, 0)
        if st != 0:
            fail("a user namespace could still be created after max_user_namespaces=0")
        print("ok")
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "--ids-only":
        enter(no_more=False)
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.execvp(sys.argv[2], sys.argv[2:])
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    uid = int(sys.argv[1])
    enter()
    if uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    os.execv(sys.argv[2], sys.argv[2:])


main()
