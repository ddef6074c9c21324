"""TFLite Micro's signal library: the custom ops of its audio front end.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.signal.emit import (
    delay_values,
    each_element,
    emit_rfft,
    emitter,
    energy_values,
    framer_values,
    log_values,
    overlap_add_values,
    pcan_values,
    spectral_values,
    stacker_values,
    window_values,
)
from toolchain.ops.signal.prepare import (
    FFT_DTYPES,
    delay_state,
    framer_state,
    overlap_add_state,
    prepare_auto_scale,
    prepare_delay,
    prepare_energy,
    prepare_filter_bank,
    prepare_framer,
    prepare_log,
    prepare_overlap_add,
    prepare_pcan,
    prepare_rfft,
    prepare_spectral_subtraction,
    prepare_square_root,
    prepare_stacker,
    prepare_window,
    rfft_scratch,
    spectral_subtraction_state,
    stacker_state,
)
from toolchain.ops.spec import TFLM, OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    OpSpec("SignalWindow", kernels("int16, int16 -> int16", oracle=TFLM), prepare_window,
           emitter("window", "SignalWindow '{name}': each input times its window weight, shifted "
                   "right by {p.shift} and saturated to int16, as TFLite Micro computes it",
                   values=window_values)),
    OpSpec("SignalFftAutoScale", kernels("int16 -> int16, int32", oracle=TFLM),
           prepare_auto_scale,
           emitter("auto_scale", "SignalFftAutoScale '{name}': the input shifted left by the bits "
                   "its largest magnitude leaves free (none when that is 0 or -32768, as TFLite "
                   "Micro's scan finds it), and that shift", ("clz32",),
                   each_element(lambda p: p.size))),
    OpSpec("SignalRfft", kernels("T -> T", T=FFT_DTYPES, oracle=TFLM), prepare_rfft,
           emit_rfft, scratch=rfft_scratch),
    OpSpec("SignalIrfft", kernels("T -> T", T=FFT_DTYPES, oracle=TFLM), prepare_rfft,
           emit_rfft, scratch=rfft_scratch),
    OpSpec("SignalEnergy", kernels("int16 -> uint32", oracle=TFLM), prepare_energy,
           emitter("energy", "SignalEnergy '{name}': re^2 + im^2 of bins {p.start}-{p.end} in "
                   "uint32, 0 elsewhere", values=energy_values)),
    OpSpec("SignalFilterBank",
           kernels("uint32, int16, int16, int16, int16, int16 -> uint64", oracle=TFLM),
           prepare_filter_bank,
           emitter("filter_bank", "SignalFilterBank '{name}': {p.channels} channels, each the "
                   "sum of its weights times the energies plus the previous channel's unweighted "
                   "sum (uint64, wrapping as TFLite Micro's C++ does); the first of the "
                   "{p.channels} + 1 sums only feeds the second")),
    OpSpec("SignalFilterBankSquareRoot", kernels("uint64, int32 -> uint32", oracle=TFLM),
           prepare_square_root,
           emitter("square_root", "SignalFilterBankSquareRoot '{name}': each channel's square "
                   "root rounded to nearest (at most 65535 below 2^32, as TFLite Micro's), "
                   "shifted right by the run-time bit count", ("signal_sqrt",),
                   each_element(lambda p: p.channels))),
    OpSpec("SignalFilterBankSpectralSubtraction",
           kernels("uint32 -> uint32, uint32", oracle=TFLM), prepare_spectral_subtraction,
           emitter("spectral_subtraction", "SignalFilterBankSpectralSubtraction '{name}': the "
                   "noise estimate (kept across invokes) moves toward each channel's signal, is "
                   "subtracted from it down to a floor of the signal, and is the second output",
                   values=spectral_values),
           state=spectral_subtraction_state),
    OpSpec("SignalPCAN", kernels("uint32, uint32, int16 -> uint32", oracle=TFLM), prepare_pcan,
           emitter("pcan", "SignalPCAN '{name}': each channel's gain from its noise estimate "
                   "through the gain table, SNR = signal * gain >> {p.snr_shift}, then "
                   "compressed", ("signal_pcan",), pcan_values)),
    OpSpec("SignalFilterBankLog", kernels("uint32 -> int16", oracle=TFLM), prepare_log,
           emitter("log", "SignalFilterBankLog '{name}': a fixed-point natural log of each "
                   "channel shifted left by {p.correction_bits}, times {p.output_scale} / 65536, "
                   "saturated to int16 (0 for inputs below 2)", ("signal_log",), log_values)),
    OpSpec("SignalDelay", kernels("int16 -> int16", oracle=TFLM), prepare_delay,
           emitter("delay", "SignalDelay '{name}': each row of {p.frame} samples delayed by "
                   "{p.delay} (the delayed samples are kept across invokes, zeros after a reset)",
                   values=delay_values), state=delay_state),
    OpSpec("SignalFramer", kernels("int16 -> int16, bool", oracle=TFLM), prepare_framer,
           emitter("framer", "SignalFramer '{name}': frames of {p.size} samples every {p.step} "
                   "from the samples kept across invokes; a frame not yet whole is written as "
                   "zeros and clears the valid flag (TFLite Micro leaves it unwritten)",
                   values=framer_values),
           state=framer_state),
    OpSpec("SignalStacker", kernels("int16 -> int16, bool", oracle=TFLM), prepare_stacker,
           emitter("stacker", "SignalStacker '{name}': {p.left} + 1 + {p.right} frames of "
                   "{p.channels} channels stacked, every {p.step} frames (the first frame after a "
                   "reset also fills the left context); a stack not yet whole is written as zeros "
                   "and clears the valid flag (TFLite Micro leaves it unwritten)",
                   values=stacker_values),
           state=stacker_state),
    OpSpec("SignalOverlapAdd", kernels("T -> T", T=("int16", "float32"), oracle=TFLM),
           prepare_overlap_add,
           emitter("overlap_add", "SignalOverlapAdd '{name}': each frame of {p.size} added "
                   "(saturating in int16) into the sums kept across invokes, whose first {p.step} "
                   "are written out and leave", values=overlap_add_values),
           state=overlap_add_state),
)
