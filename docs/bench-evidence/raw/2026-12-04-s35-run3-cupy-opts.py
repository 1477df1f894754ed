"""Which NVRTC and options CuPy compiles our RawModules with (printed once)."""
import cupy
from cupy.cuda import compiler, nvrtc
print("cupy", cupy.__version__, "nvrtc", nvrtc.getVersion(), "driver", cupy.cuda.runtime.driverGetVersion())
seen = []
orig = compiler.compile_using_nvrtc
def spy(source, options=(), *a, **k):
    seen.append(tuple(options))
    return orig(source, options, *a, **k)
compiler.compile_using_nvrtc = spy
src = "template<int N> __global__ void k(float* x) { auto f = [&](auto v) { return v * N; }; x[0] = f(1.f); }"
m = cupy.RawModule(code=src, options=("-std=c++17", "-DDS_SM=90"), name_expressions=["k<2>"])
m.compile()
print("options:", seen)
