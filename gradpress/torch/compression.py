"""``Compression.none`` / ``Compression.fp16``: byteps.torch's tensor-level compressors.

They act on a whole tensor before push_pull and after it, as in BytePS; the
gradient compressors of ``compression_params`` (onebit, topk, ...) are another
layer, applied per partition inside the push/pull pipeline.
"""
from __future__ import annotations

import warnings

import torch


class TensorCompressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) -> tensor``.

    (BytePS calls this class ``Compressor``, and so does this module: a custom compressor
    subclasses either name; ``gradpress.compressors.Compressor`` is another thing, the
    gradient codecs, which work per partition.)"""

    @staticmethod
    def compress(tensor: torch.Tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx):
        raise NotImplementedError


Compressor = TensorCompressor  # byteps.torch.compression's name, which custom compressors subclass


class NoneCompressor(TensorCompressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(TensorCompressor):
    """Floating-point tensors travel as float16; servers still sum in fp32. bfloat16 stays
    bfloat16: it is 16 bits already, and float16 would overflow above 65504."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype not in (torch.float16, torch.bfloat16):
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)

    @staticmethod
    def decompress_into(tensor, ctx, out):
        """``decompress`` written into ``out`` (of ``ctx``'s dtype): a fused bucket widens its
        average straight into its own buffer, whose views its members hold, with no new tensor."""
        return out.copy_(tensor)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor


def narrows_to_half(compression) -> bool:
    """Whether ``compression`` is ``Compression.fp16`` (or a subclass, or one of their
    instances): it sends float32 and float64 tensors as float16, without their codec."""
    return isinstance(compression, FP16Compressor) or (isinstance(compression, type)
                                                       and issubclass(compression, FP16Compressor))


def check_compression(compression, compression_params: dict | None, where: str) -> None:
    """Refuse what is not a tensor-level compressor (``compression="fp16"`` failed at the first
    backward, in a hook), and say where ``Compression.fp16`` takes the codec's place."""
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"{where}: compression={compression!r} is not a compressor; pass bps.Compression.none, "
                        f"bps.Compression.fp16 or a bps.Compressor subclass (codecs go in compression_params)")
    codec = (compression_params or {}).get("compressor", "none")
    if narrows_to_half(compression) and isinstance(codec, str) and codec.lower() != "none":
        warnings.warn(f"{where}: compression=Compression.fp16 sends each float32 gradient as float16 without its "
                      f"codec ({codec}): compression_params then compress only the float16 and bfloat16 ones; "
                      f"leave compression=Compression.none for the codec", stacklevel=3)
