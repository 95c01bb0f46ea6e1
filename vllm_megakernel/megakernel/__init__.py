"""The decode megakernel's host side: ABI, schedule builder and CPU simulator (CUDA lives in csrc/)."""
