/*
 * soft_device.c: the software RNIC as a provider: opening a device (its capabilities and its progress thread),
 * the operation table rnic.c dispatches through, counters, and the TEST ONLY drop knob.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "rnic/soft/soft.h"
#include "rnic/soft/ud.h"

static void soft_close(struct rs_rnic *rnic);

static const struct rs_rnic_ops soft_ops = {
    .close = soft_close,
    .alloc_pd = rs_soft_alloc_pd,
    .dealloc_pd = rs_soft_dealloc_pd,
    .reg_mr = rs_soft_reg_mr,
    .dereg_mr = rs_soft_dereg_mr,
    .mr_invalidate = rs_soft_mr_invalidate,
    .mr_rekey = rs_soft_mr_rekey,
    .create_cq = rs_soft_create_cq,
    .destroy_cq = rs_soft_destroy_cq,
    .cq_fd = rs_soft_cq_fd,
    .cq_arm = rs_soft_cq_arm,
    .cq_ack_events = rs_soft_cq_ack_events,
    .poll_cq = rs_soft_poll_cq,
    .cq_wait_begin = rs_soft_cq_wait_begin,
    .cq_wait_recheck = rs_soft_cq_wait_recheck,
    .cq_wait_end = rs_soft_cq_wait_end,
    .create_srq = rs_soft_create_srq,
    .destroy_srq = rs_soft_destroy_srq,
    .create_qp = rs_soft_create_qp,
    .destroy_qp = rs_soft_destroy_qp,
    .qp_state = rs_soft_qp_state,
    .qp_num = rs_soft_qp_num,
    .qp_set_qos = rs_soft_qp_set_qos,
    .qp_set_error = rs_soft_qp_set_error,
    .post_send = rs_soft_post_send,
    .post_recv = rs_soft_post_recv,
    .post_srq_recv = rs_soft_post_srq_recv,
    .ud_bind = rs_soft_ud_bind,
    .ud_local_addr = rs_soft_ud_local_addr,
    .ud_resolve_peer = rs_soft_ud_resolve_peer,
    .ud_peer_free = rs_soft_ud_peer_free,
    .ud_join_multicast = rs_soft_ud_join_multicast,
    .ud_leave_multicast = rs_soft_ud_leave_multicast,
    .ud_adopt_fd = rs_soft_ud_adopt_fd,
    .ud_set_raw_limits = rs_soft_ud_set_raw_limits,
    .ud_take_raw = rs_soft_ud_take_raw,
    .ud_counters = rs_soft_ud_counters,
    .cm_create = rs_soft_cm_create,
    .cm_destroy = rs_soft_cm_destroy,
    .cm_fd = rs_soft_cm_fd,
    .cm_get_event = rs_soft_cm_get_event,
    .listen = rs_soft_listen,
    .listener_addr = rs_soft_listener_addr,
    .listener_close = rs_soft_listener_close,
    .listener_park = rs_soft_listener_park,
    .listener_intake = rs_soft_listener_intake,
    .connect = rs_soft_connect,
    .accept = rs_soft_accept,
    .reject = rs_soft_reject,
    .disconnect = rs_soft_disconnect,
    .qp_local_addr = rs_soft_qp_local_addr,
    .qp_reads_placed_directly = rs_soft_qp_reads_placed_directly,
};

uint64_t rs_soft_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Parses "per_million[:seed]"; false when malformed. */
static bool parse_drop_env(const char *text, uint32_t *per_million, uint64_t *seed)
{
    char *end;
    errno = 0;
    unsigned long pm = strtoul(text, &end, 10);
    if (errno || end == text || pm > 1000000)
        return false;
    uint64_t s = 1;
    if (*end == ':') {
        const char *p = end + 1;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || end == p)
            return false;
        s = v;
    }
    if (*end != '\0')
        return false;
    *per_million = (uint32_t)pm;
    *seed = s;
    return true;
}

static void fill_caps(struct rs_soft_device *dev)
{
    struct rs_rnic_caps *caps = &dev->base.caps;
    memset(caps, 0, sizeof(*caps));
    caps->kind = RS_RNIC_KIND_SOFT;
    strcpy(caps->name, "soft");
    caps->max_qp_wr = RS_SOFT_MAX_QP_WR;
    caps->max_sge = RS_SOFT_MAX_SGE;
    caps->max_inline = RS_SOFT_MAX_INLINE;
    caps->max_cqe = RS_SOFT_MAX_CQE;
    caps->max_rc_msg = RS_SOFT_MAX_RC_MSG;
    caps->max_ud_msg = dev->ud_segment_len;
    caps->max_record_msg = dev->ud_segment_len * RS_UD_MAX_SEGMENTS;
    caps->max_connect_private_data = RS_MPA_MAX_PRIVATE_DATA - RS_MPA_V2_IRD_ORD_LEN;
    caps->max_accept_private_data = RS_MPA_MAX_PRIVATE_DATA - RS_MPA_V2_IRD_ORD_LEN;
    if (caps->max_connect_private_data > 256)
        caps->max_connect_private_data = 256;   /* struct rs_rnic_cm_event carries at most 256 bytes */
    if (caps->max_accept_private_data > 256)
        caps->max_accept_private_data = 256;
    caps->max_ird = RS_SOFT_MAX_IRD;
    caps->max_ord = RS_SOFT_MAX_ORD;
    caps->has_srq = true;
    caps->has_xrc = false;
    caps->has_write_with_imm = false;
    caps->has_send_with_imm = false;
    caps->has_native_write_record = true;
    caps->mr_pins_pages = false;
    caps->copies_payload = true;
}

static int soft_open(const struct sockaddr *local_addr, struct rs_rnic **out)
{
    *out = NULL;
    /* Kernel sockets serve any IPv4 or IPv6 address the host has; binding later says if it is not local. */
    if (local_addr && local_addr->sa_family != AF_INET && local_addr->sa_family != AF_INET6)
        return -ENODEV;
    struct rs_soft_device *dev = calloc(1, sizeof(*dev));
    if (!dev)
        return -ENOMEM;
    dev->base.ops = &soft_ops;
    dev->next_qpn = 1;
    dev->ud_segment_len = RS_UD_SEG_LEN;
    pthread_mutex_init(&dev->lock, NULL);
    fill_caps(dev);
    int rc = rs_soft_mr_table_init(dev);
    if (rc == 0)
        rc = rs_soft_progress_start(dev);
    if (rc != 0) {
        rs_soft_mr_table_fini(dev);
        pthread_mutex_destroy(&dev->lock);
        free(dev);
        return rc;
    }
    const char *drop = getenv("RDMASOCK_SOFT_TEST_DROP");
    if (drop && *drop) {
        uint32_t per_million;
        uint64_t seed;
        if (parse_drop_env(drop, &per_million, &seed))
            rs_soft_test_set_drop(&dev->base, per_million, seed);
        else
            RS_WARN("RDMASOCK_SOFT_TEST_DROP=%s ignored: expected per_million[:seed]", drop);
    }
    RS_DEBUG("soft rnic opened (%p)", (void *)dev);
    *out = &dev->base;
    return 0;
}

static void soft_close(struct rs_rnic *rnic)
{
    struct rs_soft_device *dev = rs_soft_dev(rnic);
    rs_soft_progress_stop(dev);
    rs_soft_mr_table_fini(dev);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

const struct rs_rnic_provider rs_rnic_soft_provider = {
    .kind = RS_RNIC_KIND_SOFT,
    .name = "soft",
    .open = soft_open,
};

void rs_soft_get_stats(struct rs_rnic *rnic, struct rs_soft_stats *out)
{
    const struct rs_soft_device *dev = rs_soft_dev(rnic);
    const uint64_t *src = (const uint64_t *)&dev->stats;
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

/* ---- TEST ONLY ---- */

void rs_soft_test_set_drop(struct rs_rnic *rnic, uint32_t per_million, uint64_t seed)
{
    struct rs_soft_device *dev = rs_soft_dev(rnic);
    pthread_mutex_lock(&dev->lock);
    dev->test_drop_per_million = per_million > 1000000 ? 1000000 : per_million;
    dev->test_drop_state = seed ? seed : 0x9e3779b97f4a7c15ull;
    pthread_mutex_unlock(&dev->lock);
    if (per_million)
        RS_WARN("soft rnic: TEST ONLY drop knob active: %u per million inbound UD datagrams dropped", per_million);
}

bool rs_soft_test_should_drop(struct rs_soft_device *dev)
{
    if (!__atomic_load_n(&dev->test_drop_per_million, __ATOMIC_RELAXED))
        return false;
    pthread_mutex_lock(&dev->lock);
    /* xorshift64*: deterministic for a seed, good enough to pick datagrams. */
    uint64_t x = dev->test_drop_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    dev->test_drop_state = x;
    uint64_t r = (x * 0x2545f4914f6cdd1dull) >> 32;
    bool drop = (r % 1000000u) < dev->test_drop_per_million;
    pthread_mutex_unlock(&dev->lock);
    if (drop)
        RS_SOFT_STAT(dev, rx_drop_test, 1);
    return drop;
}
