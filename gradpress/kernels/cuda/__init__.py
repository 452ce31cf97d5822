"""numba.cuda kernels of the worker side: payloads byte-identical to the CPU kernels.
Imported only when a compressor meets a device array (a torch CUDA tensor, or a simulator
array under ``NUMBA_ENABLE_CUDASIM=1``). Decoding for device outputs runs on the host
(``Compressor.decompress`` copies the result over), so only encoders live here.
"""
