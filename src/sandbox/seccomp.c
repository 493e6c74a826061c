/* seccomp.c - the seccomp filter each task loads last, before its code
 * (task_exec in init.c; task_main in ci-zygote, which gets it in SETUP): a
 * deny list, built with libseccomp (which allocates) once, when the sandbox
 * is prepared, and kept as a BPF program, so that the child only has to
 * call seccomp(2) (load_seccomp in sys.h). In front of libseccomp's program
 * sits a short hand-written one that answers ENOSYS to every system call
 * newer than libseccomp's table (guard_unknown): a deny list can only deny
 * what it can name. */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/sandbox_int.h"

/* System calls the code never needs and that are the usual way out of a
 * sandbox or into the kernel's soft spots (Docker's profile, nsjail and
 * SECURITY.md). Everything else libseccomp can name is allowed: numpy,
 * pandas and matplotlib use a wide and changing set, and the namespaces,
 * the dropped capabilities and the rlimits are the main walls; this list
 * narrows the kernel surface behind them. What it cannot name (newer than
 * its table) answers ENOSYS (guard_unknown). Names unknown to this
 * architecture are skipped. */
static const char *const denied_syscalls[] = {
    "acct", "add_key", "adjtimex", "bpf", "chroot", "clock_adjtime", "clock_settime",
    "create_module", "delete_module", "fanotify_init", "finit_module", "fsconfig", "fsmount",
    "fsopen", "fspick", "get_kernel_syms", "init_module", "io_uring_enter",
    "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load",
    "kexec_load", "keyctl", "lookup_dcookie", "modify_ldt", "mount", "mount_setattr",
    "move_mount", "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree",
    "perf_event_open", "pidfd_getfd", "pivot_root", "process_madvise", "process_vm_readv",
    "process_vm_writev", "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot",
    "request_key", "setns", "settimeofday", "swapoff", "swapon", "_sysctl", "sysfs", "syslog",
    "umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vhangup",
    /* Kernel AIO: its pool is host-wide (fs.aio-max-nr, 65536 by default)
     * and counted in no namespace or cgroup, so one io_setup(32768) made the
     * io_setup of every other process on the host fail with EAGAIN for as
     * long as the task lived. Python and its libraries do not use it (glibc's
     * aio_* are threads). */
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup", "io_submit",
    /* Moving pages between NUMA nodes and pinning memory policy to ranges:
     * a task has no business placing memory on the host's nodes (OpenBLAS
     * ignores a failed mbind). get_mempolicy and set_mempolicy stay: libnuma
     * asks them whether NUMA exists. */
    "mbind", "migrate_pages", "move_pages", "set_mempolicy_home_node",
    /* Memory that RLIMIT_AS does not count and no tmpfs size bounds, so
     * that without a memory cgroup a task could hold gigabytes: memfds
     * (256 MiB each, as many as fds), SysV shared memory and message queues
     * (they outlive every mapping). The runtime uses none of them; /dev/shm
     * and /tmp are bounded tmpfs (tests/security/resources.test.mjs).
     * memfd_secret's memory is also hidden from the kernel's own page
     * tables and locked. */
    "memfd_create", "memfd_secret", "msgget", "shmget",
};

/* The highest number libseccomp names for this architecture from `from`
 * up: no rule can name one above it. Its tables run up from 0 with holes of
 * at most a few hundred numbers (mips: 0-456 again from 4000, 5000 or
 * 6000), so the scan ends SCAN_GAP numbers past the last name it found, in
 * a few milliseconds (all 2^32 numbers would take many minutes). from - 1
 * if it names none. */
static int highest_known_nr(int from)
{
    enum { SCAN_GAP = 8192 };
    int max = from - 1;
    for (int nr = from; nr - max <= SCAN_GAP; nr++) {
        char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
        if (name)
            max = nr;
        free(name);
    }
#ifdef __ARM_NR_BASE
    /* 32-bit ARM's own calls (cacheflush, set_tls: glibc needs them) sit
     * far above the table, at 0x0f0000: the guard starts above those. */
    if (from < __ARM_NR_BASE) {
        int arm = highest_known_nr(__ARM_NR_BASE);
        if (arm >= __ARM_NR_BASE)
            max = arm;
    }
#endif
    return max;
}

/* x32 calls on x86_64 carry this bit in their number: above every max, but
 * left to libseccomp's program, which kills them (another ABI). */
#ifdef __X32_SYSCALL_BIT
#define ABI_BIT __X32_SYSCALL_BIT
#else
#define ABI_BIT 0
#endif

enum { GUARD_LEN = 6 };
/* The jump from instruction i of the guard to libseccomp's program. */
#define TO_LIBSECCOMP(i) (GUARD_LEN - 1 - (i))

/* The guard run before libseccomp's program: a native call numbered above
 * max answers ENOSYS (as clone3 does: glibc then falls back to an older
 * call, and code sees "not implemented" rather than "denied"); anything
 * else goes on to libseccomp's program (index GUARD_LEN), which checks the
 * architecture again and kills a foreign one. libseccomp cannot write this
 * itself: its rules compare arguments, never the number. */
static void guard_unknown(struct sock_filter out[GUARD_LEN], uint32_t arch, uint32_t max)
{
    const struct sock_filter guard[GUARD_LEN] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 0, TO_LIBSECCOMP(1)),
        /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* 3 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, max, 0, TO_LIBSECCOMP(3)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, ABI_BIT, TO_LIBSECCOMP(4), 0),
        /* 5 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
    };
    memcpy(out, guard, sizeof(guard));
}
#undef TO_LIBSECCOMP

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

    int max = highest_known_nr(0);
    if (max < 0)
        goto out;
    memfd = memfd_create("ci-seccomp", MFD_CLOEXEC);
    struct stat st;
    if (memfd < 0 || seccomp_export_bpf(ctx, memfd) != 0 || fstat(memfd, &st) != 0 ||
        st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) != 0 ||
        st.st_size / sizeof(struct sock_filter) > BPF_MAXINSNS - GUARD_LEN)
        goto out;
    size_t n = (size_t)st.st_size / sizeof(struct sock_filter);
    struct sock_filter *prog = malloc((GUARD_LEN + n) * sizeof(*prog));
    if (!prog) {
        s = CI_ERR_NOMEM;
        goto out;
    }
    guard_unknown(prog, seccomp_arch_native(), (uint32_t)max);
    if (pread(memfd, prog + GUARD_LEN, (size_t)st.st_size, 0) != st.st_size) {
        free(prog);
        goto out;
    }
    sb->seccomp.filter = prog;
    sb->seccomp.len = (unsigned short)(GUARD_LEN + n);
    s = CI_OK;
out:
    if (memfd >= 0)
        close(memfd);
    seccomp_release(ctx);
    return s;
}
#undef DENY
