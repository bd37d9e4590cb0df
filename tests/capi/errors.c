/* Bad input to the C API: every call returns its status and leaves a message naming what
 * and why; nothing is lost (an object stays usable after a refused free). */
#include <stdio.h>
#include <string.h>
#include "tiermem.h"

static int fails = 0;

static void expect(const char *what, tm_status got, tm_status want, const char *needle) {
    const char *msg = tm_last_error();
    if (got != want || (needle && (!msg || !strstr(msg, needle)))) {
        printf("FAIL %s: %s (%s), wanted %s with \"%s\"\n", what, tm_status_name(got),
               msg ? msg : "(no message)", tm_status_name(want), needle ? needle : "");
        fails++;
    } else {
        printf("ok %s: %s: %s\n", what, tm_status_name(got), want == TM_OK ? "" : msg);
    }
}

int main(void) {
    tm_manager *m = NULL;
    tm_device none[1] = {{NULL, 1 << 20}};
    expect("no devices", tm_manager_new(NULL, 0, NULL, &m), TM_INVALID_ARGUMENT, "at least one device");
    expect("NULL spec", tm_manager_new(none, 1, NULL, &m), TM_INVALID_ARGUMENT, "devices[0].spec");
    tm_device bogus[1] = {{"warp-drive", 1 << 20}};
    tm_status s = tm_manager_new(bogus, 1, NULL, &m);
    expect("unknown spec", s, s == TM_UNKNOWN_DEVICE ? TM_UNKNOWN_DEVICE : TM_INVALID_ARGUMENT, "warp-drive");
    tm_device dram[2] = {{"dram", 1 << 20}, {"numa:0", 1 << 20}};
    expect("unknown policy", tm_manager_new(dram, 2, "clairvoyant", &m), TM_INVALID_ARGUMENT, "clairvoyant");
    expect("good manager", tm_manager_new(dram, 2, "lru", &m), TM_OK, NULL);
    if (fails) return 1; /* the rest needs the manager */
    uint64_t id, big, t, t2;
    expect("NULL manager", tm_alloc(NULL, 64, TM_PLACE_FAST, &id), TM_INVALID_ARGUMENT, "NULL");
    expect("zero bytes", tm_alloc(m, 0, TM_PLACE_FAST, &id), TM_INVALID_ARGUMENT, "zero");
    expect("bad place", tm_alloc(m, 64, -9, &id), TM_INVALID_ARGUMENT, "place code -9");
    expect("too big", tm_alloc(m, 1 << 30, TM_PLACE_FAST, &big), TM_DEVICE_FULL, "is full");
    expect("alloc", tm_alloc(m, 4096, TM_PLACE_FAST, &id), TM_OK, NULL);
    void *p;
    size_t len;
    expect("pin", tm_pin(m, id, 1, &p, &len, &t), TM_OK, NULL);
    if (fails) return 1;
    memset(p, 7, len);
    expect("free pinned", tm_free(m, id), TM_PINNED, "pin");
    expect("move pinned", tm_move(m, id, TM_PLACE_SLOW), TM_PINNED, "pin");
    expect("pin NULL out", tm_pin(m, id, 0, NULL, &len, &t2), TM_INVALID_ARGUMENT, "NULL");
    expect("unpin", tm_unpin(m, t), TM_OK, NULL);
    expect("unpin twice", tm_unpin(m, t), TM_GUARD, NULL);
    expect("move", tm_move(m, id, TM_PLACE_SLOW), TM_OK, NULL);
    size_t dev = 0;
    expect("device_of", tm_device_of(m, id, &dev), TM_OK, NULL);
    if (dev != 1) { printf("FAIL moved object on device %zu\n", dev); fails++; }
    expect("pin again", tm_pin(m, id, 0, &p, &len, &t), TM_OK, NULL);
    if (fails) return 1;
    if (((unsigned char *)p)[len - 1] != 7) { printf("FAIL data lost in the move\n"); fails++; }
    expect("unpin again", tm_unpin(m, t), TM_OK, NULL);
    expect("free", tm_free(m, id), TM_OK, NULL);
    expect("free twice", tm_free(m, id), TM_NO_SUCH_OBJECT, NULL);
    tm_manager_free(m);
    tm_manager_free(NULL);
    printf("%d failed\n", fails);
    return fails != 0;
}
