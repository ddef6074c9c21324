/*
 * The compiled loop of the canonical dive; toolchain/planners/skyline.py explains the method
 * and is the only caller (through ctypes). Plain C99; memory is taken once, before the loop.
 *
 * Lives are ranks of time (0 .. times-1, both ends included). A segment tree over the times
 * keeps the highest top placed at each time: `cover` is the top every time under a node has
 * at least, `most` the highest top at any time under it.
 */

#include <stdint.h>
#include <stdlib.h>

typedef int64_t i64;

typedef struct {
    i64 *cover, *most;
} Skyline;

static i64 max64(i64 a, i64 b) { return a > b ? a : b; }

/* Every time in [lo, hi] gets a top of at least `top`. */
static void raise_tops(Skyline *t, i64 node, i64 from, i64 to, i64 lo, i64 hi, i64 top)
{
    if (hi < from || to < lo)
        return;
    t->most[node] = max64(t->most[node], top);
    if (lo <= from && to <= hi) {
        t->cover[node] = max64(t->cover[node], top);
        return;
    }
    i64 mid = from + (to - from) / 2;
    raise_tops(t, 2 * node, from, mid, lo, hi, top);
    raise_tops(t, 2 * node + 1, mid + 1, to, lo, hi, top);
}

/* The highest top at any time in [lo, hi]. */
static i64 highest_top(const Skyline *t, i64 node, i64 from, i64 to, i64 lo, i64 hi)
{
    if (hi < from || to < lo)
        return 0;
    if (lo <= from && to <= hi)
        return t->most[node];
    i64 mid = from + (to - from) / 2;
    return max64(t->cover[node], max64(highest_top(t, 2 * node, from, mid, lo, hi),
                                       highest_top(t, 2 * node + 1, mid + 1, to, lo, hi)));
}

/* A heap of buffers by (floor, rank): the floor is a lower bound of the buffer's floor. */
typedef struct {
    i64 floor, rank;
} Entry;

static int earlier(const Entry *a, const Entry *b)
{
    return a->floor < b->floor || (a->floor == b->floor && a->rank < b->rank);
}

static void push(Entry *heap, i64 *count, Entry entry)
{
    i64 k = (*count)++;
    while (k > 0 && earlier(&entry, &heap[(k - 1) / 2])) {
        heap[k] = heap[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    heap[k] = entry;
}

static Entry pop(Entry *heap, i64 *count)
{
    Entry top = heap[0], last = heap[--*count];
    i64 k = 0;
    for (;;) {
        i64 child = 2 * k + 1;
        if (child >= *count)
            break;
        if (child + 1 < *count && earlier(&heap[child + 1], &heap[child]))
            child++;
        if (!earlier(&heap[child], &last))
            break;
        heap[k] = heap[child];
        k = child;
    }
    if (*count > 0)
        heap[k] = last;
    return top;
}

/*
 * Places the buffers by the canonical dive: the buffer whose floor (the highest top placed
 * during its life) is lowest goes next, at its floor, ties by `order` (buffer ids, first
 * wins). Writes `offset`; returns 0, or -1 when memory runs out.
 *
 * The heap holds a lower bound of each floor: a buffer taken with a floor that has risen since
 * is put back with its floor as it is now. That happens at most once per partner placed in
 * between, so the loop takes at most n plus twice the pairs of meeting lives steps.
 */
i64 arenac_skyline(i64 n, const i64 *size, const i64 *first, const i64 *last, const i64 *order,
                   i64 times, i64 *offset)
{
    Skyline tree = {calloc(4 * (size_t)times + 4, sizeof(i64)),
                    calloc(4 * (size_t)times + 4, sizeof(i64))};
    Entry *heap = malloc(((size_t)n + 1) * sizeof(Entry));
    i64 *buffer_at = malloc(((size_t)n + 1) * sizeof(i64));
    if (!tree.cover || !tree.most || !heap || !buffer_at) {
        free(tree.cover);
        free(tree.most);
        free(heap);
        free(buffer_at);
        return -1;
    }
    i64 count = 0;
    for (i64 r = 0; r < n; r++) {
        i64 i = order[r];
        buffer_at[r] = i;
        offset[i] = 0; /* an empty buffer stays there: it collides with nothing */
        if (size[i] > 0)
            push(heap, &count, (Entry){0, r});
    }
    while (count > 0) {
        Entry next = pop(heap, &count);
        i64 i = buffer_at[next.rank];
        i64 floor = highest_top(&tree, 1, 0, times - 1, first[i], last[i]);
        if (floor > next.floor) { /* something placed since rose under its life: requeue */
            push(heap, &count, (Entry){floor, next.rank});
            continue;
        }
        offset[i] = floor;
        raise_tops(&tree, 1, 0, times - 1, first[i], last[i], floor + size[i]);
    }
    free(tree.cover);
    free(tree.most);
    free(heap);
    free(buffer_at);
    return 0;
}
