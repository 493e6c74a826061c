#!/usr/bin/env python3
"""Runs a command as root of a user namespace that maps only the ids
0..65535 (to the same ids outside), as a user-namespaced pod does
(Kubernetes hostUsers: false).

    fewuids.py CMD [ARG...]

A helper child outside writes the maps (which needs root outside); this
process then executes CMD, which keeps its pid. Exit 77 when the setup is
impossible here (the caller skips, loudly)."""
import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000


def fail(why):
    sys.stderr.write(f"fewuids: {why}\n")
    sys.exit(77)


def main():
    if len(sys.argv) < 2:
        fail("usage: fewuids.py CMD [ARG...]")
    if os.geteuid() != 0:
        fail("needs root outside (to map the ids of the new user namespace)")
    libc = ctypes.CDLL(None, use_errno=True)
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
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.execvp(sys.argv[1], sys.argv[1:])


main()
