/* sys.h - the system calls a sandbox process makes straight to the kernel:
 * the ones glibc does not wrap, and the ones whose glibc wrappers take
 * locks or signal other threads, which a process cloned from the
 * multi-threaded worker must not do. Private to src/sandbox and ci-zygote.
 *
 * Static inline, each a plain syscall(): nothing to link, so ci-zygote
 * (which links only libpython) uses the very same ones as ci_sandbox. */
#ifndef CI_SANDBOX_SYS_H
#define CI_SANDBOX_SYS_H

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

/* fork-like clone: the child runs on a copy of the caller's stack, like
 * bubblewrap's raw_clone(). glibc's fork() would run atfork handlers and
 * take malloc locks that another worker thread may hold. */
static inline pid_t sys_clone(unsigned long flags)
{
#if defined(__s390__) || defined(__CRIS__)
    return (pid_t)syscall(SYS_clone, NULL, flags);
#else
    return (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
#endif
}

/* The set*id calls go straight to the kernel: glibc's wrappers broadcast
 * to every thread it believes exists, and in a cloned child those threads
 * are gone (the broadcast would hang). */
static inline int sys_setresuid(uid_t u) { return (int)syscall(SYS_setresuid, u, u, u); }
static inline int sys_setresgid(gid_t g) { return (int)syscall(SYS_setresgid, g, g, g); }
static inline int sys_setgroups0(void) { return (int)syscall(SYS_setgroups, 0, NULL); }
static inline int sys_setfsuid(uid_t u) { return (int)syscall(SYS_setfsuid, u); }
static inline int sys_setfsgid(gid_t g) { return (int)syscall(SYS_setfsgid, g); }
static inline int sys_pivot_root(const char *new_root, const char *put_old)
{
    return (int)syscall(SYS_pivot_root, new_root, put_old);
}
static inline int sys_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }
static inline int sys_pidfd_send_signal(int pidfd, int sig)
{
    return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}
static inline int sys_openat2(int dirfd, const char *path, struct open_how *how)
{
    return (int)syscall(SYS_openat2, dirfd, path, how, sizeof(*how));
}
static inline int sys_mount_setattr(const char *path, uint64_t set)
{
    struct mount_attr attr = {.attr_set = set};
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, path, AT_RECURSIVE | AT_SYMLINK_NOFOLLOW,
                        &attr, sizeof(attr));
}
static inline int sys_capset_zero(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    return (int)syscall(SYS_capset, &hdr, data);
}

/* Keeps only the capabilities in keep (bit CAP_* set): permitted,
 * effective and inheritable (which PR_CAP_AMBIENT_RAISE needs). */
static inline int sys_capset_keep(uint64_t keep)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    for (int i = 0; i < 2; i++)
        data[i].permitted = data[i].effective = data[i].inheritable =
            (uint32_t)(keep >> (32 * i));
    return (int)syscall(SYS_capset, &hdr, data);
}

/* Is cap (CAP_*) in the calling thread's effective set? */
static inline bool sys_has_cap(int cap)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    if (cap < 0 || cap >= 64 || syscall(SYS_capget, &hdr, data) != 0)
        return false;
    return (data[cap / 32].effective >> (cap % 32)) & 1u;
}

/* Loads the filter in the calling process (no_new_privs must be set). */
static inline int load_seccomp(const struct sock_fprog *prog)
{
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog);
}

/* Closes every fd from `from` up; close_range() where the kernel has it. */
static inline void close_fds_from(int from)
{
    if (syscall(SYS_close_range, (unsigned)from, ~0U, 0) == 0)
        return;
    struct rlimit rl;
    long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (long)rl.rlim_cur : 65536;
    for (long fd = from; fd < max; fd++)
        close((int)fd);
}

#endif
