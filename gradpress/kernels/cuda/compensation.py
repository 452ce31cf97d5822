"""``p = g + lam * e`` on the device, rounded as the CPU kernels round it.

The CPU kernels (``kernels/cpu/elementwise.compensate`` and the fused encoders' ``_p``)
compute it in float64: ``lam`` a float64, ``g`` and ``e`` widened, the product and the sum
each rounded once, the sum then to float32. NVVM contracts a multiply that feeds an add into
one fused multiply-add, rounded once, by default (in float32 as in float64). The device
used to compute it in float32 with ``lam`` rounded to float32: for corrected error feedback
(``lam = eta_{t-1} / eta_t``, not 1) 17 of 40 elements then differed from the CPU in a last
bit, under the simulator, which does not even fuse. libdevice's ``__nv_dmul_rn`` and
``__nv_dadd_rn`` are never contracted, so the device rounds where the CPU does. (With ``lam = 1`` every way gives the
same bits: a float64 sum of two float32s rounds to float32 as their float32 sum does.)

The simulator has no libdevice (its functions there are stubs that return None): there the
same float64 arithmetic runs as plain numpy scalars, which round where the CPU does too.
``tests/support/ptx_check.py`` compiles the device's version of every simulated kernel.
"""
from numba import config, cuda, float32, float64

if config.ENABLE_CUDASIM:
    @cuda.jit(device=True)
    def compensated(g, lam, e):
        """float32(float64(g) + lam * float64(e)), ``lam`` a float64."""
        return float32(float64(g) + lam * float64(e))
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def compensated(g, lam, e):
        """float32(float64(g) + lam * float64(e)), ``lam`` a float64, never contracted."""
        return float32(libdevice.dadd_rn(float64(g), libdevice.dmul_rn(lam, float64(e))))
