"""Compiling for the target GPU without one: Triton's compiler driven from launches the
interpreter recorded (triton_specialization.py), and ahead-of-time builds whose cubins give
registers, spills and shared memory (target_compile.py, open first).

The CUDA C++ contract and launcher that kernel files import stay at harness/cuda_build.py and
harness/cuda_launcher.py: kernel files and exported packages import them by that path.

Never: runs what it compiles.
"""
