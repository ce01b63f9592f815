# Sourced by the device scripts (gpu-check, accuracy-check, ddp-check,
# reddit-check): build the kernels for sm_90 with 16 jobs into a cache (the
# caller may set PYG_DFGNN_CACHE first), run the project from the working
# tree, unbuffered output.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/pdf_cache}
export PYTHONUNBUFFERED=1
# unxz IN OUT: a library carried xz-compressed (.devlib; the device has no
# xz tool), unpacked by Python's lzma.
unxz() {
  python -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2"
}
