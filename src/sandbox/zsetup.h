/* zsetup.h - what ci-zygote and its small init (ci-zygote-init) share: the
 * SETUP plan parsed (both read the same sealed memfd: the zygote once, each
 * task's init when it starts), the fds the zygote leaves a spare's init, and
 * the note the task process sends its init. See src/zygote/main.c for who
 * does what. Private to the two programs. */
#ifndef CI_SANDBOX_ZSETUP_H
#define CI_SANDBOX_ZSETUP_H

#include <linux/filter.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sandbox/child.h"
#include "sandbox/sandbox_proto.h"

#define MAX_UID_BLOCK 4096

/* The fds of a spare's init as it starts ci-zygote-init (nothing else is
 * open but the zygote's 0-2: /dev/null, /dev/null, its stderr). */
#define INIT_FD_ZYGOTE 3 /* the socket to the zygote: a byte each way for the maps, SPAWN */
#define INIT_FD_CHAN 4   /* the socketpair to the task process (its end is its own fd) */
#define INIT_FD_SETUP 5  /* the sealed SETUP memfd (the per-task steps) */

/* SETUP, parsed. The strings and ops point into the blob it was parsed from. */
struct zsetup {
    unsigned long clone_flags;
    bool cgroupns;
    bool idle_warmup;
    bool idle_keeper;
    uint32_t spares;
    uint32_t uid_block;       /* ZSETUP_TASK_UIDS: task uids at TASK_IDS_INSIDE; 0: none */
    char inotify[2][16];      /* each task's inotify quota (instances, watches); "": none */
    struct op ops[ZYGOTE_MAX_OPS];
    size_t n_ops;
    struct sock_fprog filter; /* .filter NULL: no filter; else malloc'ed (aligned) */
    const char *python;
};

/* Reads the memfd (size bytes, at most ZYGOTE_SETUP_MAX) into a new
 * NUL-terminated blob (*ret_blob, malloc'ed, kept as long as s is used) and
 * parses it into s. 0, or -1 with a sentence in why and errno set. */
int zsetup_read(int fd, uint64_t size, char **ret_blob, struct zsetup *s, char *why,
                size_t why_len);

/* The task process to its init, last thing before the task's code runs:
 * the CPU time it spent before (its warm-up), and its keeper. */
struct task_note {
    int64_t utime_us, stime_us;
    int32_t keeper; /* pid, or 0 */
    int32_t pad;
};

#endif
