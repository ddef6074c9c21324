/*
 * The compiled core of the canonical search; toolchain/planners/canonical.py explains the
 * method and is the only caller (through ctypes). One question per call: do these buffers fit
 * within `capacity` bytes? Plain C99; memory is taken once, before the search starts.
 */

#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int64_t i64;
#ifndef HATLESS
#define HATLESS 1
#endif

enum { FOUND = 1, INFEASIBLE = 0, OUT_OF_NODES = -1, OUT_OF_TIME = -2, NO_MEMORY = -3 };

typedef struct {
    /* the problem, by buffer */
    int n;
    const i64 *size;
    const i64 *nb_start;  /* time neighbours (CSR): once buffer i sits at o,            */
    const int *nb_other;  /* an unplaced nb_other[k] may only go at o + nb_eff[k] or    */
    const i64 *nb_eff;    /* higher                                                      */
    i64 *rise;            /* the least nb_eff of i (or its size): its top in a section  */
    const i64 *pair_start; /* declared pairs (CSR): the partner, the one section both   */
    const int *pair_other; /* live in, and the bytes they may share there               */
    int *pair_section;
    const i64 *pair_share;
    i64 alignment, capacity;
    /* sections: the sets of buffers alive at one time that no other such set contains */
    int n_sections;
    int *span_lo, *span_hi; /* buffer i is alive in sections [lo, hi) */
    /* the current preorder */
    i64 *rank;              /* position of each buffer in it (per group, after a split) */
    const i64 *keys;        /* static preorder keys by letter: W, A, Z, C (n each) */
    const char *letters;    /* the current preorder's keys, compared in turn, larger first */
    int rerank;             /* whether groups get their own preorder after a split */
    int *twin;              /* the identical buffer just before it, which goes first, or -1 */
    /* search state, every change on the trail */
    i64 *offset;            /* -1 while unplaced */
    i64 *floor;             /* the lowest offset an unplaced buffer may still take */
    i64 *section_floor;     /* no unplaced buffer alive in the section goes lower */
    i64 *section_total;     /* unplaced bytes alive in the section, less what pairs share */
    i64 *cut;               /* unplaced buffers alive in both section s and s + 1 */
    i64 *need;              /* scratch of one node: bytes per section (see `crowded`) */
    i64 *counted;           /* scratch of one node: the node that counted a buffer in `need` */
    i64 *solution;
    i64 **trail_at;
    i64 *trail_old;
    size_t trail_len, trail_cap;
    int *pool;              /* a stack of buffer lists, one or two per open node */
    size_t pool_len, pool_cap;
    i64 nodes_left, nodes_used;
    struct timespec deadline;
} Search;

static int past_deadline(const Search *s)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > s->deadline.tv_sec ||
           (now.tv_sec == s->deadline.tv_sec && now.tv_nsec >= s->deadline.tv_nsec);
}

static int remember(Search *s, i64 *at)
{
    if (s->trail_len == s->trail_cap) {
        size_t cap = 2 * s->trail_cap;
        i64 **at_grown = realloc(s->trail_at, cap * sizeof *at_grown);
        if (!at_grown) return 0;
        s->trail_at = at_grown;
        i64 *old_grown = realloc(s->trail_old, cap * sizeof *old_grown);
        if (!old_grown) return 0;
        s->trail_old = old_grown;
        s->trail_cap = cap;
    }
    s->trail_at[s->trail_len] = at;
    s->trail_old[s->trail_len] = *at;
    s->trail_len++;
    return 1;
}

static int set(Search *s, i64 *at, i64 value)
{
    if (*at == value) return 1;
    if (!remember(s, at)) return 0;
    *at = value;
    return 1;
}

static void undo(Search *s, size_t mark)
{
    while (s->trail_len > mark) {
        s->trail_len--;
        *s->trail_at[s->trail_len] = s->trail_old[s->trail_len];
    }
}

static int *take(Search *s, int count)
{
    if (s->pool_len + (size_t)count > s->pool_cap) return NULL;
    int *block = s->pool + s->pool_len;
    s->pool_len += (size_t)count;
    return block;
}

static i64 aligned_up(i64 value, i64 alignment)
{
    i64 rest = value % alignment;
    return rest ? value + alignment - rest : value;
}

static int before(const Search *s, int a, int b)
{
    return s->floor[a] < s->floor[b] || (s->floor[a] == s->floor[b] && s->rank[a] < s->rank[b]);
}

/* By floor, then rank. Insertion sort: a child's list is its parent's with a few floors
 * raised, so it is nearly sorted already. */
static void sort_by_floor(const Search *s, int *items, int count)
{
    for (int k = 1; k < count; k++) {
        int item = items[k];
        int j = k - 1;
        while (j >= 0 && before(s, item, items[j])) {
            items[j + 1] = items[j];
            j--;
        }
        items[j + 1] = item;
    }
}

/* Puts buffer i at `at`. Sets *hatless when no unplaced buffer shares time with it. */
static int place(Search *s, int i, i64 at, int *hatless)
{
    if (!set(s, &s->offset[i], at)) return 0;
    s->solution[i] = at;
    *hatless = 1;
    for (i64 k = s->nb_start[i]; k < s->nb_start[i + 1]; k++) {
        int other = s->nb_other[k];
        if (s->offset[other] >= 0) continue;
        *hatless = 0;
        i64 raised = aligned_up(at + s->nb_eff[k], s->alignment);
        if (raised > s->floor[other] && !set(s, &s->floor[other], raised)) return 0;
    }
    i64 top = at + s->rise[i];
    for (int sec = s->span_lo[i]; sec < s->span_hi[i]; sec++) {
        if (!set(s, &s->section_total[sec], s->section_total[sec] - s->size[i])) return 0;
        if (top > s->section_floor[sec] && !set(s, &s->section_floor[sec], top)) return 0;
        if (sec + 1 < s->span_hi[i] && !set(s, &s->cut[sec], s->cut[sec] - 1)) return 0;
    }
    /* a pair with a partner still unplaced no longer shares among the unplaced */
    for (i64 k = s->pair_start[i]; k < s->pair_start[i + 1]; k++) {
        int sec = s->pair_section[k];
        if (sec < 0 || s->offset[s->pair_other[k]] >= 0) continue;
        if (!set(s, &s->section_total[sec], s->section_total[sec] + s->pair_share[k])) return 0;
    }
    return 1;
}

/* Every section of the part holds what its floor leaves plus its unplaced bytes, all above
 * `at`, the offset just taken (offsets never decrease along a branch). */
static int sections_fit(const Search *s, int lo, int hi, i64 at)
{
    for (int sec = lo; sec < hi; sec++) {
        i64 floor = s->section_floor[sec] > at ? s->section_floor[sec] : at;
        if (floor + s->section_total[sec] > s->capacity) return 0;
    }
    return 1;
}

/* Whether some section is too crowded: the unplaced buffers alive there whose floors are at or
 * above some f all lie above f, so f plus the bytes they add must fit, for every such f. Walks
 * the node's buffers (sorted by floor) from the highest floor down, adding each to its
 * sections; a pair both counted shares its bytes once. */
static int crowded(Search *s, const int *items, int count, int lo, int hi, i64 low)
{
    for (int sec = lo; sec < hi; sec++) s->need[sec] = 0;
    i64 stamp = s->nodes_used;
    for (int k = count - 1; k >= 0; k--) {
        int i = items[k];
        i64 at = s->floor[i] > low ? s->floor[i] : low;
        s->counted[i] = stamp;
        for (i64 p = s->pair_start[i]; p < s->pair_start[i + 1]; p++) {
            int other = s->pair_other[p], sec = s->pair_section[p];
            if (sec >= lo && sec < hi && s->offset[other] < 0 && s->counted[other] == stamp)
                s->need[sec] -= s->pair_share[p];
        }
        for (int sec = s->span_lo[i]; sec < s->span_hi[i]; sec++) {
            s->need[sec] += s->size[i];
            if (at + s->need[sec] > s->capacity) return 1;
        }
    }
    return 0;
}

static int search(Search *s, int *items, int count, int lo, int hi, i64 low, i64 last_rank);

/* The most unplaced bytes alive at any section of buffer i's life. */
static i64 busiest(const Search *s, int i)
{
    i64 most = 0;
    for (int sec = s->span_lo[i]; sec < s->span_hi[i]; sec++)
        if (s->section_total[sec] > most) most = s->section_total[sec];
    return most;
}

static const Search *ranking;   /* qsort has no context argument in C99 */
static i64 *ranking_busiest;

static int preorder_compare(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    for (const char *c = ranking->letters; *c; c++) {
        i64 ka, kb;
        if (*c == 'T') {
            ka = ranking_busiest[a], kb = ranking_busiest[b];
        } else {
            int column = *c == 'W' ? 0 : *c == 'A' ? 1 : *c == 'Z' ? 2 : 3;
            ka = ranking->keys[(size_t)column * (size_t)ranking->n + (size_t)a];
            kb = ranking->keys[(size_t)column * (size_t)ranking->n + (size_t)b];
        }
        if (ka != kb) return ka > kb ? -1 : 1;
    }
    return (a > b) - (a < b);
}

/* A group split off gets its own preorder, by the bytes still unplaced around each buffer. */
static int rank_group(Search *s, int *group, int count)
{
    for (int k = 0; k < count; k++) s->need[group[k]] = busiest(s, group[k]);
    ranking = s;
    ranking_busiest = s->need;
    qsort(group, (size_t)count, sizeof *group, preorder_compare);
    for (int k = 0; k < count; k++)
        if (!set(s, &s->rank[group[k]], k)) return 0;
    return 1;
}

/* The unplaced `items` of sections [lo, hi) after buffer `last` went to `low`: searched as
 * one, or, where no unplaced buffer crosses between two sections any more, as independent
 * groups, each from offset 0 (a group's canonical order need not continue its parent's). */
static int continue_part(Search *s, int *items, int count, int lo, int hi, i64 low, int last)
{
    int split = 0;
    for (int sec = lo; sec + 1 < hi && !split; sec++) split = s->cut[sec] == 0;
    if (!split) return search(s, items, count, lo, hi, low, s->rank[last]);
    size_t pool_mark = s->pool_len;
    int *group = take(s, count);
    if (!group) return NO_MEMORY;
    int status = FOUND;
    for (int start = lo; start < hi && status == FOUND;) {
        int stop = start + 1;
        while (stop < hi && s->cut[stop - 1] != 0) stop++;
        int members = 0;
        for (int k = 0; k < count; k++)
            if (s->span_lo[items[k]] < stop && s->span_hi[items[k]] > start)
                group[members++] = items[k];
        if (!members) {
            start = stop;
            continue;
        }
        if (s->rerank && !rank_group(s, group, members)) {
            status = NO_MEMORY;
            break;
        }
        status = search(s, group, members, start, stop, low, s->rerank ? -1 : s->rank[last]);
        start = stop;
    }
    s->pool_len = pool_mark;
    return status;
}

/* Depth-first over the next buffer to place, each at its floor, lowest first. */
static int search(Search *s, int *items, int count, int lo, int hi, i64 low, i64 last_rank)
{
    if (count == 0) return FOUND;
    if (s->nodes_left == 0) return OUT_OF_NODES;
    s->nodes_left--;
    s->nodes_used++;
    if ((s->nodes_used & 255) == 0 && past_deadline(s)) return OUT_OF_TIME;
    sort_by_floor(s, items, count);
    /* Dominance: nothing goes at or above the lowest top an unplaced buffer could have, or
     * that buffer would drop into the gap below it. */
    i64 ceiling = INT64_MAX;
    for (int k = 0; k < count; k++) {
        i64 top = s->floor[items[k]] + s->size[items[k]];
        if (top > s->capacity) return INFEASIBLE;
        if (top < ceiling) ceiling = top;
    }
    if (crowded(s, items, count, lo, hi, low)) return INFEASIBLE;
    size_t pool_mark = s->pool_len;
    int *rest = take(s, count - 1);
    if (count > 1 && !rest) return NO_MEMORY;
    int status = INFEASIBLE;
    for (int k = 0; k < count && status == INFEASIBLE; k++) {
        int i = items[k];
        i64 at = s->floor[i];
        if (at >= ceiling) break;
        if (at < low || (at == low && s->rank[i] < last_rank)) continue;
        if (s->twin[i] >= 0 && s->offset[s->twin[i]] < 0) continue;
        size_t mark = s->trail_len;
        int hatless = 0;
        if (!place(s, i, at, &hatless)) {
            status = NO_MEMORY;
        } else if (sections_fit(s, lo, hi, at)) {
            int left = 0;
            for (int j = 0; j < count; j++)
                if (items[j] != i) rest[left++] = items[j];
            status = continue_part(s, rest, left, lo, hi, at, i);
        }
        undo(s, mark);
        if (HATLESS && hatless && status == INFEASIBLE) break; /* it disturbed nothing: no other choice helps */
    }
    s->pool_len = pool_mark;
    return status;
}

/* Sections, spans, pair sections and cuts from the lives [lower, upper). */
static int sweep(Search *s, const i64 *lower, const i64 *upper, const i64 *pair_time)
{
    int n = s->n;
    i64 *times = malloc(2 * (size_t)n * sizeof *times);
    if (!times) return 0;
    for (int i = 0; i < n; i++) {
        times[2 * i] = lower[i];
        times[2 * i + 1] = upper[i];
    }
    /* sort and deduplicate (shell sort: setup is not where the time goes) */
    int m = 2 * n;
    for (int gap = m / 2; gap > 0; gap /= 2)
        for (int k = gap; k < m; k++)
            for (int j = k; j >= gap && times[j - gap] > times[j]; j -= gap) {
                i64 t = times[j];
                times[j] = times[j - gap];
                times[j - gap] = t;
            }
    int distinct = 0;
    for (int k = 0; k < m; k++)
        if (distinct == 0 || times[distinct - 1] != times[k]) times[distinct++] = times[k];
    /* elementary interval [times[k], times[k+1]) is a section if something starts at its
     * left end and something ends at its right end */
    char *starts = calloc((size_t)distinct + 1, 1), *ends = calloc((size_t)distinct + 1, 1);
    i64 *at = malloc(((size_t)distinct + 1) * sizeof *at);
    if (!starts || !ends || !at) {
        free(times), free(starts), free(ends), free(at);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        int lo = 0, hi = distinct;
        while (lo < hi) { int mid = (lo + hi) / 2; if (times[mid] < lower[i]) lo = mid + 1; else hi = mid; }
        starts[lo] = 1;
        lo = 0, hi = distinct;
        while (lo < hi) { int mid = (lo + hi) / 2; if (times[mid] < upper[i]) lo = mid + 1; else hi = mid; }
        ends[lo] = 1;
    }
    int sections = 0;
    for (int k = 0; k + 1 < distinct; k++)
        if (starts[k] && ends[k + 1]) at[sections++] = times[k];
    s->n_sections = sections;
    for (int i = 0; i < n; i++) {
        int lo = 0, hi = sections;
        while (lo < hi) { int mid = (lo + hi) / 2; if (at[mid] < lower[i]) lo = mid + 1; else hi = mid; }
        s->span_lo[i] = lo;
        hi = sections;
        int from = lo;
        while (from < hi) { int mid = (from + hi) / 2; if (at[mid] < upper[i]) from = mid + 1; else hi = mid; }
        s->span_hi[i] = from;
    }
    for (int i = 0; i < n; i++)
        for (i64 k = s->pair_start[i]; k < s->pair_start[i + 1]; k++) {
            int lo = 0, hi = sections;
            while (lo < hi) { int mid = (lo + hi) / 2; if (at[mid] < pair_time[k]) lo = mid + 1; else hi = mid; }
            s->pair_section[k] = lo < sections && at[lo] == pair_time[k] ? lo : -1;
        }
    free(times), free(starts), free(ends), free(at);
    return 1;
}

/* Back to nothing placed, for the next preorder. */
static void reset(Search *s, const int *order, const int *kin)
{
    int n = s->n;
    s->trail_len = 0;
    s->pool_len = 0;
    for (int i = 0; i < n; i++) {
        s->offset[i] = -1;
        s->floor[i] = 0;
    }
    for (int sec = 0; sec < s->n_sections; sec++) {
        s->section_floor[sec] = 0;
        s->section_total[sec] = 0;
        s->cut[sec] = 0;
    }
    for (int i = 0; i < n; i++)
        for (int sec = s->span_lo[i]; sec < s->span_hi[i]; sec++) {
            s->section_total[sec] += s->size[i];
            if (sec + 1 < s->span_hi[i]) s->cut[sec]++;
        }
    for (int i = 0; i < n; i++)
        for (i64 k = s->pair_start[i]; k < s->pair_start[i + 1]; k++)
            if (s->pair_section[k] >= 0 && i < s->pair_other[k])
                s->section_total[s->pair_section[k]] -= s->pair_share[k];
    /* identical buffers (same kin) go in preorder; `last` holds the latest seen per kin */
    int *last = s->pool;
    for (int i = 0; i < n; i++) last[i] = -1;
    for (int r = 0; r < n; r++) {
        int i = order[r];
        s->rank[i] = r;
        s->twin[i] = kin[i] >= 0 ? last[kin[i]] : -1;
        if (kin[i] >= 0) last[kin[i]] = i;
    }
}

/*
 * Returns FOUND (offsets_out holds a plan within capacity), INFEASIBLE (no plan: proven by an
 * exhausted search), OUT_OF_NODES, OUT_OF_TIME or NO_MEMORY. The preorders are tried in rounds,
 * each with the same node budget, which doubles every round, until one finishes.
 * Pairs are listed once per member; kin[i] (< n, or -1) groups interchangeable buffers.
 * `keys` holds the static preorder keys W, A, Z, C (n each), `letters` four characters per
 * preorder (NUL-padded): with `rerank`, a group split off is ordered by them again.
 */
int arenac_fits(int n, const i64 *size, const i64 *lower, const i64 *upper,
                const i64 *nb_start, const int *nb_other, const i64 *nb_eff,
                const i64 *pair_start, const int *pair_other, const i64 *pair_time,
                const i64 *pair_share, const int *kin, int n_orders, const int *orders,
                const i64 *keys, const char *letters, int rerank,
                i64 alignment, i64 capacity, i64 node_limit, double seconds,
                i64 *offsets_out, i64 *nodes_used)
{
    Search s;
    memset(&s, 0, sizeof s);
    s.n = n, s.size = size, s.nb_start = nb_start, s.nb_other = nb_other, s.nb_eff = nb_eff;
    s.pair_start = pair_start, s.pair_other = pair_other, s.pair_share = pair_share;
    s.alignment = alignment, s.capacity = capacity;
    s.keys = keys, s.rerank = rerank;
    *nodes_used = 0;
    if (n == 0) return FOUND;
    clock_gettime(CLOCK_MONOTONIC, &s.deadline);
    double whole = (double)(i64)seconds;
    s.deadline.tv_sec += (time_t)whole;
    s.deadline.tv_nsec += (long)((seconds - whole) * 1e9);
    if (s.deadline.tv_nsec >= 1000000000L) {
        s.deadline.tv_sec++;
        s.deadline.tv_nsec -= 1000000000L;
    }
    size_t pairs = (size_t)pair_start[n];
    s.pool_cap = (size_t)n * (size_t)(n + 2) + 16;
    s.trail_cap = 4096;
    s.rise = malloc((size_t)n * sizeof *s.rise);
    s.pair_section = malloc((pairs + 1) * sizeof *s.pair_section);
    s.span_lo = malloc((size_t)n * sizeof *s.span_lo);
    s.span_hi = malloc((size_t)n * sizeof *s.span_hi);
    s.rank = malloc((size_t)n * sizeof *s.rank);
    s.twin = malloc((size_t)n * sizeof *s.twin);
    s.offset = malloc((size_t)n * sizeof *s.offset);
    s.floor = malloc((size_t)n * sizeof *s.floor);
    s.section_floor = malloc((2 * (size_t)n + 1) * sizeof *s.section_floor);
    s.section_total = malloc((2 * (size_t)n + 1) * sizeof *s.section_total);
    s.cut = malloc((2 * (size_t)n + 1) * sizeof *s.cut);
    s.solution = malloc((size_t)n * sizeof *s.solution);
    s.need = malloc((2 * (size_t)n + 1) * sizeof *s.need);
    s.counted = calloc((size_t)n, sizeof *s.counted);
    s.trail_at = malloc(s.trail_cap * sizeof *s.trail_at);
    s.trail_old = malloc(s.trail_cap * sizeof *s.trail_old);
    s.pool = malloc(s.pool_cap * sizeof *s.pool);
    int status = NO_MEMORY;
    if (s.rise && s.pair_section && s.span_lo && s.span_hi && s.rank && s.twin && s.offset &&
        s.floor && s.section_floor && s.section_total && s.cut && s.solution && s.need &&
        s.counted && s.trail_at &&
        s.trail_old && s.pool && sweep(&s, lower, upper, pair_time)) {
        for (int i = 0; i < n; i++) {
            s.rise[i] = size[i];
            for (i64 k = nb_start[i]; k < nb_start[i + 1]; k++)
                if (nb_eff[k] < s.rise[i]) s.rise[i] = nb_eff[k];
        }
        i64 budget = n;
        for (;;) {
            budget = budget > INT64_MAX / 2 ? INT64_MAX : 2 * budget;
            for (int h = 0; h < n_orders; h++) {
                const int *order = orders + (size_t)h * (size_t)n;
                reset(&s, order, kin);
                s.letters = letters + 4 * h;
                i64 left = node_limit < 0 ? INT64_MAX : node_limit - s.nodes_used;
                s.nodes_left = budget < left ? budget : left;
                int *all = take(&s, n);
                memcpy(all, order, (size_t)n * sizeof *all);
                status = continue_part(&s, all, n, 0, s.n_sections, 0, order[0]);
                if (status == FOUND) memcpy(offsets_out, s.solution, (size_t)n * sizeof *s.solution);
                if (status != OUT_OF_NODES) goto done;
                if (node_limit >= 0 && s.nodes_used >= node_limit) goto done;
            }
        }
    }
done:
    *nodes_used = s.nodes_used;
    free(s.rise), free(s.pair_section), free(s.span_lo), free(s.span_hi), free(s.rank);
    free(s.twin), free(s.offset), free(s.floor), free(s.section_floor), free(s.section_total);
    free(s.cut), free(s.solution), free(s.need), free(s.counted), free(s.trail_at), free(s.trail_old), free(s.pool);
    return status;
}
