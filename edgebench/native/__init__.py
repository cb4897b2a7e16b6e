"""The native ExecuTorch training worker (host side): its C++ source and CMake build
(worker.cpp, CMakeLists.txt), the bundle builder (build.py) and the run plan it reads
(plan.py). The device side only starts it: edgebench/runner/native.py."""
