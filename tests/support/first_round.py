"""What every worker of a job lands from a compressed key's first round, replayed in numpy
(the job scripts of tests/kernels/test_device_raw_integ.py import it)."""
import numpy as np

from gradpress.compressors import build_compressor


def first_round(params: dict, sources: list, n: int, part: int) -> np.ndarray:
    """The average over ``n`` workers of a first round of ``params`` over ``sources`` (one
    push each: a worker's values, or a machine's sum), partition by partition of ``part``
    elements: each push encoded by a fresh worker compressor, the decoded pushes summed and
    encoded again by a fresh server one, that decoded and divided by ``n``."""
    size = sources[0].shape[0]
    want = np.empty(size, np.float32)
    for start in range(0, size, part):
        end = min(start + part, size)
        acc = np.zeros(end - start, np.float32)
        for source in sources:
            header, payload = build_compressor(params, "worker").compress(source[start:end], key=0, round=0)
            build_compressor(params, "server").decompress_add(header, payload, acc, key=0, round=0)
        header, payload = build_compressor(params, "server").compress(acc, key=0, round=0)
        build_compressor(params, "worker").decompress(header, payload, want[start:end], key=0, round=0, divisor=n)
    return want
