/* The greedy planners' placement loop (toolchain/planners/greedy.py), compiled: the same
 * offsets as the Python loop, found without looking at every placed buffer alive beside the
 * new one.
 *
 * Each buffer goes at the lowest offset x >= 0 such that [x, x + size) meets no placed buffer
 * whose life meets its own. Time is cut into blocks of `block` steps; each block keeps
 *   every:   the bytes taken by the placed buffers whose lives meet the block,
 *   whole:   those taken by the ones whose lives cover the block,
 *   partial: the others (lives that start or end inside it), one by one, by start offset,
 * the first two as sorted runs of bytes with neighbours merged. A new buffer's life takes the
 * blocks it covers whole from `every`, and each block it meets only in part from `whole` plus
 * the members of `partial` whose lives meet its own, so exactly the buffers alive beside it
 * count. x rises past whatever meets [x, x + size) in one list after another until none does.
 */

#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int64_t start, end;
} Run;

typedef struct {
    Run *at;
    int64_t count, room;
} Runs;

typedef struct {
    int64_t start, end, first, last;
} Member;

typedef struct {
    Member *at;
    int64_t count, room;
    int64_t widest; /* the largest size among the members */
} Members;

/* Steps of work between two looks at the clock; runs or members moved (at most) per step. */
enum { CLOCK_EVERY = 1 << 12, MOVES_PER_STEP = 64 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Room for `need` items of `item` bytes at *at, doubling; 0 when out of memory. */
static int reserve(void **at, int64_t *room, int64_t need, size_t item) {
    if (need <= *room) {
        return 1;
    }
    int64_t more = *room ? 2 * *room : 8;
    while (more < need) {
        more *= 2;
    }
    void *grown = realloc(*at, (size_t)more * item);
    if (grown == NULL) {
        return 0;
    }
    *at = grown;
    *room = more;
    return 1;
}

/* The int64_t field `field` bytes into item i of an array of `item`-byte items. */
static int64_t key_at(const void *items, size_t item, size_t field, int64_t i) {
    int64_t key;
    memcpy(&key, (const char *)items + (size_t)i * item + field, sizeof key);
    return key;
}

/* The first item from `from` on whose key (sorted rising) is above x, galloping from `from`:
 * the searches that only move on keep where the last one ended. */
static int64_t first_above(const void *items, size_t item, size_t field, int64_t count,
                           int64_t from, int64_t x) {
    int64_t step = 1;
    while (from + step < count && key_at(items, item, field, from + step) <= x) {
        from += step;
        step *= 2;
    }
    int64_t lo = from, hi = from + step < count ? from + step : count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (key_at(items, item, field, mid) > x) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

/* The first run from j on ending after x. */
static int64_t run_ending_after(const Runs *r, int64_t j, int64_t x) {
    return first_above(r->at, sizeof(Run), offsetof(Run, end), r->count, j, x);
}

/* The first run starting after x. */
static int64_t run_starting_after(const Runs *r, int64_t x) {
    return first_above(r->at, sizeof(Run), offsetof(Run, start), r->count, 0, x);
}

/* The first member from k on starting after x. */
static int64_t member_starting_after(const Members *m, int64_t k, int64_t x) {
    return first_above(m->at, sizeof(Member), offsetof(Member, start), m->count, k, x);
}

/* Takes [s, e), merged with the runs it meets or touches. */
static int take(Runs *r, int64_t s, int64_t e) {
    int64_t i = run_ending_after(r, 0, s - 1); /* the first run ending at s or later */
    int64_t j = run_starting_after(r, e);   /* runs i..j-1 meet or touch [s, e) */
    if (i < j) {
        s = r->at[i].start < s ? r->at[i].start : s;
        e = r->at[j - 1].end > e ? r->at[j - 1].end : e;
    } else if (!reserve((void **)&r->at, &r->room, r->count + 1, sizeof(Run))) {
        return 0;
    }
    memmove(r->at + i + 1, r->at + j, (size_t)(r->count - j) * sizeof(Run));
    r->at[i].start = s;
    r->at[i].end = e;
    r->count += 1 - (j - i);
    return 1;
}

/* Raises *x past the runs that meet [*x, *x + size), from run *j on; whether it rose. Adds
 * the runs it passed to *work. */
static int clear_runs(const Runs *r, int64_t *j, int64_t *x, int64_t size, int64_t *work) {
    int rose = 0;
    for (*j = run_ending_after(r, *j, *x); *j < r->count && r->at[*j].start < *x + size; ++*j) {
        *x = r->at[*j].end;
        rose = 1;
        ++*work;
    }
    return rose;
}

static int join(Members *m, int64_t start, int64_t end, int64_t first, int64_t last) {
    if (!reserve((void **)&m->at, &m->room, m->count + 1, sizeof(Member))) {
        return 0;
    }
    int64_t k = member_starting_after(m, 0, start);
    memmove(m->at + k + 1, m->at + k, (size_t)(m->count - k) * sizeof(Member));
    m->at[k] = (Member){start, end, first, last};
    m->count++;
    if (end - start > m->widest) {
        m->widest = end - start;
    }
    return 1;
}

/* Raises *x past the members alive during [first, last] that meet [*x, *x + size) (only
 * members starting less than `widest` bytes below *x can reach it), from member *k on;
 * whether it rose. Adds the members it looked at to *work. */
static int clear_members(const Members *m, int64_t *k, int64_t *x, int64_t size,
                         int64_t first, int64_t last, int64_t *work) {
    int rose = 0;
    for (;;) {
        int64_t top = *x;
        *k = member_starting_after(m, *k, *x - m->widest);
        for (int64_t j = *k; j < m->count && m->at[j].start < *x + size; j++) {
            const Member *a = &m->at[j];
            ++*work;
            if (a->end > top && a->first <= last && a->last >= first) {
                top = a->end;
            }
        }
        if (top == *x) {
            return rose;
        }
        *x = top;
        rose = 1;
    }
}

typedef struct {
    const Runs *runs;       /* a list of runs, or */
    const Members *members; /* the members of a block met in part */
    int64_t at;             /* where the last look at it ended */
} List;

/* Places buffers order[0..n-1] (sizes padded, zero-sized ones at 0), blocks of `block` steps;
 * stops after `max_work` steps of work (a list, run or member looked at, a block updated, a
 * run or member moved), the same on every machine, or at `deadline` (CLOCK_MONOTONIC
 * seconds), looking at the clock after every CLOCK_EVERY steps. Returns how many it placed,
 * or -1 when out of memory. */
int64_t arenac_greedy(int64_t n, const int64_t *size, const int64_t *first, const int64_t *last,
                      const int64_t *order, int64_t block, int64_t max_work, double deadline,
                      int64_t *offset) {
    int64_t steps = 1;
    for (int64_t i = 0; i < n; i++) {
        steps = last[i] + 1 > steps ? last[i] + 1 : steps;
    }
    int64_t blocks = steps / block + 1;
    Runs *every = calloc((size_t)blocks, sizeof(Runs));
    Runs *whole = calloc((size_t)blocks, sizeof(Runs));
    Members *partial = calloc((size_t)blocks, sizeof(Members));
    List *lists = calloc((size_t)(2 * blocks), sizeof(List));
    int64_t placed = -1, work = 0, look = 0;
    if (every == NULL || whole == NULL || partial == NULL || lists == NULL) {
        goto done;
    }
    for (placed = 0; placed < n; placed++) {
        if (work > max_work) {
            goto done;
        }
        if (work >= look) {
            if (now() >= deadline) {
                goto done;
            }
            look = work + CLOCK_EVERY;
        }
        int64_t i = order[placed], z = size[i], f = first[i], l = last[i];
        work += 1 + 2 * (l / block - f / block + 1);
        offset[i] = 0;
        if (z == 0) {
            continue; /* occupies no bytes, so offset 0 collides with nothing */
        }
        int64_t count = 0;
        for (int64_t b = f / block; b <= l / block; b++) {
            if (f <= b * block && l >= (b + 1) * block - 1) {
                if (every[b].count) {
                    lists[count++] = (List){&every[b], NULL, 0};
                }
                continue;
            }
            if (whole[b].count) {
                lists[count++] = (List){&whole[b], NULL, 0};
            }
            if (partial[b].count) {
                lists[count++] = (List){NULL, &partial[b], 0};
            }
        }
        int64_t x = 0;
        for (int64_t k = 0, still = 0; still < count; k = (k + 1) % count) {
            List *list = &lists[k];
            int rose = list->runs ? clear_runs(list->runs, &list->at, &x, z, &work)
                                  : clear_members(list->members, &list->at, &x, z, f, l, &work);
            still = rose ? 1 : still + 1;
            work++;
        }
        offset[i] = x;
        for (int64_t b = f / block; b <= l / block; b++) {
            int ok = take(&every[b], x, x + z);
            work += every[b].count / MOVES_PER_STEP;
            if (f <= b * block && l >= (b + 1) * block - 1) {
                ok = ok && take(&whole[b], x, x + z);
                work += whole[b].count / MOVES_PER_STEP;
            } else {
                ok = ok && join(&partial[b], x, x + z, f, l);
                work += partial[b].count / MOVES_PER_STEP;
            }
            if (!ok) {
                placed = -1;
                goto done;
            }
        }
    }
done:
    for (int64_t b = 0; b < blocks; b++) {
        if (every != NULL) {
            free(every[b].at);
        }
        if (whole != NULL) {
            free(whole[b].at);
        }
        if (partial != NULL) {
            free(partial[b].at);
        }
    }
    free(every);
    free(whole);
    free(partial);
    free(lists);
    return placed;
}
