"""The compressor interface: a 1-D float array becomes a small header plus buffers, and
back. Stateless codecs subclass ``Compressor`` and implement ``_encode``, ``_decode`` and
``encoded_nbytes``; the wrappers (error feedback, momentum) hold per-key state around one.

Error feedback (``ErrorFeedback``) runs inside a codec's own kernels where the codec
implements ``_encode_feedback`` (and ``_encode_device_feedback``): p = g + lambda * e,
C(p) and the new residual p - D(C(p)) in the fewest passes over memory, with the same
payload and residual bytes as the generic steps.

A payload is never bigger than the raw array: when a codec's encoding of ``n`` elements
would not be smaller (``encoded_nbytes(n, itemsize) >= n * itemsize``, e.g. n = 0, or
onebit with n = 1), the raw array travels instead, marked by the header field ``raw`` (its
dtype). Every codec decodes such payloads.
"""
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

import numpy as np

from gradpress.compressors.arrays import check_vector, divide_in_place, is_device_array, store_float32
from gradpress.compressors.payload import FLOAT_DTYPES, buffer_array, expect_buffer_count

Header = dict
Buffers = list
MAX_ELEMENTS = (1 << 32) - 1  # indices travel as uint32


def reusable(reuse: Buffers | None, index: int, count: int, dtype: Any) -> np.ndarray:
    """``reuse[index]`` where it is a host array of ``count`` ``dtype``, else a new one.

    Why: a large payload allocated afresh each call can be a fresh mapping (glibc maps
    blocks of 32 MB and more on their own), whose pages the kernel zeroes on first touch:
    for fp16 at 16M elements, 3.6 ms on top of its 7.8 ms kernel (docs/history/performance-2026.md)."""
    old = reuse[index] if reuse is not None and len(reuse) > index else None
    if isinstance(old, np.ndarray) and old.dtype == dtype and old.shape == (count,) and old.flags.writeable:
        return old
    return np.empty(count, dtype)


class FeedbackRefused(ValueError):
    """Fused error feedback met a NaN/inf (in g or e, or the codec overflowed); the
    residual ``e`` is unchanged."""


def raw_payload(x: np.ndarray) -> tuple[dict, list]:
    """Header fields and buffers that carry ``x`` unchanged (zero-copy)."""
    return {"raw": x.dtype.name}, [x]


def payload_nbytes(buffers: Sequence[Any]) -> int:
    """Bytes of a payload's buffers (the header is not counted)."""
    return sum(memoryview(b).nbytes for b in buffers)


class Compressor(ABC):
    """Compress / decompress one flat float array; see the module docstring."""

    name: ClassVar[str]
    # compression_params keys this codec reads, with a one-line meaning (for error messages)
    ACCEPTED_PARAMS: ClassVar[dict] = {}

    @classmethod
    @abstractmethod
    def from_params(cls, params: dict) -> "Compressor":
        """Build from a validated BytePS ``compression_params`` dictionary."""

    @abstractmethod
    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        """Payload bytes this codec produces for ``n`` elements of ``itemsize`` bytes."""

    @abstractmethod
    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        """Header fields and buffers for a host array (any accepted dtype)."""

    @abstractmethod
    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        """Same payload for a float32 numba.cuda device array."""

    @abstractmethod
    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        """Validate, then ``out (+)= D(payload) / divisor`` for a float32 ``out`` of
        ``header['n']``, bit for bit D(payload) divided in float32 afterwards. Codecs
        whose payload carries few distinct values (a scale, a table, k pairs) divide those
        instead of every element; servers add with ``divisor`` 1."""

    def restart(self, key: int) -> None:
        """``key``'s round was skipped (NaN/inf somewhere): a codec keeps no state to restart."""

    def compress(self, x: Any, key: int, round: int,
                 lr: float | None = None) -> tuple[Header, Buffers]:
        """Compress ``x`` (1-D numpy array, or CUDA array on a GPU worker).

        Args:
            x: the values; float16/32/64.
            key, round: name the random stream (random-k, dithering).
            lr: unused by stateless codecs (corrected error feedback reads it).
        Returns:
            A msgpack-able header and host buffers. Buffers may alias ``x``; they stay
            valid until ``x`` changes.
        """
        if is_device_array(x):
            return self._compress_device(x, key, round)
        check_vector(x, "compress input")
        if x.shape[0] > MAX_ELEMENTS:
            raise ValueError(f"at most {MAX_ELEMENTS} elements per array, got {x.shape[0]}")
        if self.encoded_nbytes(x.shape[0], x.itemsize) >= x.nbytes:
            fields, buffers = raw_payload(x)
        else:
            fields, buffers = self._encode(x, key, round)
        return {"codec": self.name, "n": x.shape[0], **fields}, buffers

    # whether _encode_feedback checks p before it writes e_out (so e_out may be e)
    FEEDBACK_IN_PLACE: ClassVar[bool] = False

    def compress_with_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                               round: int, reuse: Buffers | None = None) -> tuple[Header, Buffers] | None:
        """Error feedback fused into this codec's kernels: the payload of C(p) for
        p = g + lam * e, and e_out = p - D(C(p)), exactly as the generic steps give them.

        Args:
            g, e: float32 arrays of one length (host, or device on a GPU worker); ``e = g``
                with ``lam = 0`` is the first step (p = g bit for bit).
            e_out: receives the residual; may be ``e`` only when ``FEEDBACK_IN_PLACE``.
            reuse: the buffers of an earlier payload that nobody reads any more (the key's
                previous one): a codec writes its payload over them where they fit.
        Returns:
            (header, buffers), or None where this codec has no fused kernel for this input
            (float64 input, or a raw payload): the caller runs the generic steps.
        Raises:
            FeedbackRefused: p or the residual is not finite; ``e`` is left unchanged.
        """
        device = is_device_array(g)
        if device:
            from gradpress.kernels.cuda import device as gpu
            n = gpu.length(g)
        else:
            n = g.shape[0]
            if g.dtype != np.float32:
                return None
        if n > MAX_ELEMENTS or self.encoded_nbytes(n, 4) >= 4 * n:
            return None
        if device:
            encoded = self._encode_device_feedback(g, e, lam, e_out, key, round, reuse)
        else:
            encoded = self._encode_feedback(g, e, lam, e_out, key, round, reuse)
        if encoded is None:
            return None
        fields, buffers = encoded
        return {"codec": self.name, "n": n, **fields}, buffers

    def _encode_feedback(self, g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                         key: int, round: int, reuse: Buffers | None) -> tuple[dict, list] | None:
        """Fields and buffers of the fused path for host float32 arrays (None: no fused
        kernel); ``reuse`` as in ``compress_with_feedback``. Raises FeedbackRefused for a
        non-finite p or residual (``reuse`` may then hold anything)."""
        return None

    def _encode_device_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                                round: int, reuse: Buffers | None) -> tuple[dict, list] | None:
        """The same for float32 device arrays; the payload comes back to host buffers, those
        of ``reuse`` where they fit (pinned ones, made by an earlier device payload)."""
        return None

    def _compress_device(self, x: Any, key: int, round: int) -> tuple[Header, Buffers]:
        from gradpress.kernels.cuda import device  # numba.cuda only when needed
        n, itemsize = device.length(x), device.itemsize(x)
        if self.encoded_nbytes(n, itemsize) >= n * itemsize:
            fields, buffers = raw_payload(device.to_host(x))
        else:
            fields, buffers = self._encode_device(device.float32_view(x), key, round)
        return {"codec": self.name, "n": n, **fields}, buffers

    def decompress(self, header: Header, buffers: Sequence[Any], out: Any, key: int,
                   round: int, divisor: int = 1) -> None:
        """Overwrite all of ``out`` (numpy float16/32/64, or a CUDA array) with D(payload)
        divided by ``divisor`` (a worker's average), the same bits as dividing ``out``
        afterwards in its own dtype, in one pass where ``out`` is float32. Raises
        ValueError for a malformed payload, before writing anything."""
        if is_device_array(out):
            from gradpress.kernels.cuda import device
            single = device.itemsize(out) == 4  # else divided in out's own dtype, after the copy
            if single and isinstance(header, dict):
                self._check_header(header, device.length(out))
                with device.working_on(out, landing=True):
                    if "raw" in header:  # the encoding would not have been smaller: goes over as it came
                        values = self._raw_values(header, buffers, device.length(out))
                        if values.dtype == np.float32:
                            device.land_divided(values, out, divisor, wait=False)
                            return
                    elif self._decode_device(header, buffers, device.as_device(out), key, round, divisor):
                        return
            host = device.host_scratch(device.length(out), out)  # pinned and reused: the copy is DMA
            self._decode_checked(header, buffers, host, False, key, round, divisor if single else 1)
            with device.working_on(out, landing=True):
                device.copy_from_host(host, out)
                if not single and divisor != 1:
                    out /= divisor  # a CUDA tensor, as the worker's output is
            return
        check_vector(out, "decompress output")
        if out.dtype == np.float32:
            self._decode_checked(header, buffers, out, False, key, round, divisor)
        else:
            values = np.empty(out.shape[0], np.float32)
            self._decode_checked(header, buffers, values, False, key, round)
            store_float32(values, out)
            divide_in_place(out, divisor)  # after rounding to out's dtype, as the caller would

    def _decode_device(self, header: Header, buffers: Sequence[Any], out: Any, key: int, round: int,
                       divisor: int) -> bool:
        """Decode (divided) into ``out``, a float32 device array, on the GPU; False where this
        codec decodes on the host instead (the base: every codec does). ``header`` is checked."""
        return False

    def decompress_add(self, header: Header, buffers: Sequence[Any], acc: np.ndarray, key: int,
                       round: int) -> None:
        """``acc += D(payload)`` for a float32 accumulator (what a server does per push)."""
        check_vector(acc, "accumulator")
        if acc.dtype != np.float32:
            raise ValueError(f"accumulator must be float32, got {acc.dtype}")
        self._decode_checked(header, buffers, acc, True, key, round)

    def _decode_checked(self, header: Header, buffers: Sequence[Any], out: np.ndarray,
                        accumulate: bool, key: int, round: int, divisor: int = 1) -> None:
        self._check_header(header, out.shape[0])
        if "raw" in header:
            self._decode_raw(header, buffers, out, accumulate)
            divide_in_place(out, divisor)
        else:
            self._decode(header, buffers, out, accumulate, key, round, divisor)

    def _check_header(self, header: Header, n: int) -> None:
        """A payload's header names this codec and ``n`` elements (ValueError if not)."""
        if not isinstance(header, dict) or header.get("codec") != self.name:
            codec = header.get("codec") if isinstance(header, dict) else header
            raise ValueError(f"payload codec {codec!r} is not {self.name!r}")
        if header.get("n") != n:
            raise ValueError(f"payload has n={header.get('n')!r} elements, output has {n}")

    @staticmethod
    def _raw_values(header: Header, buffers: Sequence[Any], n: int) -> np.ndarray:
        dtype = FLOAT_DTYPES.get(header["raw"])
        if dtype is None:
            raise ValueError(f"payload raw dtype must be one of {list(FLOAT_DTYPES)}, "
                             f"got {header['raw']!r}")
        expect_buffer_count(buffers, 1)
        return buffer_array(buffers, 0, dtype, n, "raw values")

    @classmethod
    def _decode_raw(cls, header: Header, buffers: Sequence[Any], out: np.ndarray,
                    accumulate: bool) -> None:
        values = cls._raw_values(header, buffers, out.shape[0])
        if accumulate:  # add D(payload) as a float32 array, as every other codec does
            out += values.astype(np.float32, copy=False)
        else:
            out[:] = values

    def nbytes(self, header: Header, buffers: Sequence[Any]) -> int:
        """Payload size in bytes (buffers only)."""
        return payload_nbytes(buffers)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
