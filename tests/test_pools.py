"""Memory pools: buffers placed fastest pool first within each pool's capacity, each pool its own
array in its linker section, proven by runtime_py (one poisoned array per pool) and the C."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from runtime_py.interpreter import POISON, ArenaInterpreter
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_runtime import pool_chain
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import ArenacError, PlanError
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.memory import load_memory, parse_pool
from toolchain.lower.plan import Techniques, plan_model
from toolchain.planners import (
    Buffer,
    Placement,
    Pool,
    PoolArena,
    PooledPlacement,
    plan_pools,
    verify_pools,
)

FAST = Pool("fast", 2304, ".dtcm")
SLOW = Pool("slow", 4096)


# Pools plan whole ops: the single arena they are compared with too.
WHOLE = Techniques(tiling="off")


@pytest.fixture(scope="module")
def chain() -> bytes:
    """Four 1152-byte tensors and two 32-byte scratch buffers; the best single arena is 2336
    bytes, its peak (op 1) one 32-byte scratch above what FAST holds."""
    return pool_chain()


def pooled(data: bytes, pools=(FAST, SLOW), **options):
    return plan_model(parse_model(data, "chain.tflite"), pools=list(pools), **options)


def test_the_fast_pool_spills_exactly_what_it_must(chain):
    single = plan_model(parse_model(chain, "chain.tflite"), techniques=WHOLE)
    assert single.arena_bytes == single.overlap_bound_bytes == 2336 > FAST.capacity
    mp = pooled(chain)
    fast, slow = mp.pools
    spilled = [b for b, k in zip(mp.plan.buffers, mp.pool_of, strict=True) if k == 1]
    assert [b.size for b in spilled] == [2336 - FAST.capacity]  # one scratch buffer, no more
    assert (fast.bytes, slow.bytes) == (2304, 32) and slow.base == 2304
    verify_pools(PooledPlacement(mp.plan, mp.pools, mp.pool_of))
    with CBackend(mp) as backend:
        assert check_plan(mp, chain, inputs=2, extra=[("c", backend.invoke_many)]).ok


def test_runtime_py_runs_in_one_poisoned_array_per_pool(chain):
    mp = pooled(chain)
    runtime = ArenaInterpreter(mp)
    assert [a.nbytes for a in runtime.arenas] == [2304, 32]
    x = np.random.default_rng(1).integers(-128, 128, (1, 12, 12, 8), dtype=np.int8)
    out = runtime.invoke([x])[0]
    assert np.array_equal(out, ArenaInterpreter(plan_model(parse_model(chain))).invoke([x])[0])
    assert (runtime.arenas[1] == POISON).all()  # the spilled scratch died: poisoned again


def test_a_pool_that_holds_everything_takes_everything(chain):
    mp = pooled(chain, (Pool("big", 1 << 20), SLOW))
    assert set(mp.pool_of) == {0} and mp.pools[1].bytes == 0
    assert mp.pools[0].bytes == plan_model(parse_model(chain), techniques=WHOLE).arena_bytes


def test_plain_buffers_spill_the_smallest_that_relieves_the_peak():
    buffers = [Buffer(0, 96, 0, 1), Buffer(1, 96, 1, 2), Buffer(2, 48, 1, 1),
               Buffer(3, 64, 2, 3)]
    result = plan_pools(buffers, (), [Pool("a", 208), Pool("b", 1000)], [("greedy", {})])
    assert result.pool_of == (0, 0, 1, 0)  # the 48-byte buffer alone brings 240 under 208
    assert [a.bytes for a in result.arenas] == [192, 48]


def test_pins_force_a_pool(chain):
    mp = pooled(chain, pins={"0": "slow", "max_pool_2d_0": "slow"})
    pool_of = {t: mp.pools[mp.pool_of[i]].pool.name for t, i in mp.lifetimes.tensor_buffers.items()}
    assert pool_of[0] == pool_of[2] == "slow" and pool_of[1] == "fast"
    assert ArenaInterpreter(mp).invoke([np.zeros((1, 12, 12, 8), np.int8)])


@pytest.mark.parametrize("pins, said", [
    ({"0": "nowhere"}, "no pool named 'nowhere' (the pools are fast, slow)"),
    ({"no_such_tensor": "fast"}, "the graph has no tensor 'no_such_tensor'"),
])
def test_bad_pins_are_refused(chain, pins, said):
    with pytest.raises(ArenacError, match=said.replace("(", r"\(").replace(")", r"\)")):
        pooled(chain, pins=pins)


def test_pins_that_overflow_their_pool_are_refused_by_name(chain):
    with pytest.raises(PlanError, match=r"the tensors pinned to pool small need 2304 bytes at "
                                        r"step 1 \(op 1 MAX_POOL_2D\); it holds 2048"):
        pooled(chain, (Pool("small", 2048), SLOW), pins={"1": "small", "2": "small"})


def test_the_state_block_can_be_pinned_and_takes_its_room():
    from toolchain.front.examples import EXAMPLES

    data = EXAMPLES["streaming_kws_int8"]()
    base = plan_model(parse_model(data, "kws.tflite"))
    assert base.state_bytes
    room = base.arena_bytes + 16  # the arena fits, not with the state beside it
    pools = [Pool("tcm", room, ".dtcm"), Pool("sram", 1 << 16)]
    alone = plan_model(parse_model(data, "kws.tflite"), pools=pools)
    pinned = plan_model(parse_model(data, "kws.tflite"), pools=pools, pins={"state": "tcm"})
    assert alone.pools[0].reserved == 0 and alone.state_pool is None
    assert alone.pools[0].bytes == base.arena_bytes
    assert pinned.state_pool == 0 and pinned.pools[0].reserved >= base.state_bytes
    assert pinned.pools[0].bytes + pinned.pools[0].reserved <= room
    assert pinned.pools[0].bytes < alone.pools[0].bytes  # the state took some of the room
    c = generate(pinned, "k")["k.c"]
    assert 'ARENAC_SECTION(".dtcm") static uint8_t k_state[' in c
    with CBackend(pinned) as backend:
        assert check_plan(pinned, data, inputs=1, extra=[("c", backend.invoke_many)]).ok


def test_verify_pools_catches_what_verify_cannot():
    buffers = (Buffer(0, 64, 0, 0), Buffer(1, 64, 1, 1))
    placement = Placement.from_offsets("by hand", 16, buffers, (0, 64))
    pools = (PoolArena(Pool("a", 64), 0, 64), PoolArena(Pool("b", 64), 64, 64))
    verify_pools(PooledPlacement(placement, pools, (0, 1)))
    with pytest.raises(PlanError, match="lie outside pool a"):
        verify_pools(PooledPlacement(placement, pools, (0, 0)))
    small = (PoolArena(Pool("a", 32), 0, 64), pools[1])
    with pytest.raises(PlanError, match="pool a holds 32 bytes; the plan puts 64 there"):
        verify_pools(PooledPlacement(placement, small, (0, 1)))


def test_the_c_puts_each_pool_in_its_own_array_and_section(chain):
    c = generate(pooled(chain), "p")["p.c"]
    assert 'ARENAC_ALIGN(16) ARENAC_SECTION(".dtcm") static uint8_t p_fast_arena[2304];' in c
    assert "ARENAC_ALIGN(16) static uint8_t p_slow_arena[32];" in c
    assert "p_arena" not in c
    default = generate(plan_model(parse_model(chain), techniques=WHOLE), "p")["p.c"]
    assert "ARENAC_SECTION" not in default and "static uint8_t p_arena[2336];" in default


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="no arm-none-eabi-gcc")
def test_cortex_m_object_has_the_pool_in_its_section(chain, tmp_path):
    # the portable pools' scratch spills to the slow pool (the DSP pools need none)
    files = generate(pooled(chain, target="cortex-m4", portable=True), "p")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-std=c99", "-O2",
                    "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-c", "p.c"],
                   cwd=tmp_path, check=True)
    sections = subprocess.run(["arm-none-eabi-objdump", "-h", "p.o"], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout
    sizes = {line.split()[1]: int(line.split()[2], 16) for line in sections.splitlines()
             if line.strip()[:1].isdigit()}
    assert sizes[".dtcm"] == 2304  # the fast pool, whole and alone
    assert sizes.get(".bss", 0) >= 32  # the slow pool, where zeroed data goes


def test_an_impossible_pool_set_is_one_line_and_exit_2(chain, tmp_path, capsys):
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain)
    code = main(["plan", str(path), "--pool", "fast:1K:.dtcm", "--pool", "slow:1K"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.strip().endswith("does not fit the pools: step 1 (op 1 MAX_POOL_2D) needs 2336 "
                                "bytes; the pools hold fast 1024, slow 1024 bytes")


def test_plan_json_shows_every_pool(chain, tmp_path, capsys):
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain)
    assert main(["plan", str(path), "--json", "--pool", "fast:2304:.dtcm", "--pool",
                 "slow:4K", "--svg", str(tmp_path / "m.svg")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["section"], p["capacity"], p["bytes"]) for p in data["pools"]] == [
        ("fast", ".dtcm", 2304, 2304), ("slow", None, 4096, 32)]
    assert {b["pool"] for b in data["buffers"]} == {"fast", "slow"}
    svg = (tmp_path / "m.svg").read_text()
    assert "fast: 2304 of 2304 bytes" in svg and "slow: 32 of 4096 bytes" in svg
    assert main(["plan", str(path), "--pool", "fast:2304:.dtcm", "--pool", "slow:4K"]) == 0
    text = capsys.readouterr().out
    assert "pool fast    2304 of 2304 bytes" in text and "pool slow    32 of 4096 bytes" in text


def test_a_memory_file_says_what_the_options_say(chain, tmp_path, capsys):
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain)
    toml = tmp_path / "memory.toml"
    toml.write_text('[[pools]]\nname = "fast"\nsize = "2304"\nsection = ".dtcm"\n'
                    '[[pools]]\nname = "slow"\nsize = "4K"\n[pins]\n"0" = "slow"\n')
    as_json = tmp_path / "memory.json"
    as_json.write_text(json.dumps({"pools": [{"name": "fast", "size": 2304, "section": ".dtcm"},
                                             {"name": "slow", "size": "4K"}],
                                   "pins": {"0": "slow"}}))
    outputs = []
    for options in (["--memory", str(toml)], ["--memory", str(as_json)],
                    ["--pool", "fast:2304:.dtcm", "--pool", "slow:4K", "--pin", "0=slow"]):
        assert main(["plan", str(path), "--json", *options]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] == outputs[2]
    assert load_memory(str(toml)).pools == (FAST, SLOW)


@pytest.mark.parametrize("text, said", [
    ("[[pools]]\nname = 'x'\n", "size '' is not a whole number"),
    ("pools = 3\n", "expected a list of pools under 'pools'"),
    ("[[pools]]\nname = '9x'\nsize = 4\n", "pool name '9x' must be a letter"),
    ("not toml [", "not a readable memory description"),
])
def test_a_bad_memory_file_is_one_line(chain, tmp_path, capsys, text, said):
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain)
    memory = tmp_path / "memory.toml"
    memory.write_text(text)
    assert main(["plan", str(path), "--memory", str(memory)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(memory) in err and said in err


@pytest.mark.parametrize("text, value", [
    ("dtcm:64K:.dtcm", Pool("dtcm", 65536, ".dtcm")),
    ("psram:8M:.psram", Pool("psram", 8 << 20, ".psram")),
    ("sram:1000", Pool("sram", 1000)),
])
def test_pool_options_parse(text, value):
    assert parse_pool(text) == value


@pytest.mark.parametrize("bad", ["dtcm", "dtcm:64Q", "dtcm:0", "dtcm:1K:bad section",
                                 "a:1:b:c"])
def test_bad_pool_options_are_usage_errors(chain, tmp_path, capsys, bad):
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain)
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(path), "--pool", bad])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1



@needs_mcu
def test_pools_and_a_pinned_state_run_under_qemu(chain):
    from toolchain.front.examples import EXAMPLES

    data = EXAMPLES["streaming_kws_int8"]()
    model = parse_model(data, "kws.tflite")
    base = plan_model(model)
    assert base.state_bytes == 33
    with pytest.raises(PlanError, match=r"the state \(48 bytes\), aligned to 16, do not fit pool "
                       r"tcm \(16 bytes\)"):
        plan_model(model, pools=[Pool("tcm", 16), SLOW], pins={"state": "tcm"})
    room = base.state_bytes + base.arena_bytes // 2
    mp = plan_model(model, pools=[Pool("tcm", room, ".dtcm"), Pool("sram", 1 << 16)],
                    pins={"state": "tcm", "weights": "sram"})
    assert set(mp.pool_of) == {0, 1} and mp.state_pool == 0 and mp.weights_pool == 1
    with QemuBackend(mp) as backend:
        assert check_plan(mp, data, inputs=2, extra=[("qemu", backend.invoke_many)]).ok
        figures = backend.footprint()
    assert [p["measured"] for p in figures["pools"]] == [a.bytes for a in mp.pools]
    assert figures["arena"] == sum(a.bytes for a in mp.pools)
    assert "ARENAC_SECTION" not in generate(pooled(chain, (Pool("a", 4096), SLOW)), "p")["p.c"]


@pytest.mark.parametrize("argv, said", [
    (["embed", "{model}", "-o", "{tmp}/x.tflite", "--pool", "a:4K"],
     "TFLite Micro plans one arena: embed takes no pools"),
    (["gen", "{model}", "-o", "{tmp}/g", "--pool", "a:4K", "--arena", "extern"],
     "memory pools are static arrays of the generated file"),
    (["plan", "{model}", "--pin", "0=a"], "--pin places tensors in pools: give --pool"),
    (["plan", "{model}", "--pool", "a:4K", "--pool", "a:8K"], "two pools have the same name"),
])
def test_what_pools_do_not_combine_with_is_one_line(chain, tmp_path, capsys, argv, said):
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain)
    assert main([a.format(model=path, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and str(path) in err
    assert not (tmp_path / "x.tflite").exists() and not (tmp_path / "g").exists()


@pytest.mark.parametrize("example", ["tiny_cnn_int8", "residual_cnn_float32",
                                     "streaming_kws_int8"])
def test_weights_pinned_to_a_pool_are_copied_there_and_read_there(example):
    from toolchain.front.examples import EXAMPLES

    data = EXAMPLES[example]()
    model = parse_model(data, f"{example}.tflite")
    pools = [Pool("tcm", 1 << 16, ".dtcm"), Pool("sram", 1 << 20)]
    mp = plan_model(model, pools=pools, pins={"weights": "tcm", "state": "tcm"})
    layout, nbytes = mp.weights_layout
    assert nbytes and mp.pools[0].reserved == nbytes + -(-mp.state_bytes // 16) * 16
    c = generate(mp, "m")["m.c"]
    assert f'ARENAC_SECTION(".dtcm") static uint8_t m_weights[{nbytes}];' in c
    copied = re.findall(r"memcpy\(m_weights \+ (\d+), m_(?:sg\d+_)?t\d+, (\d+)\);", c)
    assert copied and all(int(o) in layout.values() for o, _ in copied)
    assert "if (!m_weights_copied) m_copy_weights();" in c
    read = set(re.findall(r"\(m_weights \+ (\d+)\)\)", c))
    assert read == {o for o, _ in copied}  # kernels read the copy, never the flash arrays
    with CBackend(mp) as backend:
        assert check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)]).ok


def test_weights_too_large_for_their_pool_are_refused():
    from toolchain.front.examples import EXAMPLES

    model = parse_model(EXAMPLES["tiny_cnn_int8"](), "cnn.tflite")
    with pytest.raises(PlanError, match=r"the weights \(3632 bytes\), aligned to 16, do not "
                                        r"fit pool tcm \(1024 bytes\)"):
        plan_model(model, pools=[Pool("tcm", 1024), SLOW], pins={"weights": "tcm"})
