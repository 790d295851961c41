/*
 * keymap.c: u32 -> pointer map with open addressing, for the provider's key tables (lkey, rkey, QP number).
 * Lookups happen on every emulated UD operation, so a probe sequence in one flat array beats a list; the
 * tables stay small (one entry per MR or QP) and are rebuilt when a quarter of the slots are tombstones.
 */
#include <errno.h>
#include <stdlib.h>

#include "rnic/verbs/verbs.h"

#define GONE ((void *)1)

static uint32_t slot_of(uint32_t key, uint32_t cap)
{
    /* Keys are device-chosen (index << 8 | random byte): mix so neighbouring indexes spread. */
    uint32_t h = key * 0x9e3779b1u;
    h ^= h >> 15;
    return h & (cap - 1);
}

static int grow(struct rs_v_keymap *map, uint32_t cap)
{
    uint32_t *keys = calloc(cap, sizeof(*keys));
    void **values = calloc(cap, sizeof(*values));
    if (!keys || !values) {
        free(keys);
        free(values);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < map->cap; i++) {
        if (!map->values[i] || map->values[i] == GONE)
            continue;
        uint32_t s = slot_of(map->keys[i], cap);
        while (values[s])
            s = (s + 1) & (cap - 1);
        keys[s] = map->keys[i];
        values[s] = map->values[i];
    }
    free(map->keys);
    free(map->values);
    map->keys = keys;
    map->values = values;
    map->cap = cap;
    map->used = map->live;
    return 0;
}

int rs_v_keymap_put(struct rs_v_keymap *map, uint32_t key, void *value)
{
    if (map->cap == 0 || (map->used + 1) * 4 > map->cap * 3) {
        uint32_t cap = map->cap ? map->cap : 64;
        while ((map->live + 1) * 2 > cap)
            cap *= 2;
        int r = grow(map, cap);
        if (r)
            return r;
    }
    uint32_t s = slot_of(key, map->cap);
    uint32_t first_gone = UINT32_MAX;
    while (map->values[s]) {
        if (map->values[s] == GONE) {
            if (first_gone == UINT32_MAX)
                first_gone = s;
        } else if (map->keys[s] == key) {
            map->values[s] = value;
            return 0;
        }
        s = (s + 1) & (map->cap - 1);
    }
    if (first_gone != UINT32_MAX) {
        s = first_gone;
    } else {
        map->used++;
    }
    map->keys[s] = key;
    map->values[s] = value;
    map->live++;
    return 0;
}

void *rs_v_keymap_get(const struct rs_v_keymap *map, uint32_t key)
{
    if (map->cap == 0)
        return NULL;
    uint32_t s = slot_of(key, map->cap);
    while (map->values[s]) {
        if (map->values[s] != GONE && map->keys[s] == key)
            return map->values[s];
        s = (s + 1) & (map->cap - 1);
    }
    return NULL;
}

void rs_v_keymap_del(struct rs_v_keymap *map, uint32_t key, const void *value)
{
    if (map->cap == 0)
        return;
    uint32_t s = slot_of(key, map->cap);
    while (map->values[s]) {
        if (map->values[s] != GONE && map->keys[s] == key) {
            /* Only the owner removes its entry: a key reused by the device for a newer object stays. */
            if (!value || map->values[s] == value) {
                map->values[s] = GONE;
                map->live--;
            }
            return;
        }
        s = (s + 1) & (map->cap - 1);
    }
}

void rs_v_keymap_free(struct rs_v_keymap *map)
{
    free(map->keys);
    free(map->values);
    map->keys = NULL;
    map->values = NULL;
    map->cap = map->used = map->live = 0;
}
