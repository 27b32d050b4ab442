"""The batch-invariant kernels' GPU path (tl.dot, bf16/fp16/fp32, the CUDA tiles) compiles for
Hopper (sm_90) ahead of time, with no GPU: a type or layout error there shows up on the CPU, not
in the device run. The compiles run in a subprocess without TRITON_INTERPRET (the interpreter
replaces Triton's code generation in the test process), with the ptxas the triton wheel ships."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def compile_all() -> dict[str, bool]:
    """Compile every kernel variant the CUDA path launches; name → its PTX has tensor-core mma."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from blockspec.attention import triton_invariant
    from blockspec.layers import triton_invariant_norm, triton_matmul

    target = GPUTarget("cuda", 90, 32)

    def build(kernel, signature, constexprs, **options):
        sig = {**signature, **{k: "constexpr" for k in constexprs}}
        k = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs), target=target, options=options)
        return "mma" in k.asm["ptx"]

    def ints(*names):
        return {n: "i32" for n in names}

    found = {}
    bm, bn, bk, warps, stages = triton_matmul.CUDA_TILE
    for dt in ("*bf16", "*fp16", "*fp32"):
        sig = {"x_ptr": dt, "w_ptr": dt, "b_ptr": dt, "out_ptr": dt,
               **ints("M", "N", "K", "s_xm", "s_xk", "s_wn", "s_wk", "s_om", "s_on")}
        found[f"gemm {dt}"] = build(triton_matmul._matmul_kernel, sig, {
            "HAS_BIAS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "USE_DOT": True,
            "INPUT_PRECISION": "ieee" if dt == "*fp32" else "tf32"}, num_warps=warps, num_stages=stages)
    for n in (128, 4096):
        rows = triton_invariant_norm.rows_per_program(n, True)
        sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "sum_ptr": "*bf16",
               **ints("R", "N", "s_x", "s_r", "s_o", "s_s"), "eps": "fp32"}
        found[f"rms_norm {n}"] = build(triton_invariant_norm._invariant_rms_kernel, sig,
                                       {"HAS_RES": True, "ROWS": rows, "BLOCK": n}, num_warps=4 if n >= 1024 else 1)
    block_n, warps, stages = triton_invariant.CUDA_TILE
    for dt in ("*bf16", "*fp32"):
        for mode, code in triton_invariant.MASK_MODES.items():
            sig = {"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "pt_ptr": "*i64", "prefix_ptr": "*i64", "newlen_ptr": "*i64",
                   "anc_ptr": "*i32", "depth_ptr": "*i32", "out_ptr": dt, "qk_scale": "fp32",
                   **ints("s_pre", "s_new", "s_qb", "s_qq", "s_qh", "s_qd", "s_ks", "s_kh", "s_kd", "s_vs", "s_vh",
                          "s_vd", "s_ptb", "s_ptp", "s_ab", "s_aq", "s_ae", "s_db", "s_dq", "s_ob", "s_oq", "s_oh",
                          "s_od")}
            found[f"attention {mode} {dt}"] = build(triton_invariant._invariant_attn_kernel, sig, dict(
                NUM_KV_HEADS=8, G=4, G_PAD=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=block_n, PAGE_SIZE=16,
                MASK_MODE=code, INPUT_PRECISION="ieee" if dt == "*fp32" else "tf32"), num_warps=warps, num_stages=stages)
    return found


def test_gpu_path_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    # The triton wheel ships ptxas (triton/backends/nvidia/bin): no GPU is needed, so no skip.
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(found) == 3 + 2 + 6
    # 16-bit GEMM and attention use tensor cores (fp32 "ieee" dots are FMA loops; RMSNorm has no dot)
    assert all(v for k, v in found.items() if not k.startswith("rms_norm") and "fp32" not in k), found


if __name__ == "__main__":
    print(json.dumps(compile_all()))
