"""gradpress: a BytePS-style parameter server with gradients compressed both ways.

The training API lives in :mod:`gradpress.torch` (a drop-in for ``byteps.torch``).
"""
__version__ = "0.1.0"
