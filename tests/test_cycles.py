"""The cycle estimate of `arenac bench`: the timing model on hand-made profiles, and the profile
of a real bench run against the counter's instruction counts."""

from __future__ import annotations

import json

import pytest

from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_targets import planned, pointwise_model
from toolchain.cli import main
from toolchain.lab.bench import BenchResult, StepCount, bench, bench_text
from toolchain.lab.cycles import Counts, Instruction, estimate, mnemonic_of
from toolchain.lab.timings import CORTEX_M4

# -- the timing model -------------------------------------------------------------------------


def program(*lines: tuple[str, str, int]) -> dict[int, Instruction]:
    """Instructions laid out one after another from address 0x100: (mnemonic, operands, size)."""
    code, address = {}, 0x100
    for mnemonic, operands, size in lines:
        code[address] = Instruction(address, size, mnemonic, operands)
        address += size
    return code


@pytest.mark.parametrize("text, mnemonic", [
    ("bls.n", "b"), ("bl", "bl"), ("bleq", "bl"), ("ldrhs", "ldr"), ("ldrsh.w", "ldrsh"),
    ("ldmia.w", "ldmia"), ("vmla.f32", "vmla"), ("strbeq", "strb"), ("smlad", "smlad"),
    ("cbnz", "cbnz"), ("cmpne", "cmp"),
])
def test_mnemonics_lose_width_condition_and_type(text, mnemonic):
    assert mnemonic_of(text) == mnemonic


def test_the_cortex_m4_table_prices_a_loop_body_as_its_manual_says():
    code = program(
        ("ldr", "r2, [r0, #4]", 2),          # 2
        ("ldr", "r3, [r1, #4]", 2),          # 1: pipelined behind a load
        ("add", "r1, r1, #8", 4),            # 1
        ("ldr", "r4, [r1]", 2),              # 2 + 1: its address was computed just before
        ("ldrd", "r5, r6, [r0]", 4),         # 3
        ("smlad", "r7, r5, r6, r7", 4),      # 1
        ("push", "{r4, r5, r6}", 2),         # 1 + 3
        ("str", "r7, [r0], #4", 4),          # 1
        ("b", "0x100", 2),                   # bne: 1, + P when taken
    )
    runs, taken = 10, 9  # the loop runs ten times, branching back nine
    phase = {a: Counts(runs, 0, 0, 0) for a in code}
    first, last = min(code), max(code)
    phase[first] = Counts(runs, 0, taken, 0)  # branched to nine times: then not pipelined
    phase[last] = Counts(runs, taken, 0, 0)
    e = estimate(phase, code, CORTEX_M4)
    body = 2 + 1 + 1 + 3 + 3 + 1 + 4 + 1 + 1
    assert e.instructions == 9 * runs
    assert (e.optimistic, e.nominal, e.pessimistic) == tuple(
        runs * body + taken * p + runs * store_extra
        for p, store_extra in ((1, 0), (2, 0), (3, 1)))
    assert sum(v["cycles"] for v in e.mix.values()) == e.nominal
    assert e.mix["load/store pair"] == {"instructions": runs, "cycles": 3 * runs}


def test_a_load_addressed_by_the_load_before_it_is_not_pipelined():
    code = program(("ldr", "r3, [r0]", 2), ("ldr", "r2, [r3, #4]", 2))
    e = estimate({a: Counts(1, 0, 0, 0) for a in code}, code, CORTEX_M4)
    assert e.nominal == 4


def test_wait_states_cost_every_flash_read_and_every_refill():
    code = program(("ldr", "r3, [r0]", 2), ("b", "0x100", 2))
    phase = {0x100: Counts(5, 0, 0, 5), 0x102: Counts(5, 5, 0, 0)}
    quick = estimate(phase, code, CORTEX_M4)
    slow = estimate(phase, code, CORTEX_M4, wait_states=3)
    assert slow.nominal - quick.nominal == 3 * (5 + 5)


def test_a_core_without_a_timing_table_says_so():
    result = BenchResult(
        model="m.tflite", target="cortex-m0plus", board="mps2-an385", optimization="-O2",
        kernels="target", instructions=100, steps=(StepCount(0, 0, "ADD", "dsp", "f", 90, 40),),
        counter_overhead=12, arena_bytes=64, flash=1000, ram=100, outputs_match=True)
    text = bench_text(result)
    assert "not estimated: no timing table for cortex-m0plus" in text
    assert "est. cycles" not in text and "estimated cycles per inference" not in text


# -- a bench run ------------------------------------------------------------------------------


@needs_mcu
def test_the_profile_counts_what_the_counter_counts_and_prices_it():
    result = bench(planned(pointwise_model(), "cortex-m4"))
    c = result.cycles
    assert result.outputs_match and c is not None
    # the profile leaves out the harness's own code; the counter's bracket keeps its call
    assert 0 <= result.instructions - c.instructions <= 4
    assert c.instructions < c.optimistic <= c.nominal <= c.pessimistic
    assert sum(v["instructions"] for v in c.mix.values()) == c.instructions
    assert all(s.cycles is not None and s.cycles >= s.instructions - 4 for s in result.steps)
    assert sum(s.cycles for s in result.steps) <= c.nominal
    assert "CORTEX-M4" in result.timing.upper() and "100166" in result.timing


@needs_mcu
def test_bench_json_has_the_estimate_and_wait_states_raise_it(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    assert main(["bench", str(path), "--json"]) == 0
    quick = json.loads(capsys.readouterr().out)
    assert main(["bench", str(path), "--json", "--wait-states", "2"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert quick["instructions_per_inference"] == slow["instructions_per_inference"]
    assert quick["cycles"]["nominal"] < slow["cycles"]["nominal"]
    assert (quick["wait_states"], slow["wait_states"]) == (0, 2)
    assert all(isinstance(s["cycles"], int) for s in quick["steps"])
    assert set(quick["cycles"]["mix"]) <= {
        "data processing", "load", "store", "load/store pair", "load/store multiple", "branch",
        "table branch", "divide", "float multiply-add", "float divide"}


def test_a_bad_wait_state_count_is_one_line(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    with pytest.raises(SystemExit) as exit_:
        main(["bench", str(path), "--wait-states", "x"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--wait-states" in err[-1] and "Traceback" not in "".join(err)


def test_without_a_host_compiler_the_plugin_is_one_error(monkeypatch, tmp_path):
    from toolchain.errors import RuntimeBackendError
    from toolchain.lab import cycles

    monkeypatch.setattr(cycles.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeBackendError, match="no host C compiler"):
        cycles.build_plugin(str(tmp_path))


# -- the dual-issue Cortex-M7 ------------------------------------------------------------------

def m7(*lines: tuple[str, str, int], taken: int = 0) -> tuple[int, int, int]:
    """(optimistic, nominal, pessimistic) cycles of the lines run once in a row."""
    from toolchain.lab.timings import CORTEX_M7

    code = program(*lines)
    last = max(code)
    phase = {a: Counts(1, taken if a == last else 0, 0, 0) for a in code}
    e = estimate(phase, code, CORTEX_M7)
    return e.optimistic, e.nominal, e.pessimistic


def test_two_independent_alu_operations_issue_together():
    assert m7(("add", "r0, r1, #1", 4), ("sub", "r2, r3, #1", 4)) == (1, 1, 1)
    assert m7(("add", "r0, r1, #1", 4), ("sub", "r2, r0, #1", 4)) == (2, 2, 2)  # dependent


def test_one_mac_a_cycle_and_a_load_beside_it():
    assert m7(("smlad", "r7, r5, r6, r7", 4), ("smlad", "r8, r5, r6, r8", 4)) == (2, 2, 2)
    assert m7(("ldr", "r4, [r0, #4]", 4), ("smlad", "r7, r5, r6, r7", 4)) == (1, 1, 1)
    # a loaded word feeding a MAC: no pair, and one cycle more
    assert m7(("ldr", "r5, [r0, #4]", 4), ("smlad", "r7, r5, r6, r7", 4)) == (2, 3, 3)


def test_ldrd_and_ldm_issue_alone():
    assert m7(("ldrd", "r4, r5, [r0]", 4), ("add", "r1, r1, #8", 4)) == (2, 2, 2)
    assert m7(("ldmia", "r0!, {r2, r3, r4, r5}", 4)) == (2, 2, 2)


def test_two_loads_pair_unless_they_hit_one_bank():
    assert m7(("ldr", "r2, [r0]", 4), ("ldr", "r3, [r1]", 4)) == (1, 1, 2)


def test_a_taken_branch_costs_by_prediction():
    # the branch issues beside the add; taken, it costs 0, 1 or 3 cycles more
    assert m7(("add", "r0, r0, #1", 2), ("b", "0x100", 2), taken=1) == (1, 2, 4)


# -- the Cortex-M55's Helium beats ---------------------------------------------------------------

def m55(*lines: tuple[str, str, int]) -> tuple[int, int, int]:
    from toolchain.lab.timings import CORTEX_M55

    code = program(*lines)
    e = estimate({a: Counts(1, 0, 0, 0) for a in code}, code, CORTEX_M55)
    return e.optimistic, e.nominal, e.pessimistic


def test_helium_instructions_on_other_pipes_overlap_their_beats():
    load, mac = ("vldrb", "q0, [r0], #16", 4), ("vmladava", "r2, q0, q1", 4)
    assert m55(load, mac) == (3, 3, 3)  # 2 beats each, the second overlapping the first's
    assert m55(load, ("vldrb", "q1, [r1], #16", 4)) == (4, 4, 4)  # one pipe: no overlap
    assert m55(mac, ("vadd", "q2, q2, q3", 4), load) == (4, 4, 4)


def test_scalar_float_is_not_helium_and_a_loop_end_is_cheap():
    assert m55(("vmla", "s0, s1, s2", 4)) == (3, 3, 3)  # the scalar table's VMLA
    assert m55(("le", "lr, 0x100", 4)) == (0, 1, 4)
