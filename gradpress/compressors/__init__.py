"""Gradient compression: codecs registered by name, error feedback and momentum wrappers,
and ``build_compressor`` for BytePS's ``compression_params`` (DESIGN.md section 7).

    c = build_compressor({"compressor": "onebit", "ef": "vanilla"}, role="server")
    header, buffers = c.compress(x, key=k, round=r)
    c.decompress_add(header, buffers, acc, key=k, round=r)
"""
from gradpress.compressors.base import Compressor, payload_nbytes
from gradpress.compressors.registry import COMPRESSORS, build_compressor
# importing the codec modules registers them
from gradpress.compressors import dithering, fp16, none, onebit, randomk, topk  # noqa: F401
from gradpress.compressors.error_feedback import ErrorFeedback
from gradpress.compressors.momentum import Momentum
from gradpress.compressors.spec import CodecSpec

__all__ = ["COMPRESSORS", "CodecSpec", "Compressor", "ErrorFeedback", "Momentum", "build_compressor",
           "payload_nbytes"]
