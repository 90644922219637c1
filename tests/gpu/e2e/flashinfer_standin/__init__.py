"""TEST EQUIPMENT, not flashinfer: a stand-in for the GPU machine of the end-to-end harness
(tests/gpu/e2e/README.md). It holds flashinfer-python 0.7.2's ``data/include`` headers (SGLang's JIT
kernels include them) and the two ``flashinfer.sampling`` entry points the DFlash/DDTree worker binds
at start (``kernels/ops/sampling/renorm.py``), computed by SGLang's own Triton kernels. Used with
``SGLANG_IS_FLASHINFER_AVAILABLE=false``; real hosts install the real flashinfer."""
