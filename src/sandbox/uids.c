/* uids.c - the task uids: when the worker is root, the code of each task
 * runs as a uid of its own outside (local.task_uid_first, _count), and the
 * sandbox's init as local.sandbox_uid. The kernel counts some resources per
 * user (inotify instances and watches, pipe pages, fds in flight), so with
 * one uid for all, one task could starve the others; and init, with a uid
 * the code does not have, is out of its reach (prlimit, setpriority,
 * signals).
 *
 * The range is cut in two. Cold runs take one uid each from the first
 * `cold` (one per task slot), given back when every process of the run is
 * dead. Each zygote gets a block of `block` uids (one per task or spare it
 * may hold at once), mapped into its namespace at TASK_IDS_INSIDE; it hands
 * them to its spares itself (src/zygote/main.c). A block is free again once
 * the zygote that held it is reaped (the pool's reaped callback): its
 * tasks died with it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox/sandbox_int.h"

ci_status uids_init(struct task_uids *u, const struct ci_config *cfg, bool root, bool warm,
                    struct ci_error *err)
{
    memset(u, 0, sizeof(*u));
    if (!root || cfg->local.task_uid_count == 0)
        return CI_OK;
    struct ci_task_uid_layout l;
    ci_config_task_uid_layout(cfg, &l);
    u->first = cfg->local.task_uid_first;
    u->count = cfg->local.task_uid_count;
    u->cold = l.cold;
    u->block = l.block;
    uint32_t rest = u->count > u->cold ? u->count - u->cold : 0;
    u->blocks = rest / u->block;
    if (u->blocks > UIDS_MAX_BLOCKS)
        u->blocks = UIDS_MAX_BLOCKS;
    uint32_t need = warm ? l.need_warm : l.cold;
    if (u->count < need) /* the config's check says it at load; a defence only */
        return ci_error_set(err, CI_ERR_INVALID, "local.task_uid_count %u is too small: %u "
                            "needed", u->count, need);
    u->cold_used = calloc(u->cold, 1);
    if (!u->cold_used)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (pthread_mutex_init(&u->lock, NULL) != 0) {
        free(u->cold_used);
        u->cold_used = NULL;
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    u->on = true;
    return CI_OK;
}

void uids_release(struct task_uids *u)
{
    if (u->on)
        pthread_mutex_destroy(&u->lock);
    free(u->cold_used);
    memset(u, 0, sizeof(*u));
}

ci_status uids_take_cold(struct task_uids *u, uint32_t *ret_slot)
{
    ci_status s = CI_ERR_LIMIT;
    pthread_mutex_lock(&u->lock);
    for (uint32_t i = 0; i < u->cold; i++)
        if (!u->cold_used[i]) {
            u->cold_used[i] = 1;
            *ret_slot = i;
            s = CI_OK;
            break;
        }
    pthread_mutex_unlock(&u->lock);
    return s;
}

void uids_give_cold(struct task_uids *u, uint32_t slot)
{
    if (!u->on || slot >= u->cold)
        return;
    pthread_mutex_lock(&u->lock);
    u->cold_used[slot] = 0;
    pthread_mutex_unlock(&u->lock);
}

int uids_take_block(struct task_uids *u)
{
    int b = -1;
    pthread_mutex_lock(&u->lock);
    for (uint32_t i = 0; i < u->blocks; i++)
        if (!u->block_taken[i]) {
            u->block_taken[i] = true;
            b = (int)i;
            break;
        }
    pthread_mutex_unlock(&u->lock);
    return b;
}

void uids_give_block(struct task_uids *u, int block)
{
    if (!u->on || block < 0 || (uint32_t)block >= u->blocks)
        return;
    pthread_mutex_lock(&u->lock);
    u->block_taken[block] = false;
    pthread_mutex_unlock(&u->lock);
}
