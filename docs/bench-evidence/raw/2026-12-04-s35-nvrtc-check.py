"""One kernel instantiation through NVRTC (name expression, as engine/ops/compile.py has CuPy do), to PTX,
then ptxas -v for the arch: registers and spills. Usage: python nvrtc.py REPO LIBNVRTC SRC EXPR ARCH [OPTS]
(session 35; the builtins library must be on LD_LIBRARY_PATH)."""
import ctypes, subprocess, sys
sys.path.insert(0, sys.argv.pop(1))  # the repository root
from engine.ops.compile import read_source

lib = ctypes.CDLL(sys.argv.pop(1))  # a libnvrtc.so.12 / .13 (nvidia-cuda-nvrtc wheels)
src_name, expr, arch = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "90"
src = read_source(src_name).encode()
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
assert lib.nvrtcAddNameExpression(prog, expr.encode()) == 0
opts = [b"-std=c++17", f"-DDS_SM={arch}".encode(), f"-arch=compute_{arch}".encode()] + [o.encode() for o in sys.argv[4:]]
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
if rc != 0:
    print(log.value.decode()); sys.exit(1)
lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
lib.nvrtcGetPTX(prog, buf)
open("/tmp/k.ptx", "wb").write(buf.value)
r = subprocess.run(["ptxas", f"-arch=sm_{arch}", "-v", "/tmp/k.ptx", "-o", "/tmp/k.cubin"], capture_output=True, text=True)
print(r.stdout, r.stderr)
