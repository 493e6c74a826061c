/* seccomp.c - the seccomp filter each task loads last, before its code
 * (task_exec in init.c; task_main in ci-zygote, which gets it in SETUP): a
 * deny list, built with libseccomp (which allocates) once, when the sandbox
 * is prepared, and kept as a BPF program, so that the child only has to
 * call seccomp(2) (load_seccomp in sys.h). */
#include <errno.h>
#include <linux/filter.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/sandbox_int.h"

/* System calls the code never needs and that are the usual way out of a
 * sandbox or into the kernel's soft spots (Docker's profile, nsjail and
 * SECURITY.md). Everything else is allowed: numpy, pandas and
 * matplotlib use a wide and changing set, and the namespaces, the dropped
 * capabilities and the rlimits are the main walls; this list narrows the
 * kernel surface behind them. Names unknown to this architecture are skipped. */
static const char *const denied_syscalls[] = {
    "acct", "add_key", "adjtimex", "bpf", "chroot", "clock_adjtime", "clock_settime",
    "create_module", "delete_module", "fanotify_init", "finit_module", "fsconfig", "fsmount",
    "fsopen", "fspick", "get_kernel_syms", "init_module", "io_uring_enter",
    "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load",
    "kexec_load", "keyctl", "lookup_dcookie", "mount", "mount_setattr", "move_mount",
    "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree", "perf_event_open",
    "pidfd_getfd", "pivot_root", "process_madvise", "process_vm_readv", "process_vm_writev",
    "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot", "request_key", "setns",
    "settimeofday", "swapoff", "swapon", "_sysctl", "sysfs", "syslog", "umount", "umount2",
    "unshare", "uselib", "userfaultfd", "ustat", "vhangup",
    /* Memory that RLIMIT_AS does not count and no tmpfs size bounds, so
     * that without a memory cgroup a task could hold gigabytes: memfds
     * (256 MiB each, as many as fds), SysV shared memory and message queues
     * (they outlive every mapping). The runtime uses none of them; /dev/shm
     * and /tmp are bounded tmpfs (tests/security/resources.test.mjs). */
    "memfd_create", "msgget", "shmget",
};

#define DENY(nr, ...)                                                               \
    do {                                                                            \
        if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), (nr), __VA_ARGS__) != 0)   \
            goto out;                                                               \
    } while (0)

/* Builds the filter with libseccomp (which allocates) and keeps the BPF
 * program, so that the child only has to call seccomp(2). */
ci_status plan_seccomp(struct ci_sandbox *sb)
{
    ci_status s = CI_ERR_SYS;
    int memfd = -1;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return CI_ERR_NOMEM;
    /* Other ABIs (i386, x32 on x86_64) would dodge every rule: kill them. */
    if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) != 0 ||
        seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0) != 0) /* we set it ourselves */
        goto out;
    for (size_t i = 0; i < sizeof(denied_syscalls) / sizeof(denied_syscalls[0]); i++) {
        int nr = seccomp_syscall_resolve_name(denied_syscalls[i]);
        if (nr != __NR_SCMP_ERROR && nr >= 0)
            DENY(nr, 0);
    }
    /* No new namespaces: clone with a CLONE_NEW* flag; clone3 answers ENOSYS
     * so that glibc falls back to clone, whose flags can be inspected. */
    static const unsigned long ns_flags[] = {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID,
                                             CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS,
                                             CLONE_NEWCGROUP};
    for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]); i++)
        DENY(SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) != 0)
        goto out;
    /* Typing into a terminal (the ioctl number is compared on 32 bits). */
    DENY(SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
    DENY(SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX));
    /* Sockets: unix, IPv4 and IPv6 only (netlink, packet, vsock... are out). */
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                         SCMP_A0(SCMP_CMP_EQ, AF_UNSPEC, 0)) != 0 ||
        seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                         SCMP_A0(SCMP_CMP_GT, AF_INET6, 0)) != 0)
        goto out;
    for (int af = AF_INET + 1; af < AF_INET6; af++)
        if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                             SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)af, 0)) != 0)
            goto out;
    /* personality() flags that switch off address randomization or NX. */
    static const unsigned long persona[] = {ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC,
                                            MMAP_PAGE_ZERO, ADDR_COMPAT_LAYOUT};
    for (size_t i = 0; i < sizeof(persona) / sizeof(persona[0]); i++)
        DENY(SCMP_SYS(personality), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, persona[i], persona[i]));

    memfd = memfd_create("ci-seccomp", MFD_CLOEXEC);
    struct stat st;
    if (memfd < 0 || seccomp_export_bpf(ctx, memfd) != 0 || fstat(memfd, &st) != 0 ||
        st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) != 0 ||
        st.st_size / sizeof(struct sock_filter) > BPF_MAXINSNS)
        goto out;
    struct sock_filter *prog = malloc((size_t)st.st_size);
    if (!prog) {
        s = CI_ERR_NOMEM;
        goto out;
    }
    if (pread(memfd, prog, (size_t)st.st_size, 0) != st.st_size) {
        free(prog);
        goto out;
    }
    sb->seccomp.filter = prog;
    sb->seccomp.len = (unsigned short)(st.st_size / sizeof(struct sock_filter));
    s = CI_OK;
out:
    if (memfd >= 0)
        close(memfd);
    seccomp_release(ctx);
    return s;
}
#undef DENY
