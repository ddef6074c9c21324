"""Memory planners: exact arenas on hand-worked cases (with and without allowed overlaps),
reference re-implementations on random cases, and an independent verifier that must reject
every kind of broken plan. The exact planner's search has its own file, test_optimal.py."""

from __future__ import annotations

import io
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolchain.errors import PlanError
from toolchain.planners import (
    PLANNERS,
    Buffer,
    Overlap,
    Placement,
    align_up,
    lower_bound,
    lower_bound_with_overlaps,
    make_plan,
    naive_sum,
    verify,
)
from toolchain.planners.csvio import dump_buffers, load_buffers, load_offsets
from toolchain.planners.freelist import FreeListPlanner
from toolchain.planners.greedy import GreedyPlanner
from toolchain.planners.naive import NaivePlanner

# Every planner configuration the tests run, by name: (planner, options).
CONFIGS = {
    "greedy": ("greedy", {}),
    "freelist-first": ("freelist", {}),
    "freelist-best": ("freelist", {"fit": "best"}),
    "naive": ("naive", {}),
    "optimal": ("optimal", {"nodes": 100_000}),
}


def buffers_from(*rows: tuple[int, int, int]) -> list[Buffer]:
    """Buffers numbered by position from (size, first, last) rows."""
    return [Buffer(i, size, first, last) for i, (size, first, last) in enumerate(rows)]


# --- Hand-worked cases (alignment 16) -------------------------------------------------------

# A three-op chain: 100, 200 and 300 bytes pad to 112, 208 and 304. The last two are alive
# together at op 2, so 208 + 304 = 512 is the best possible arena.
CHAIN = buffers_from((100, 0, 1), (200, 1, 2), (300, 2, 2))

# At op 1 the free list is [0, 64) and [96, 128). First fit puts the 32-byte buffer 4 at 0,
# leaving no 64-byte hole for buffer 5 at op 2; best fit uses the exact 32-byte hole at 96.
FIT_DIFFERS = buffers_from((64, 0, 0), (32, 0, 2), (32, 0, 0), (16, 0, 2), (32, 1, 2), (64, 2, 2))

# At op 1 buffer 1's block [48, 80) is free and touches the top (80): buffer 2 (64 bytes) does
# not fit in it, so the block grows to [48, 112) instead of buffer 2 going to 80.
TOP_GROWS = buffers_from((48, 0, 1), (32, 0, 0), (64, 1, 1))

# Buffers 0 and 1 die together; only their merged block [0, 64) holds buffer 3.
MERGES = buffers_from((32, 0, 0), (32, 0, 0), (16, 0, 1), (64, 1, 1))

# Buffer 1 (born at op 1) may take buffer 0's bytes in place as buffer 0 dies at op 1.
IN_PLACE = (buffers_from((256, 0, 1), (256, 1, 2)), [Overlap(below=1, above=0)])

# Buffer 2 may start 64 bytes below buffer 1 (which dies as 2 is born), so with buffer 0 below
# buffer 1 at op 1, the free list slides buffer 2 under buffer 1 into buffer 0's freed bytes.
# Greedy puts the big buffer 1 at 0 first, where nothing can go 64 bytes below it.
SHIFTED = (
    buffers_from((64, 0, 1), (256, 1, 2), (256, 2, 3)),
    [Overlap(below=2, above=1, shift=64)],
)

# The same shift with the input alone: the best plan puts the input at 64 and the output at 0,
# which neither heuristic finds (each puts the input at 0, leaving no room 64 bytes below it).
SHIFT_GROWS = (buffers_from((256, 0, 1), (256, 1, 2)), [Overlap(below=1, above=0, shift=64)])

# The output (512) is placed first by greedy; the input may start 64 bytes above it.
INPUT_ABOVE = (buffers_from((256, 0, 1), (512, 1, 2)), [Overlap(below=1, above=0, shift=64)])

# A zero-copy alias (RESHAPE-like): any overlap at all is fine.
ALIAS = (
    buffers_from((128, 0, 1), (256, 1, 2), (128, 0, 0)),
    [Overlap(below=1, above=0, any_offset=True)],
)

# One buffer in several pairs: 2 sits in place on 3, so 0 (which may only overlap 3 from 16
# bytes below) must not take 2's bytes that still hold 3.
PARTNERS = (
    buffers_from((48, 2, 3), (48, 2, 3), (96, 2, 2), (16, 1, 2)),
    [
        Overlap(1, 2, any_offset=True),
        Overlap(2, 3),
        Overlap(0, 3, shift=16),
        Overlap(0, 2, any_offset=True),
        Overlap(1, 3, shift=16, any_offset=True),
    ],
)

HAND_CASES = {
    # case: (buffers, overlaps, lower bound, with overlaps, {config id: (arena, offsets)})
    "chain": (
        CHAIN,
        [],
        512,
        512,
        {
            "greedy": (512, (0, 304, 0)),
            "freelist-first": (624, (0, 112, 320)),
            "freelist-best": (624, (0, 112, 320)),
            "naive": (624, (0, 112, 320)),
            "optimal": (512, (0, 304, 0)),
        },
    ),
    "fit-differs": (
        FIT_DIFFERS,
        [],
        144,
        144,
        {
            "greedy": (144, (0, 64, 96, 128, 96, 0)),
            "freelist-first": (208, (0, 64, 96, 128, 0, 144)),
            "freelist-best": (144, (0, 64, 96, 128, 96, 0)),
            "naive": (240, (0, 64, 96, 128, 144, 176)),
            "optimal": (144, (0, 64, 96, 128, 96, 0)),
        },
    ),
    "top-grows": (
        TOP_GROWS,
        [],
        112,
        112,
        {
            "greedy": (112, (64, 0, 0)),
            "freelist-first": (112, (0, 48, 48)),
            "freelist-best": (112, (0, 48, 48)),
            "naive": (144, (0, 48, 80)),
            "optimal": (112, (64, 0, 0)),
        },
    ),
    "merges": (
        MERGES,
        [],
        80,
        80,
        {
            "greedy": (80, (0, 32, 64, 0)),
            "freelist-first": (80, (0, 32, 64, 0)),
            "freelist-best": (80, (0, 32, 64, 0)),
            "naive": (144, (0, 32, 64, 80)),
            "optimal": (80, (0, 32, 64, 0)),
        },
    ),
    "in-place": (
        *IN_PLACE,
        512,
        256,
        {
            "greedy": (256, (0, 0)),
            "freelist-first": (256, (0, 0)),
            "freelist-best": (256, (0, 0)),
            "naive": (512, (0, 256)),
            "optimal": (256, (0, 0)),
        },
    ),
    "shifted": (
        *SHIFTED,
        512,
        320,
        {
            "greedy": (512, (256, 0, 256)),
            "freelist-first": (320, (0, 64, 0)),
            "freelist-best": (320, (0, 64, 0)),
            "naive": (576, (0, 64, 320)),
            "optimal": (320, (0, 64, 0)),
        },
    ),
    "shift-grows": (
        *SHIFT_GROWS,
        512,
        320,
        {
            "greedy": (512, (0, 256)),
            "freelist-first": (512, (0, 256)),
            "freelist-best": (512, (0, 256)),
            "naive": (512, (0, 256)),
            "optimal": (320, (64, 0)),
        },
    ),
    "input-above": (
        *INPUT_ABOVE,
        768,
        512,
        {
            "greedy": (512, (64, 0)),
            "freelist-first": (768, (0, 256)),
            "freelist-best": (768, (0, 256)),
            "naive": (768, (0, 256)),
            "optimal": (512, (64, 0)),
        },
    ),
    "alias": (
        *ALIAS,
        384,
        256,
        {
            "greedy": (256, (0, 0, 128)),
            "freelist-first": (256, (0, 0, 128)),
            "freelist-best": (256, (0, 0, 128)),
            "naive": (512, (0, 128, 384)),
            "optimal": (256, (0, 0, 128)),
        },
    ),
    "partners": (
        *PARTNERS,
        208,
        96,
        {
            "greedy": (96, (0, 48, 0, 16)),
            "freelist-first": (192, (96, 144, 0, 0)),
            "freelist-best": (192, (96, 144, 0, 0)),
            "naive": (208, (0, 48, 96, 192)),
            "optimal": (96, (0, 48, 0, 16)),
        },
    ),
}


@pytest.mark.parametrize("case", HAND_CASES)
@pytest.mark.parametrize("config", CONFIGS)
def test_hand_worked_arena_and_offsets(case, config):
    buffers, overlaps, _, _, expected = HAND_CASES[case]
    planner, options = CONFIGS[config]
    arena, offsets = expected[config]
    plan = make_plan(buffers, planner, alignment=16, overlaps=overlaps, **options)
    assert (plan.arena_bytes, plan.offsets) == (arena, offsets)
    assert plan.planner == planner
    assert plan.alignment == 16
    assert plan.overlaps == tuple(overlaps)
    assert plan.proven_optimal is (True if planner == "optimal" else None)


@pytest.mark.parametrize("case", HAND_CASES)
def test_hand_worked_bounds(case):
    buffers, overlaps, bound, with_overlaps, expected = HAND_CASES[case]
    assert lower_bound(buffers, 16) == bound
    assert lower_bound_with_overlaps(buffers, overlaps, 16) == with_overlaps
    assert naive_sum(buffers, 16) == expected["naive"][0]
    # Every hand-worked case is small enough for the exact planner to reach its bound.
    assert expected["optimal"][0] == with_overlaps


def test_chain_bounds_without_padding():
    assert lower_bound(CHAIN, 1) == 500
    assert naive_sum(CHAIN, 1) == 600
    assert make_plan(CHAIN, "greedy", alignment=1).offsets == (0, 300, 0)


def test_align_up():
    assert [align_up(n, 16) for n in (0, 1, 15, 16, 17, 100)] == [0, 16, 16, 16, 32, 112]
    assert align_up(7, 1) == 7


@pytest.mark.parametrize(("planner", "options"), CONFIGS.values(), ids=CONFIGS)
def test_no_buffers_make_an_empty_arena(planner, options):
    plan = make_plan([], planner, **options)
    assert (plan.arena_bytes, plan.offsets, plan.buffers) == (0, (), ())
    assert lower_bound([], 16) == naive_sum([], 16) == 0


@pytest.mark.parametrize(("planner", "options"), CONFIGS.values(), ids=CONFIGS)
def test_empty_buffers_take_no_space(planner, options):
    buffers = buffers_from((0, 0, 3), (40, 0, 1), (0, 1, 1), (40, 1, 2))
    plan = make_plan(buffers, planner, **options)
    # Buffers 1 and 3 (48 bytes padded) meet at op 1; the empty ones add nothing, even to naive.
    assert plan.arena_bytes == lower_bound(buffers, 16) == naive_sum(buffers, 16) == 96


# --- The four-method interface --------------------------------------------------------------


def test_interface_numbers_buffers_and_plans_lazily():
    planner = GreedyPlanner(alignment=16)
    ids = [
        planner.add_buffer(size, first, last) for size, first, last in [(100, 0, 1), (200, 1, 2)]
    ]
    assert ids == [0, 1]
    assert planner.arena_bytes() == 320  # planned on first question, without plan()
    assert (planner.offset(0), planner.offset(1)) == (208, 0)
    assert planner.add_buffer(300, 2, 2) == 2
    planner.plan()  # the new buffer invalidated the old offsets
    assert [planner.offset(i) for i in range(3)] == [0, 304, 0]
    assert planner.result() == Placement("greedy", 16, tuple(CHAIN), (0, 304, 0), 512)


def test_interface_takes_overlaps_by_the_ids_it_returned():
    planner = GreedyPlanner(alignment=16)
    ids = [planner.add_buffer(256, 0, 1), planner.add_buffer(256, 1, 2)]
    assert planner.arena_bytes() == 512
    planner.add_overlap(below=ids[1], above=ids[0])  # invalidates the offsets, like add_buffer
    assert planner.arena_bytes() == 256
    assert planner.result().overlaps == (Overlap(1, 0),)


@pytest.mark.parametrize(
    ("overlap", "message"),
    [
        (Overlap(1, 7), "overlap names buffer id 7, which is not planned"),
        (Overlap(1, 1), "overlap pairs buffer 1 with itself"),
        (Overlap(1, 0, shift=-16), "negative shift -16"),
        (Overlap(0, 1), r"needs 1's life to end at the op where 0's starts.*\[1, 2\] and \[0, 1\]"),
        (Overlap(2, 1), r"needs 1's life to end at the op where 2's starts"),
    ],
)
def test_interface_rejects_bad_overlaps(overlap, message):
    planner = FreeListPlanner()
    for size, first, last in [(256, 0, 1), (256, 1, 2), (16, 0, 0)]:
        planner.add_buffer(size, first, last)
    with pytest.raises(PlanError, match=message):
        planner.add_overlap(overlap.below, overlap.above, overlap.shift, overlap.any_offset)


def test_interface_rejects_a_pair_declared_twice():
    planner = NaivePlanner()
    planner.add_buffer(16, 1, 1)
    planner.add_buffer(16, 1, 1)
    planner.add_overlap(1, 0)
    with pytest.raises(PlanError, match="overlap of buffers 0 and 1 is declared twice"):
        planner.add_overlap(0, 1)  # the same pair the other way round


def test_interface_rejects_bad_input():
    planner = FreeListPlanner()
    with pytest.raises(PlanError, match="negative"):
        planner.add_buffer(-1, 0, 0)
    with pytest.raises(PlanError, match=r"\[3, 2\] ends before it starts"):
        planner.add_buffer(8, 3, 2)
    planner.add_buffer(8, 0, 0)
    with pytest.raises(PlanError, match="no buffer with id 1; 1 were added"):
        planner.offset(1)


def test_registry_names_match_planners():
    assert set(PLANNERS) == {"greedy", "freelist", "naive", "optimal", "tflm"}
    assert all(cls.name == name for name, cls in PLANNERS.items())


def test_make_plan_rejects_unknown_planner_and_options():
    with pytest.raises(PlanError, match="unknown planner 'best'; choose one of greedy"):
        make_plan(CHAIN, "best")
    with pytest.raises(PlanError, match="unknown fit 'worst'"):
        make_plan(CHAIN, "freelist", fit="worst")
    with pytest.raises(PlanError, match="planner 'greedy' has no option fit"):
        make_plan(CHAIN, "greedy", fit="best")
    with pytest.raises(PlanError, match="alignment must be a positive"):
        make_plan(CHAIN, "naive", alignment=0)


def test_make_plan_keeps_the_callers_buffer_ids():
    buffers = [Buffer(40, 100, 0, 1), Buffer(7, 200, 1, 2), Buffer(93, 300, 2, 2)]
    plan = make_plan(buffers, "greedy")
    assert plan.buffers == tuple(buffers)
    assert [plan.offset_of(i) for i in (40, 7, 93)] == [0, 304, 0]
    with pytest.raises(PlanError, match="no buffer with id 0"):
        plan.offset_of(0)


def test_make_plan_names_the_callers_ids_in_overlap_errors():
    buffers = [Buffer(40, 256, 0, 1), Buffer(7, 256, 1, 2)]
    assert make_plan(buffers, "greedy", overlaps=[Overlap(7, 40)]).arena_bytes == 256
    with pytest.raises(PlanError, match="overlap names buffer id 1, which is not planned"):
        make_plan(buffers, "greedy", overlaps=[Overlap(1, 40)])
    with pytest.raises(PlanError, match="overlap of buffers 7 and 40 is declared twice"):
        make_plan(buffers, "greedy", overlaps=[Overlap(7, 40), Overlap(7, 40, shift=16)])
    with pytest.raises(PlanError, match="needs 7's life to end"):
        lower_bound_with_overlaps(buffers, [Overlap(40, 7)], 16)


def test_make_plan_rejects_duplicate_ids():
    with pytest.raises(PlanError, match="buffer id 5 appears twice"):
        make_plan([Buffer(5, 16, 0, 0), Buffer(5, 16, 1, 1)])


# --- verify rejects broken plans ------------------------------------------------------------


def plan_of(
    buffers: list[Buffer], offsets: list[int], arena: int, alignment: int = 16
) -> Placement:
    return Placement("hand", alignment, tuple(buffers), tuple(offsets), arena)


def test_verify_accepts_a_tight_plan():
    verify(plan_of(list(CHAIN), [0, 304, 0], 512))
    # Real sizes, not padded ones, must fit in the arena.
    verify(plan_of(buffers_from((10, 0, 0)), [0], 10))
    # Lives that meet but do not overlap may share bytes.
    verify(plan_of(buffers_from((64, 0, 1), (64, 2, 3)), [0, 0], 64))


@pytest.mark.parametrize(
    ("buffers", "offsets", "arena", "message"),
    [
        (
            buffers_from((64, 0, 1), (64, 1, 3)),
            [0, 48],
            112,
            r"buffers 0 and 1 share bytes \[48, 64\) at op 1",
        ),
        (
            [Buffer(9, 16, 0, 5), Buffer(4, 32, 5, 5)],
            [16, 0],
            32,
            r"buffers 9 and 4 share bytes \[16, 32\) at op 5",
        ),
        (buffers_from((16, 0, 0), (16, 0, 0)), [0, 0], 16, "buffers 0 and 1 share bytes"),
        (buffers_from((16, 0, 0), (16, 0, 0)), [0, 8], 32, "offset 8 is not a multiple of 16"),
        (
            buffers_from((16, 0, 0), (17, 0, 0)),
            [0, 16],
            32,
            r"\[16, 33\) lie outside the arena \[0, 32\)",
        ),
        (buffers_from((16, 0, 0)), [-16], 32, "lie outside the arena"),
        (buffers_from((-16, 0, 0)), [0], 32, "buffer 0 has negative size -16"),
        (buffers_from((16, 3, 2)), [0], 32, r"life \[3, 2\] ends before it starts"),
        ([Buffer(1, 16, 0, 0), Buffer(1, 16, 1, 1)], [0, 0], 16, "buffer id 1 appears twice"),
        (buffers_from((16, 0, 0)), [0, 16], 32, "2 offsets for 1 buffers"),
    ],
    ids=[
        "overlap",
        "overlap-names-ids",
        "same-offset",
        "misaligned",
        "past-arena-end",
        "negative-offset",
        "negative-size",
        "reversed-life",
        "duplicate-id",
        "offset-count",
    ],
)
def test_verify_rejects(buffers, offsets, arena, message):
    with pytest.raises(PlanError, match=message):
        verify(plan_of(buffers, offsets, arena))


def overlapping_plan(offsets: list[int], overlap: Overlap) -> Placement:
    """Buffer 0 (64 bytes) dies at op 1, where buffer 1 (64 bytes) is born."""
    buffers = buffers_from((64, 0, 1), (64, 1, 2))
    return replace(plan_of(buffers, offsets, 160), overlaps=(overlap,))


@pytest.mark.parametrize(
    ("offsets", "overlap"),
    [
        ([0, 0], Overlap(1, 0)),  # in place
        ([16, 0], Overlap(1, 0)),  # below may start lower still
        ([32, 0], Overlap(1, 0, shift=32)),  # exactly the shift
        ([0, 16], Overlap(1, 0, any_offset=True)),
        ([16, 0], Overlap(1, 0, shift=48, any_offset=True)),  # any_offset ignores the shift
        ([0, 64], Overlap(1, 0, shift=100)),  # sharing nothing is always fine
    ],
)
def test_verify_accepts_declared_overlaps(offsets, overlap):
    verify(overlapping_plan(offsets, overlap))


@pytest.mark.parametrize(
    ("offsets", "overlap", "message"),
    [
        (
            [16, 0],
            Overlap(1, 0, shift=32),
            r"buffers 0 and 1 share bytes \[16, 64\) at op 1; their overlap needs "
            r"offset\(1\) \+ 32 <= offset\(0\), but 0 \+ 32 > 16",
        ),
        ([0, 16], Overlap(1, 0), r"share bytes \[16, 64\) at op 1; their overlap needs"),
        ([0, 0], Overlap(1, 0, shift=1), "0 \\+ 1 > 0"),
    ],
    ids=["beyond-shift", "wrong-direction", "in-place-needs-no-shift"],
)
def test_verify_rejects_overlaps_beyond_their_rule(offsets, overlap, message):
    with pytest.raises(PlanError, match=message):
        verify(overlapping_plan(offsets, overlap))


def test_verify_rejects_an_undeclared_pair_beside_a_declared_one():
    # 1 sits in place on 0 as declared, but 2 (alive at op 1 too) was never allowed to overlap.
    buffers = buffers_from((64, 0, 1), (64, 1, 2), (32, 1, 1))
    plan = replace(plan_of(buffers, [0, 0, 32], 96), overlaps=(Overlap(1, 0),))
    with pytest.raises(PlanError, match=r"buffers [01] and 2 share bytes \[32, 64\) at op 1$"):
        verify(plan)
    verify(replace(plan, offsets=(0, 0, 64)))


@pytest.mark.parametrize(
    ("overlaps", "message"),
    [
        ([Overlap(1, 9)], "overlap names buffer id 9, which the plan does not have"),
        ([Overlap(0, 0)], "overlap pairs buffer 0 with itself"),
        ([Overlap(1, 0), Overlap(0, 1)], "overlap of buffers 0 and 1 is declared twice"),
        ([Overlap(1, 0, shift=-1)], "shift -1 < 0"),
        ([Overlap(0, 1)], r"lives \[0, 1\] and \[1, 2\] do not meet at 0's first op"),
    ],
)
def test_verify_rejects_unsound_overlap_declarations(overlaps, message):
    buffers = buffers_from((64, 0, 1), (64, 1, 2))
    with pytest.raises(PlanError, match=message):
        verify(replace(plan_of(buffers, [0, 64], 128), overlaps=tuple(overlaps)))


def test_verify_rejects_bad_alignment_and_arena():
    with pytest.raises(PlanError, match="alignment must be positive"):
        verify(plan_of([], [], 0, alignment=0))
    with pytest.raises(PlanError, match="must not be negative"):
        verify(plan_of([], [], -1))


# --- Random buffer sets ---------------------------------------------------------------------


def buffer_lists(max_size: int = 30) -> st.SearchStrategy[list[Buffer]]:
    return st.lists(
        st.tuples(
            st.one_of(st.integers(0, 300), st.sampled_from([16, 32, 64, 128])),
            st.integers(0, 12),  # first op
            st.integers(0, 6),  # extra ops of life
        ),
        max_size=max_size,
    ).map(
        lambda rows: [
            Buffer(i, size, first, first + extra) for i, (size, first, extra) in enumerate(rows)
        ]
    )


alignments = st.sampled_from([1, 4, 16])


@st.composite
def problems(draw, max_size: int = 30) -> tuple[list[Buffer], list[Overlap]]:
    """Buffers and the overlaps a toolchain could declare between them: each pair an output
    born at the op where its partner input dies, with a shift (aligned or not) or any_offset.

    No pair joins two buffers that live only at the same op: a graph cannot chain those into a
    cycle of in-place pairs (an op's output would be its own input), but random pairs could,
    and test_optimal.py tests that case by hand.
    """
    buffers = draw(buffer_lists(max_size))
    pairs = [
        (b.id, a.id)
        for b in buffers
        for a in buffers
        if a.id != b.id and b.first == a.last and not a.first == a.last == b.last
    ]
    chosen = draw(st.lists(st.sampled_from(pairs), unique_by=frozenset)) if pairs else []
    overlaps = [
        Overlap(
            below,
            above,
            draw(st.sampled_from([0, 0, 1, 16, 40, 64, 500])),
            draw(st.sampled_from([False, False, False, True])),
        )
        for below, above in chosen
    ]
    return buffers, overlaps


def overlap_in_time(a: Buffer, b: Buffer) -> bool:
    return a.first <= b.last and b.first <= a.last


def clash(a: Buffer, a_at: int, b: Buffer, b_at: int, rule: Overlap | None, sizes, shift) -> bool:
    """Whether a at `a_at` and b at `b_at` (sized by `sizes`) share a byte at some op where no
    declared overlap (`rule`, its shift read through `shift`) allows it."""
    a_size, b_size = sizes(a), sizes(b)
    share = a_size and b_size and a_at < b_at + b_size and b_at < a_at + a_size
    if not (share and overlap_in_time(a, b)):
        return False
    if rule is None:
        return True
    at = {a.id: a_at, b.id: b_at}
    return not rule.any_offset and at[rule.below] + shift(rule) > at[rule.above]


def rules_of(overlaps) -> dict[frozenset[int], Overlap]:
    return {frozenset((o.below, o.above)): o for o in overlaps}


def reference_greedy(buffers: list[Buffer], overlaps: list[Overlap], alignment: int) -> list[int]:
    """TFLite Micro's greedy planner by brute force: the lowest clash-free offset among 0, every
    rival's end and every partner's offset plus shift (where a forbidden range can end)."""
    padded = {b.id: align_up(b.size, alignment) for b in buffers}
    rules = rules_of(overlaps)
    offsets: dict[int, int] = {}
    for b in sorted(buffers, key=lambda b: (-padded[b.id], b.first, b.id)):
        if padded[b.id] == 0:
            offsets[b.id] = 0
            continue
        rivals = [p for p in buffers if p.id in offsets and overlap_in_time(p, b)]
        candidates = [0] + [offsets[p.id] + padded[p.id] for p in rivals]
        candidates += [
            offsets[p.id] + align_up(o.shift, alignment)
            for o in overlaps
            for p in rivals
            if p.id in (o.below, o.above)
        ]
        offsets[b.id] = min(
            c
            for c in candidates
            if not any(
                clash(
                    b,
                    c,
                    p,
                    offsets[p.id],
                    rules.get(frozenset((b.id, p.id))),
                    lambda x: padded[x.id],
                    lambda o: align_up(o.shift, alignment),
                )
                for p in rivals
            )
        )
    return [offsets[b.id] for b in buffers]


def reference_freelist(buffers: list[Buffer], alignment: int, fit: str) -> list[int]:
    """The free-list method recomputed from scratch at each placement: the free blocks are the
    holes below the top between the (non-empty) buffers still alive."""
    padded = {b.id: align_up(b.size, alignment) for b in buffers}
    offsets: dict[int, int] = {}
    top = 0
    for op in sorted({b.first for b in buffers}):
        for b in sorted((b for b in buffers if b.first == op), key=lambda b: (-padded[b.id], b.id)):
            need = padded[b.id]
            alive = sorted(
                (offsets[p.id], offsets[p.id] + padded[p.id])
                for p in buffers
                if p.id in offsets and p.last >= op and padded[p.id]
            )
            holes, cursor = [], 0
            for start, end in alive:
                if start > cursor:
                    holes.append((cursor, start - cursor))
                cursor = max(cursor, end)
            if cursor < top:
                holes.append((cursor, top - cursor))
            fitting = [hole for hole in holes if hole[1] >= need]
            if fitting:
                chosen = fitting[0] if fit == "first" else min(fitting, key=lambda h: (h[1], h[0]))
                offsets[b.id] = chosen[0]
            elif holes and sum(holes[-1]) == top:
                offsets[b.id] = holes[-1][0]
            else:
                offsets[b.id] = top
            top = max(top, offsets[b.id] + need)
    return [offsets[b.id] for b in buffers]


def problems_by_brute_force(plan: Placement) -> bool:
    """Whether any buffer is misplaced or any two live buffers share a byte that the plan's
    overlaps do not allow, checking all pairs with real sizes and shifts."""
    placed = list(zip(plan.buffers, plan.offsets, strict=True))
    if any(o % plan.alignment or o < 0 or o + b.size > plan.arena_bytes for b, o in placed):
        return True
    rules = rules_of(plan.overlaps)
    return any(
        clash(a, oa, b, ob, rules.get(frozenset((a.id, b.id))), lambda x: x.size, lambda o: o.shift)
        for i, (a, oa) in enumerate(placed)
        for b, ob in placed[i + 1 :]
    )


@settings(max_examples=300, deadline=None)
@given(problem=problems(), alignment=alignments)
def test_every_planner_makes_a_valid_plan_within_bounds(problem, alignment):
    buffers, overlaps = problem
    bound = lower_bound_with_overlaps(buffers, overlaps, alignment)
    ceiling = naive_sum(buffers, alignment)
    for planner, options in CONFIGS.values():
        plan = make_plan(buffers, planner, alignment, overlaps, **options)  # verifies
        assert not problems_by_brute_force(plan)
        assert all(offset % alignment == 0 for offset in plan.offsets)
        assert bound <= plan.arena_bytes <= ceiling
        if planner == "naive":
            assert plan.arena_bytes == ceiling


@settings(max_examples=300, deadline=None)
@given(problem=problems(), alignment=alignments)
def test_greedy_matches_a_brute_force_reference(problem, alignment):
    buffers, overlaps = problem
    plan = make_plan(buffers, "greedy", alignment, overlaps)
    assert list(plan.offsets) == reference_greedy(buffers, overlaps, alignment)


@settings(max_examples=300, deadline=None)
@given(buffers=buffer_lists(), alignment=alignments, fit=st.sampled_from(["first", "best"]))
def test_freelist_matches_a_from_scratch_reference(buffers, alignment, fit):
    plan = make_plan(buffers, "freelist", alignment, fit=fit)
    assert list(plan.offsets) == reference_freelist(buffers, alignment, fit)


def test_freelist_reference_ignores_empty_buffers():
    # A live empty buffer at offset 1 must not split the hole [0, 2) that buffer 3 needs.
    buffers = buffers_from((0, 1, 2), (1, 1, 1), (2, 0, 0), (2, 2, 2))
    assert make_plan(buffers, "freelist", alignment=1).offsets == (1, 0, 0, 0)
    assert reference_freelist(buffers, 1, "first") == [1, 0, 0, 0]


@settings(max_examples=300, deadline=None)
@given(buffers=buffer_lists(), alignment=alignments)
def test_lower_bound_is_the_busiest_op(buffers, alignment):
    busiest = max(
        (
            sum(align_up(b.size, alignment) for b in buffers if b.first <= op <= b.last)
            for op in range(20)
        ),
        default=0,
    )
    assert lower_bound(buffers, alignment) == busiest
    assert lower_bound_with_overlaps(buffers, [], alignment) == busiest


@settings(max_examples=300, deadline=None)
@given(problem=problems(), alignment=alignments)
def test_lower_bound_with_overlaps_counts_what_each_buffer_adds(problem, alignment):
    buffers, overlaps = problem
    size = {b.id: align_up(b.size, alignment) for b in buffers}
    rules = rules_of(overlaps)

    def can_share(a: Buffer, b: Buffer) -> int:
        o = rules.get(frozenset((a.id, b.id)))
        if o is None:
            return 0
        shift = 0 if o.any_offset else align_up(o.shift, alignment)
        return max(0, min(size[o.above], size[o.below] - shift))

    def adds(op: int) -> int:
        """Bytes the buffers live at `op` add, each beyond the ones before it (by first op,
        last op, id) that it may share with."""
        live = [b for b in buffers if b.first <= op <= b.last]
        live.sort(key=lambda b: (b.first, b.last, b.id))
        return sum(
            max(0, size[b.id] - sum(can_share(b, earlier) for earlier in live[:n]))
            for n, b in enumerate(live)
        )

    expected = max([*map(adds, range(20)), *size.values()], default=0)
    assert lower_bound_with_overlaps(buffers, overlaps, alignment) == expected
    assert expected <= lower_bound(buffers, alignment)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), problem=problems(max_size=8))
def test_verify_agrees_with_brute_force_on_arbitrary_plans(data, problem):
    buffers, overlaps = problem
    alignment = data.draw(st.sampled_from([1, 4]))
    # Mostly aligned offsets and an arena near the highest end, so that overlaps, rather than
    # misalignment or overflow, decide most examples.
    offset = st.one_of(st.integers(-1, 100).map(lambda k: 4 * k), st.integers(-4, 400))
    offsets = data.draw(st.lists(offset, min_size=len(buffers), max_size=len(buffers)))
    highest_end = max((o + b.size for b, o in zip(buffers, offsets, strict=True)), default=0)
    arena = max(0, highest_end + data.draw(st.integers(-2, 2)))
    plan = replace(plan_of(buffers, offsets, arena, alignment), overlaps=tuple(overlaps))
    if problems_by_brute_force(plan):
        with pytest.raises(PlanError):
            verify(plan)
    else:
        verify(plan)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.tuples(st.integers(1, 100), st.integers(1, 100)),
    at=st.tuples(st.integers(0, 200), st.integers(0, 200)),
    shift=st.integers(0, 120),
    any_offset=st.booleans(),
)
def test_verify_judges_a_pair_by_its_direction_and_shift(sizes, at, shift, any_offset):
    # Buffer 1 (the output) is born at op 1, where buffer 0 (its input) dies.
    buffers = buffers_from((sizes[0], 0, 1), (sizes[1], 1, 2))
    plan = Placement("hand", 1, tuple(buffers), at, 400, (Overlap(1, 0, shift, any_offset),))
    apart = at[0] + sizes[0] <= at[1] or at[1] + sizes[1] <= at[0]
    if apart or any_offset or at[1] + shift <= at[0]:
        verify(plan)
    else:
        with pytest.raises(PlanError, match="buffers 0 and 1 share bytes"):
            verify(plan)


def random_buffers(count: int, seed: int) -> list[Buffer]:
    rng = random.Random(seed)
    buffers = []
    for i in range(count):
        first = rng.randrange(2000)
        size = rng.choice([0, rng.randrange(1, 4096), rng.randrange(1, 65536)])
        buffers.append(Buffer(i, size, first, first + int(rng.expovariate(1 / 8))))
    return buffers


def random_overlaps(buffers: list[Buffer], seed: int) -> list[Overlap]:
    """About half of the buffers in a pair with one buffer that dies where they are born."""
    rng = random.Random(seed)
    dying_at: dict[int, list[Buffer]] = {}
    for b in buffers:
        dying_at.setdefault(b.last, []).append(b)
    overlaps, paired = [], set()
    for b in buffers:
        for a in dying_at.get(b.first, [])[:2]:
            if a.id != b.id and frozenset((a.id, b.id)) not in paired and rng.random() < 0.5:
                paired.add(frozenset((a.id, b.id)))
                overlaps.append(Overlap(b.id, a.id, rng.choice([0, 64, 100]), rng.random() < 0.1))
    return overlaps


# test_optimal.py holds the exact planner to its time budget at this scale.
HEURISTICS = {name: config for name, config in CONFIGS.items() if name != "optimal"}


@pytest.mark.parametrize(("planner", "options"), HEURISTICS.values(), ids=HEURISTICS)
@pytest.mark.parametrize("with_overlaps", [False, True], ids=["plain", "overlaps"])
def test_ten_thousand_buffers_plan_and_verify(planner, options, with_overlaps):
    buffers = random_buffers(10_000, seed=7)
    overlaps = random_overlaps(buffers, seed=1) if with_overlaps else []
    plan = make_plan(buffers, planner, overlaps=overlaps, **options)  # verifies
    assert len(plan.offsets) == 10_000
    bound = lower_bound_with_overlaps(buffers, overlaps, 16)
    assert bound <= plan.arena_bytes <= naive_sum(buffers, 16)


# --- MiniMalloc CSV -------------------------------------------------------------------------


def test_dump_writes_minimalloc_half_open_lives():
    out = io.StringIO()
    dump_buffers(CHAIN, out)
    assert out.getvalue() == "id,lower,upper,size\n0,0,2,100\n1,1,3,200\n2,2,3,300\n"


@settings(max_examples=100, deadline=None)
@given(buffers=buffer_lists())
def test_csv_round_trip(buffers):
    out = io.StringIO()
    dump_buffers(buffers, out)
    assert load_buffers(io.StringIO(out.getvalue())) == buffers


def test_csv_round_trip_through_a_file_and_a_solution(tmp_path):
    problem = tmp_path / "problem.csv"
    dump_buffers(FIT_DIFFERS, problem)
    assert load_buffers(problem) == FIT_DIFFERS
    solution = tmp_path / "solution.csv"
    plan = make_plan(FIT_DIFFERS, "greedy")
    solution.write_text(
        "id,lower,upper,size,offset\n"
        + "".join(
            f"{b.id},{b.first},{b.last + 1},{b.size},{o}\n"
            for b, o in zip(plan.buffers, plan.offsets, strict=True)
        )
    )
    offsets = load_offsets(solution, FIT_DIFFERS)
    assert offsets == {0: 0, 1: 64, 2: 96, 3: 128, 4: 96, 5: 0}
    loaded = Placement.from_offsets(
        "minimalloc", 16, FIT_DIFFERS, [offsets[b.id] for b in FIT_DIFFERS]
    )
    verify(loaded)
    assert loaded.arena_bytes == 144
    assert load_buffers(solution) == FIT_DIFFERS  # a solution is also a problem


def test_load_offsets_accepts_the_short_form_in_any_order():
    text = "offset,id\n304,1\n0,0\n0,2\n"
    assert load_offsets(io.StringIO(text), CHAIN) == {0: 0, 1: 304, 2: 0}


def test_load_offsets_accepts_padded_sizes():
    text = "id,lower,upper,size,offset\n0,0,2,112,0\n1,1,3,208,304\n2,2,3,304,0\n"
    assert load_offsets(io.StringIO(text), CHAIN) == {0: 0, 1: 304, 2: 0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file; expected a header id,lower,upper,size"),
        ("id,lower,size\n0,0,4\n", "must have columns id,lower,upper,size"),
        ("id,lower,upper,size,gaps\n", "must have columns"),
        ("id,id,lower,upper,size\n", "duplicate column"),
        ("id,lower,upper,size\nb1,0,3,4\n", "line 2: id 'b1' is not a whole number"),
        ("id,lower,upper,size\n0,0,3\n", "line 2: 3 fields, but the header has 4"),
        ("id,lower,upper,size\n0,0,3,4\n0,1,3,4\n", "line 3: buffer id 0 appears twice"),
        ("id,lower,upper,size\n0,3,3,4\n", r"line 2: upper \(3\) must exceed lower \(3\)"),
        ("id,lower,upper,size\n0,0,3,-4\n", "size must not be negative"),
    ],
)
def test_load_buffers_rejects_malformed_files(text, message):
    with pytest.raises(PlanError, match=message):
        load_buffers(io.StringIO(text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,lower,upper,size\n0,0,2,100\n", "must have columns id,offset"),
        ("id,offset\n0,0\n1,304\n7,0\n", "line 4: no buffer with id 7"),
        ("id,offset\n0,0\n1,304\n1,0\n", "line 4: buffer id 1 appears twice"),
        ("id,offset\n0,0\n", "no offset for buffer id 1, 2"),
        ("id,offset\n0,zero\n", "line 2: offset 'zero' is not a whole number"),
        ("id,lower,upper,size,offset\n0,0,1,100,0\n", "line 2: buffer 0 is lower=0 upper=1"),
        ("id,lower,upper,size,offset\n0,0,2,99,0\n", "size=99 in the solution but"),
    ],
)
def test_load_offsets_rejects_malformed_files(text, message):
    with pytest.raises(PlanError, match=message):
        load_offsets(io.StringIO(text), CHAIN)


def test_csv_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.csv"
    with pytest.raises(PlanError, match="cannot open") as raised:
        load_buffers(missing)
    assert raised.value.source == str(missing)
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,0,x,4\n")
    with pytest.raises(PlanError) as raised:
        load_buffers(bad)
    assert str(raised.value).startswith(f"{bad}: line 2:")
