"""Lowering: every op bound to its kernel (program), PAD fusion, the schedule, striped
execution (tiling), lifetimes, and the plan that places every buffer."""
