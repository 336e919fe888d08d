"""cuda_ext: what the harness ships besides Python: the fast CUDA-candidate builder (build.py), its light torch
prelude (kz_prelude.cuh), and the one-shot examples used in the Coder's prompt (example_ref/cuda/triton.py)."""
