/* The H2M interface's behaviour, run by tests/capi/test_h2m.py on the cascadelake-optane
 * fixture with nodes 0-1 (DRAM: hbw, low_lat) of 1 MiB and 2-3 (Optane: large_cap) of
 * 64 MiB: every bad input gets its code, placements follow the calling thread's view and
 * the commit strategies, migration keeps pointers and bytes, a forked child is refused,
 * and threads allocate, update, migrate and free at once. Prints "ok ..." per check and
 * "N failed" at the end. Usage: h2m_checks SECONDS_OF_THREADS */
#define _GNU_SOURCE
#include <h2m.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failed;
#define CHECK(cond, what)                                                            \
    do {                                                                             \
        if (cond) printf("ok %s\n", what);                                           \
        else {                                                                       \
            const char *m = tm_last_error();                                         \
            printf("FAIL %s (line %d; last error: %s)\n", what, __LINE__, m ? m : "none"); \
            failed++;                                                                \
        }                                                                            \
    } while (0)

static int node_of(void *p) {
    int n = -1;
    return tm_h2m_node_of(p, &n) == H2M_SUCCESS ? n : -1;
}

static h2m_alloc_trait_t pref(h2m_alloc_trait_value_t space, int prio) {
    h2m_alloc_trait_t t = {h2m_atk_pref_mem_space, {.sz = 0}};
    t.value.atv = space;
    (void)prio;
    return t;
}

static void *alloc2(size_t bytes, h2m_alloc_trait_value_t space, int prio, int *err) {
    h2m_alloc_trait_t t[2] = {pref(space, 0), {h2m_atk_access_prio, {.sz = 0}}};
    t[1].value.i = prio;
    return h2m_alloc_w_traits(bytes, err, 2, t);
}

static void fill(void *p, size_t n, unsigned char v) { memset(p, v, n); }
static int holds(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != v) return 0;
    return 1;
}

/* Kilobytes this process has locked in memory (VmLck in /proc/self/status). */
static long locked_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static double seconds;
static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long rounds = 0, bad = 0;
    do {
        int err;
        size_t n = 4096 * (1 + rand_r(&seed) % 8);
        h2m_alloc_trait_value_t sp[3] = {h2m_atv_mem_space_hbw, h2m_atv_mem_space_low_lat, h2m_atv_mem_space_large_cap};
        unsigned char v = (unsigned char)rand_r(&seed);
        void *p = alloc2(n, sp[rand_r(&seed) % 3], rand_r(&seed) % 20, &err);
        if (!p) { if (err != H2M_OUT_OF_MEMORY) bad++; continue; }
        fill(p, n, v);
        h2m_alloc_trait_t u = pref(sp[rand_r(&seed) % 3], 0);
        if (h2m_update_traits(p, n, 1, &u, rand_r(&seed) % 2) != H2M_SUCCESS) bad++;
        void *only[1] = {p};
        if (h2m_apply_migration_for_allocations(only, 1) != H2M_SUCCESS) bad++;
        if (!holds(p, n, v)) bad++;
        if (h2m_free(p) != H2M_SUCCESS) bad++;
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) < seconds);
    return (void *)(bad ? -1L : rounds);
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 2.0;
    int err = 0;
    const size_t K = 768 << 10;

    /* Before h2m_init. */
    CHECK(h2m_alloc(64, &err) == NULL && err == H2M_NOT_INITIALIZED, "alloc before init");
    CHECK(h2m_apply_migration() == H2M_NOT_INITIALIZED, "migration before init");
    CHECK(h2m_init() == H2M_SUCCESS, "init");
    CHECK(h2m_init() == H2M_ALREADY_INITIALIZED, "init twice");

    /* Bad input. */
    CHECK(h2m_alloc(0, &err) == NULL && err == H2M_INVALID_ARGUMENT, "zero bytes");
    CHECK(h2m_alloc((size_t)1 << 40, &err) == NULL && err == H2M_OUT_OF_MEMORY, "beyond every space");
    h2m_alloc_trait_t unknown = {77, {.sz = 1}};
    CHECK(h2m_alloc_w_traits(64, &err, 1, &unknown) == NULL && err == H2M_INVALID_ARGUMENT &&
              strstr(tm_last_error(), "unknown trait key 77"), "unknown key");
    h2m_alloc_trait_t badv = {h2m_atk_access_mode, {.sz = 0}};
    badv.value.atv = h2m_atv_mem_space_hbw;
    CHECK(h2m_alloc_w_traits(64, &err, 1, &badv) == NULL && err == H2M_INVALID_ARGUMENT, "unknown value");
    CHECK(h2m_alloc_w_traits(64, &err, 2, NULL) == NULL && err == H2M_INVALID_ARGUMENT, "NULL traits");
    CHECK(h2m_alloc_w_traits(64, &err, -1, NULL) == NULL && err == H2M_INVALID_ARGUMENT, "negative count");
    h2m_alloc_trait_t strict[2] = {{h2m_atk_req_mem_space, {.sz = 0}}, {h2m_atk_fallback, {.sz = 0}}};
    strict[0].value.atv = h2m_atv_mem_space_hbw | h2m_atv_mem_space_large_cap;
    strict[1].value.atv = h2m_atv_fallback_error;
    CHECK(h2m_alloc_w_traits(64, &err, 2, strict) == NULL && err == H2M_INVALID_ARGUMENT &&
              strstr(tm_last_error(), "share no device"), "no space satisfies, fallback error");
    int local = 0;
    CHECK(h2m_free(&local) == H2M_NO_SUCH_ALLOCATION, "free of a pointer not from h2m");
    void *p = h2m_alloc(100, &err);
    CHECK(p && err == H2M_SUCCESS && ((size_t)p & 4095) == 0, "alloc, page-aligned");
    CHECK(h2m_free((char *)p + 8) == H2M_NO_SUCH_ALLOCATION, "free inside an allocation");
    CHECK(h2m_free(p) == H2M_SUCCESS && h2m_free(p) == H2M_NO_SUCH_ALLOCATION, "double free");
    CHECK(h2m_free(NULL) == H2M_SUCCESS, "free(NULL)");
    CHECK(h2m_update_traits(&local, 4, 1, &unknown, 1) == H2M_INVALID_ARGUMENT ||
              h2m_update_traits(&local, 4, 0, NULL, 1) == H2M_NO_SUCH_ALLOCATION, "update of a foreign pointer");
    CHECK(h2m_commit_allocs(9) == H2M_INVALID_ARGUMENT, "unknown strategy");
    CHECK(h2m_declare_alloc_w_traits(NULL, 64, 0, NULL) == H2M_INVALID_ARGUMENT, "declare into NULL");

    /* The calling thread's view: nearest node of the space first. */
    tm_h2m_set_node(1);
    void *h1 = alloc2(4096, h2m_atv_mem_space_hbw, 0, &err), *c1 = alloc2(4096, h2m_atv_mem_space_large_cap, 0, &err);
    tm_h2m_set_node(0);
    void *h0 = alloc2(4096, h2m_atv_mem_space_hbw, 0, &err), *c0 = alloc2(4096, h2m_atv_mem_space_large_cap, 0, &err);
    tm_h2m_set_node(-1);
    CHECK(node_of(h1) == 1 && node_of(c1) == 3 && node_of(h0) == 0 && node_of(c0) == 2, "views: near node first");
    h2m_free(h1); h2m_free(c1); h2m_free(h0); h2m_free(c0);

    /* Commit strategies: the slides' A (hbw, prio 1), B (low_lat, 15), C (hbw, 5); each
     * DRAM node holds one. */
    int strategies[2] = {H2M_STRATEGY_FIFO, H2M_STRATEGY_PRIORITY};
    int want[2][3] = {{0, 1, 2}, {2, 0, 1}};
    for (int s = 0; s < 2; s++) {
        void *abc[3];
        h2m_alloc_trait_t t[3][2];
        h2m_alloc_trait_value_t sp[3] = {h2m_atv_mem_space_hbw, h2m_atv_mem_space_low_lat, h2m_atv_mem_space_hbw};
        int prio[3] = {1, 15, 5};
        for (int i = 0; i < 3; i++) {
            t[i][0] = pref(sp[i], 0);
            t[i][1] = (h2m_alloc_trait_t){h2m_atk_access_prio, {.sz = 0}};
            t[i][1].value.dbl = prio[i];
            h2m_declare_alloc_w_traits(&abc[i], K, 2, t[i]);
        }
        CHECK(h2m_commit_allocs(strategies[s]) == H2M_SUCCESS, "commit");
        char what[64];
        snprintf(what, sizeof what, "strategy %d places A, B, C on %d %d %d", strategies[s], want[s][0], want[s][1], want[s][2]);
        CHECK(node_of(abc[0]) == want[s][0] && node_of(abc[1]) == want[s][1] && node_of(abc[2]) == want[s][2], what);
        if (strategies[s] == H2M_STRATEGY_PRIORITY) {
            fill(abc[0], K, 0xA1); fill(abc[1], K, 0xB2); fill(abc[2], K, 0xC3);
            h2m_alloc_trait_t hot[2] = {pref(h2m_atv_mem_space_hbw, 0), {h2m_atk_access_prio, {.sz = 0}}};
            hot[1].value.dbl = 20;
            CHECK(h2m_update_traits(abc[0], K, 2, hot, 1) == H2M_SUCCESS, "update A to prio 20");
            CHECK(h2m_update_traits(abc[0], K + 1, 2, hot, 1) == H2M_INVALID_ARGUMENT, "update with a size beyond the allocation");
            CHECK(h2m_apply_migration() == H2M_SUCCESS, "apply migration");
            CHECK(node_of(abc[0]) == 0 && node_of(abc[1]) == 1 && node_of(abc[2]) == 2, "A moved to node 0, B to 1, C to 2");
            CHECK(holds(abc[0], K, 0xA1) && holds(abc[1], K, 0xB2) && holds(abc[2], K, 0xC3), "same pointers, same bytes after migration");
        }
        for (int i = 0; i < 3; i++) h2m_free(abc[i]);
    }

    /* Partitions: interleaved over large_cap's nodes, blocked over hbw's; data through one
     * pointer; migration moves every part; the partition is fixed. */
    {
        int nodes[8];
        size_t nn = 0;
        h2m_alloc_trait_t it[2] = {pref(h2m_atv_mem_space_large_cap, 0), {h2m_atk_mem_partition, {.sz = 0}}};
        it[1].value.atv = h2m_atv_partition_interleaved;
        size_t bytes = 40 * 4096 + 100;
        unsigned char *x = h2m_alloc_w_traits(bytes, &err, 2, it);
        CHECK(x && tm_h2m_nodes_of(x, nodes, 8, &nn) == H2M_SUCCESS && nn == 2 && nodes[0] == 2 && nodes[1] == 3,
              "interleaved over large_cap: parts on nodes 2 and 3");
        for (size_t i = 0; i < bytes; i++) x[i] = (unsigned char)(i * 7);
        h2m_alloc_trait_t bl[2] = {pref(h2m_atv_mem_space_hbw, 0), {h2m_atk_mem_partition, {.sz = 0}}};
        bl[1].value.atv = h2m_atv_partition_blocked;
        void *y = h2m_alloc_w_traits(512 << 10, &err, 2, bl);
        CHECK(y && tm_h2m_nodes_of(y, nodes, 8, &nn) == H2M_SUCCESS && nn == 2 && nodes[0] == 0 && nodes[1] == 1,
              "blocked over hbw: parts on nodes 0 and 1");
        h2m_free(y);
        h2m_alloc_trait_t hot[2] = {pref(h2m_atv_mem_space_hbw, 0), it[1]};
        CHECK(h2m_update_traits(x, bytes, 2, hot, 1) == H2M_SUCCESS && h2m_apply_migration() == H2M_SUCCESS &&
                  tm_h2m_nodes_of(x, nodes, 8, &nn) == H2M_SUCCESS && nn == 2 && nodes[0] == 0 && nodes[1] == 1,
              "migration moves every part (to nodes 0 and 1)");
        int same = 1;
        for (size_t i = 0; i < bytes; i++) same &= x[i] == (unsigned char)(i * 7);
        CHECK(same, "an interleaved allocation's bytes through one pointer, before and after migration");
        CHECK(h2m_update_traits(x, bytes, 1, bl + 1, 0) == H2M_INVALID_ARGUMENT &&
                  strstr(tm_last_error(), "partition is fixed"), "the partition cannot change");
        CHECK(h2m_free(x) == H2M_SUCCESS, "free an interleaved allocation");
        h2m_alloc_trait_t apart[2] = {{h2m_atk_req_mem_space, {.sz = 0}}, it[1]};
        apart[0].value.atv = h2m_atv_mem_space_hbw | h2m_atv_mem_space_large_cap;
        void *w = h2m_alloc_w_traits(8 * 4096, &err, 2, apart);
        CHECK(w && tm_h2m_nodes_of(w, nodes, 8, &nn) == H2M_SUCCESS && nn >= 1,
              "interleaved over required spaces that share no node: over every candidate");
        h2m_free(w);
        h2m_alloc_trait_t full[3] = {pref(h2m_atv_mem_space_hbw, 0), bl[1], {h2m_atk_fallback, {.sz = 0}}};
        full[2].value.atv = h2m_atv_fallback_error;
        CHECK(h2m_alloc_w_traits(8 << 20, &err, 3, full) == NULL && err == H2M_INVALID_ARGUMENT &&
                  strstr(tm_last_error(), "no node of the allocation's space has room"),
              "a partition that does not fit, fallback error");
    }

    /* Pinned: the range is locked, and stays so after a migration maps it anew
     * (AddressSanitizer makes mlock a no-op, so there only the calls are checked). */
    {
#ifdef __SANITIZE_ADDRESS__
        const long want = 0;
#else
        const long want = 64;
#endif
        long before = locked_kb();
        h2m_alloc_trait_t pin[2] = {pref(h2m_atv_mem_space_hbw, 0), {h2m_atk_mem_pinned, {.sz = 1}}};
        void *z = h2m_alloc_w_traits(64 << 10, &err, 2, pin);
        CHECK(z && locked_kb() >= before + want, "pinned: 64 KiB locked");
        h2m_alloc_trait_t cold[2] = {pref(h2m_atv_mem_space_large_cap, 0), pin[1]};
        CHECK(h2m_update_traits(z, 64 << 10, 2, cold, 1) == H2M_SUCCESS && h2m_apply_migration() == H2M_SUCCESS &&
                  node_of(z) == 2 && locked_kb() >= before + want,
              "pinned: still locked after migration to node 2");
        h2m_free(z);
        CHECK(locked_kb() == before, "pinned: unlocked when freed");
        h2m_alloc_trait_t two = {h2m_atk_mem_pinned, {.sz = 2}};
        CHECK(h2m_alloc_w_traits(64, &err, 1, &two) == NULL && err == H2M_INVALID_ARGUMENT, "pinned: 2 is not 0 or 1");
    }

    /* A forked child is refused. */
    pid_t pid = fork();
    if (pid == 0) {
        void *q = h2m_alloc(64, &err);
        _exit(q == NULL && err == H2M_FORKED ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child gets H2M_FORKED");

    /* Eight threads at once. */
    pthread_t th[8];
    for (long i = 0; i < 8; i++) pthread_create(&th[i], NULL, worker, (void *)(i + 1));
    long total = 0, anybad = 0;
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(th[i], &r);
        if ((long)r < 0) anybad = 1; else total += (long)r;
    }
    printf("threads: %ld rounds in %.1f s\n", total, seconds);
    CHECK(!anybad && total > 0, "8 threads allocate, update, migrate, free");

    CHECK(h2m_finalize() == H2M_SUCCESS, "finalize");
    CHECK(h2m_finalize() == H2M_NOT_INITIALIZED && h2m_alloc(8, &err) == NULL && err == H2M_NOT_INITIALIZED,
          "calls after finalize");
    CHECK(h2m_init() == H2M_SUCCESS && h2m_finalize() == H2M_SUCCESS, "init again after finalize");
    printf("%d failed\n", failed);
    return failed != 0;
}
