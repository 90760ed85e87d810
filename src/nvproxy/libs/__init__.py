"""NVIDIA's math libraries (cuBLAS, cuBLASLt, cuFFT, cuRAND, cuSPARSE, cuSOLVER) through the proxy: the API
description (api/), what the headers do not say (annotations/), their classification (spec.py), the proxy's
executor (native.py) and the records that rebuild handles after a restore (state.py)."""
