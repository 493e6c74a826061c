#!/usr/bin/env python3
"""perf-roles.py PERF_DATA: where the CPU of a
`bench/run.sh --perf FILE` fan-out went, by process role (the worker, a
zygote, a task's init, its task process, its keeper, nats-server) and by
what the samples' call stacks were doing (fork's page-table copy, page
faults, the mm teardown at exit, mounts, cgroups, Python, ...).

The roles come from the recording's own fork events: a zygote is the
worker's child, an init a zygote's, the task process an init's, the keeper
the task process's (it is cloned with CLONE_PARENT, but perf names the
forking thread)."""
import collections
import json
import subprocess
import sys

data = sys.argv[1]
# The bench's PERF_DATA.pids: {"worker": pid, "nats": pid, "zygotes": [pids]}.
with open(data + ".pids") as f:
    pids = json.load(f)
worker, nats = pids["worker"], pids["nats"]
out = subprocess.run(
    ["perf", "script", "-i", data, "--show-task-events", "-F", "comm,pid,tid,period,ip,sym,dso"],
    capture_output=True, text=True, check=True).stdout

parent = {z: worker for z in pids["zygotes"]}  # started before the recording
samples = []  # (pid, period, [frames])
cur = None
for line in out.split("\n"):
    if "PERF_RECORD_FORK" in line:
        # comm pid PERF_RECORD_FORK(child:tid):(parent:ptid)
        a = line.split("PERF_RECORD_FORK(")[1]
        child = int(a.split(":")[0])
        par = int(a.split("):(")[1].split(":")[0])
        if child != par:
            parent.setdefault(child, par)
        continue
    if "PERF_RECORD" in line:
        continue
    if not line.strip():
        if cur:
            samples.append(cur)
        cur = None
        continue
    if not line.startswith((" ", "\t")):
        f = line.split()
        # comm may contain spaces: pid/tid is the first field with a '/'
        k = next((i for i, x in enumerate(f) if "/" in x and x.split("/")[0].isdigit()), None)
        if k is None:  # a sample of no task (":-1  -1/-1"): none of ours
            cur = None
            continue
        pid = int(f[k].split("/")[0])
        period = int(f[k + 1]) if f[k + 1].isdigit() else 1
        cur = (pid, period, [])
    elif cur is not None:
        f = line.split(None, 1)
        cur[2].append(f[1] if len(f) > 1 else "")
if cur:
    samples.append(cur)


def role(pid):
    if pid == worker:
        return "worker"
    if pid == nats:
        return "nats-server"
    chain = []
    p = pid
    while p in parent and len(chain) < 8:
        chain.append(p)
        p = parent[p]
        if p == worker:
            return ["zygote", "init", "task", "keeper", "task's child"][min(len(chain) - 1, 4)]
    return "other"


CATS = [
    ("fork: page tables copied (dup_mmap)", ("dup_mmap", "copy_page_range")),
    ("exit: address space torn down", ("exit_mmap", "unmap_vmas", "zap_pte_range", "tlb_finish_mmu")),
    ("exit: namespaces, mounts, fds", ("exit_task_namespaces", "put_mnt_ns", "free_nsproxy",
                                       "cleanup_mnt", "exit_files", "zap_pid_ns_processes")),
    ("mount/umount/pivot", ("path_mount", "do_mount", "__x64_sys_mount", "umount", "pivot_root",
                            "move_mount", "fsmount")),
    ("clone: new namespaces", ("copy_namespaces", "create_new_namespaces", "copy_net_ns",
                               "copy_mnt_ns", "create_user_ns")),
    ("cgroup", ("cgroup_",)),
    ("page faults", ("asm_exc_page_fault",)),
    ("exec", ("execve", "bprm_execve")),
]


def category(frames):
    text = " ".join(frames)
    for name, keys in CATS:
        if any(k in text for k in keys):
            return name
    top = frames[0] if frames else ""
    if "[kernel.kallsyms]" in top:
        return "kernel, other (syscalls, scheduling)"
    if "libpython" in top or "cpython-311" in top or ".so" in top and "python" in top:
        return "user: Python and its extensions"
    if "libnats" in top:
        return "user: nats.c"
    return "user: other (libc, the program)"


by_role = collections.Counter()
by_role_cat = collections.Counter()
total = 0
for pid, period, frames in samples:
    r = role(pid)
    if r == "other":
        continue
    c = category(frames)
    by_role[r] += period
    by_role_cat[(r, c)] += period
    total += period
print(f"{total / 1e9:.2f} s of CPU sampled")
for r, v in by_role.most_common():
    print(f"{r:14s} {100 * v / total:5.1f}%")
    for (rr, c), vv in by_role_cat.most_common():
        if rr == r and vv / total >= 0.003:
            print(f"    {c:44s} {100 * vv / total:5.1f}%")
