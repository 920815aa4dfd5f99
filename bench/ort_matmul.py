"""Low-bit projections on ONNX Runtime's CPU `MatMulNBits` (contrib domain com.microsoft), whose
`accuracy_level=4` quantizes a layer's input to int8 per block of 32 and multiplies it against
4-bit (or 8-bit) weights with integer dot products (MLAS `SQNBIT_CompInt8`: AVX2, AVX-VNNI,
AVX-512 where present): llama.cpp's Q4_0 × Q8_0 idea in a library that installs as a wheel.

The weights keep the exact GGUF codes of `engine.models.int4_cpu`:
- Q4_1 (`Int4Linear`): w = (q - 8) · scale + zero per group of 32. `MatMulNBits` without a
  zero-point input applies w = (q - 8) · scale, and integer zero points cannot hold `zero` (a
  float; float zero points switch the operator to its dequantize-then-float path, matmul_nbits.cc
  `has_unquantized_zero_point_`). So the graph adds the zero term as a small float product:
  x · w_row = Σ_g scale_g Σ_i x_i (q_i - 8) + Σ_g zero_g Σ_i x_i, the second sum over the input's
  group sums [rows, in / 32] against the zeros [in / 32, out]: 1/32 of the main product's work.
- Q8_0 (`Int8Linear`): w = q · d, q in -127..127, is `bits=8` with the default zero point 128 and
  codes q + 128: exact.
Scales and zeros are the bfloat16-rounded values `Int4Linear` holds, so both dequantize to the same
float32 weights.

The ONNX model is written here as protobuf bytes (the few message fields it needs, onnx.proto3),
so the `onnx` package is not a dependency. Each layer is one session on `threads` intra-op threads,
spinning off (torch's threads share the cores between calls); inputs and outputs are bound to
torch tensors' memory (IOBinding), no copies. `available()` is False when onnxruntime is missing or
its CPU build lacks the operator.

Measured and not kept in the engine (docs/BENCHMARKS.md §5j): faster than torch's int4 kernel on one
projection in cache, not in a real decode step, and its int8 activations cost 4.2x the KL against
float32. `int4_layers_on_ort` puts a loaded model's int4 layers on it for bench/int_projections.py.
"""

from __future__ import annotations

import numpy as np
import torch

GROUP_SIZE = 32
"""Input weights per scale (Q4_1 and Q8_0 blocks)."""
_FLOAT, _UINT8, _INT64 = 1, 2, 7  # TensorProto.DataType


# ------------------------------------------------------------------ protobuf (onnx.proto3 fields)
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields are two's complement
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, array: np.ndarray) -> bytes:
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9, little-endian)."""
    kind = {np.dtype(np.float32): _FLOAT, np.dtype(np.uint8): _UINT8, np.dtype(np.int64): _INT64}[array.dtype]
    return b"".join(_int(1, d) for d in array.shape) + _int(2, kind) + _bytes(8, name) + _bytes(9, np.ascontiguousarray(array).tobytes())


def _value_info(name: str, dims: list) -> bytes:
    """ValueInfoProto of a float tensor; a str dim is symbolic (dim_param), an int fixed (dim_value)."""
    shape = b"".join(_bytes(1, _bytes(2, d) if isinstance(d, str) else _int(1, d)) for d in dims)
    return _bytes(1, name) + _bytes(2, _bytes(1, _int(1, _FLOAT) + _bytes(2, shape)))


def _node(op: str, inputs: list[str], outputs: list[str], attrs: dict[str, int], domain: str = "") -> bytes:
    """NodeProto with int attributes (AttributeProto name 1, i 3, type 20 = INT)."""
    body = b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs) + _bytes(4, op)
    body += b"".join(_bytes(5, _bytes(1, k) + _int(3, v) + _int(20, 2)) for k, v in attrs.items())
    return body + (_bytes(7, domain) if domain else b"")


def model_bytes(in_features: int, out_features: int, bits: int, codes: np.ndarray, scales: np.ndarray,
                zeros: np.ndarray | None, accuracy_level: int) -> bytes:
    """A serialized ONNX model Y[rows, out] = A[rows, in] · Wᵀ (module docstring): `codes` uint8
    [out, in / 32, 32 · bits / 8] (4-bit: two codes a byte, the first in the low nibble), `scales`
    float32 [out, in / 32], `zeros` float32 [out, in / 32] (Q4_1's zero, added as a float product)
    or None. ONNX opset 17 and com.microsoft 1; IR version 8."""
    nodes = [_node("MatMulNBits", ["A", "B", "scales"], ["Y0" if zeros is not None else "Y"],
                   {"K": in_features, "N": out_features, "bits": bits, "block_size": GROUP_SIZE,
                    "accuracy_level": accuracy_level}, "com.microsoft")]
    inits = [_tensor("B", codes), _tensor("scales", scales.reshape(-1))]
    if zeros is not None:
        groups = in_features // GROUP_SIZE
        nodes += [_node("Reshape", ["A", "group_shape"], ["A3"], {}),
                  _node("ReduceSum", ["A3", "last_axis"], ["S"], {"keepdims": 0}),
                  _node("MatMul", ["S", "zeros_t"], ["Y1"], {}),
                  _node("Add", ["Y0", "Y1"], ["Y"], {})]
        inits += [_tensor("group_shape", np.array([-1, groups, GROUP_SIZE], np.int64)),
                  _tensor("last_axis", np.array([-1], np.int64)),
                  _tensor("zeros_t", np.ascontiguousarray(zeros.T, dtype=np.float32))]
    graph = (b"".join(_bytes(1, n) for n in nodes) + _bytes(2, "projection") + b"".join(_bytes(5, t) for t in inits)
             + _bytes(11, _value_info("A", ["rows", in_features])) + _bytes(12, _value_info("Y", ["rows", out_features])))
    opsets = _bytes(8, _int(2, 17)) + _bytes(8, _bytes(1, "com.microsoft") + _int(2, 1))
    return _int(1, 8) + _bytes(2, "halaman") + _bytes(7, graph) + opsets


# ------------------------------------------------------------------ weights in the operator's layout
def q4_1_parts(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`weight` [out, in] as `Int4Linear` quantizes it (Q4_1 min/max, scales and zeros rounded to
    bfloat16): packed codes uint8 [out, in / 32, 16], scales and zeros float32 [out, in / 32]."""
    out_features, in_features = weight.shape
    w = weight.detach().float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = w.amin(-1), w.amax(-1)
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.bfloat16).tiny)
    codes = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    zero = low + 8 * scale
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.numpy(), scale.to(torch.bfloat16).float().numpy(), zero.to(torch.bfloat16).float().numpy()


def q8_0_parts(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """`weight` [out, in] as `Int8Linear` quantizes it (Q8_0, scale rounded to bfloat16): codes
    q + 128 uint8 [out, in / 32, 32] and scales float32 [out, in / 32]."""
    out_features, in_features = weight.shape
    w = weight.detach().float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    d = (w.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.bfloat16).tiny)
    q = torch.round(w / d[..., None]).clamp(-127, 127)
    return (q + 128).to(torch.uint8).numpy(), d.to(torch.bfloat16).float().numpy()


def dequantized(bits: int, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None) -> torch.Tensor:
    """The float32 weights [out, in] the parts apply (for tests and error measurements)."""
    c = torch.from_numpy(codes).to(torch.int32)
    if bits == 4:
        c = torch.stack([c & 15, c >> 4], -1).flatten(-2)
    s = torch.from_numpy(scales)[..., None]
    w = (c - (1 << (bits - 1))).float() * s
    if zeros is not None:
        w = w + torch.from_numpy(zeros)[..., None]
    return w.flatten(1)


# ------------------------------------------------------------------ sessions
def available() -> bool:
    """Whether onnxruntime is installed with a CPU `MatMulNBits` (a tiny model must load and run)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            codes, scales, zeros = q4_1_parts(torch.ones(16, GROUP_SIZE))
            layer = OrtProjection(GROUP_SIZE, 16, 4, codes, scales, zeros, threads=1)
            _AVAILABLE = bool(torch.allclose(layer(torch.ones(1, GROUP_SIZE)), torch.full((1, 16), 32.0), rtol=1e-2))
        except Exception:  # noqa: BLE001 - no onnxruntime, or a build without the contrib operator
            _AVAILABLE = False
    return _AVAILABLE


_AVAILABLE: bool | None = None


class OrtProjection:
    """One projection as an ONNX Runtime session (module docstring): call it with float32 x
    [rows, in] (contiguous; other dtypes are converted) for float32 [rows, out]. `accuracy_level`
    4 = int8 activations (integer dot products), 0 = float32 activations. Raises whatever
    onnxruntime raises when it cannot build the session (missing operator, bad shapes)."""

    def __init__(self, in_features: int, out_features: int, bits: int, codes: np.ndarray, scales: np.ndarray,
                 zeros: np.ndarray | None, *, threads: int, accuracy_level: int = 4) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # no per-session arena: each kept its largest intermediates (a 1,024-row chunk's: ~20 MB), which
        # over the 211 layers of the 135M model held 11 GB of RSS
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        options.log_severity_level = 3
        model = model_bytes(in_features, out_features, bits, codes, scales, zeros, accuracy_level)
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.in_features, self.out_features = in_features, out_features
        self._binding = self.session.io_binding()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        y = torch.empty(flat.shape[0], self.out_features, dtype=torch.float32)
        b = self._binding
        b.bind_input("A", "cpu", 0, np.float32, list(flat.shape), flat.data_ptr())
        b.bind_output("Y", "cpu", 0, np.float32, list(y.shape), y.data_ptr())
        self.session.run_with_iobinding(b)
        return y



# ------------------------------------------------------------------ from an Int4Linear's buffers
PACK_BLOCK_OUT = 64
"""torch's CPU int4 layout (`_convert_weight_to_int4pack_for_cpu`): per block of 64 output
features, for each input feature k, 32 bytes whose byte d holds feature d's code (low nibble) and
feature 32 + d's (high nibble). Only layers in whole blocks are read back (`from_torch_int4`)."""


def unpack_torch_int4(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Codes uint8 [out, in] (0..15) from torch's CPU packed layout `packed` [out, in / 2]
    (`PACK_BLOCK_OUT`). ValueError unless out_features is a multiple of `PACK_BLOCK_OUT`."""
    if out_features % PACK_BLOCK_OUT or packed.shape != (out_features, in_features // 2):
        raise ValueError(f"cannot read back int4 codes of a {in_features} -> {out_features} layer")
    blocks = packed.reshape(out_features // PACK_BLOCK_OUT, in_features, PACK_BLOCK_OUT // 2)
    codes = torch.cat([blocks & 15, blocks >> 4], -1)  # [blocks, in, 64]
    return codes.transpose(1, 2).reshape(out_features, in_features)


def from_torch_int4(packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int,
                    out_features: int, threads: int) -> OrtProjection | None:
    """An `OrtProjection` applying the same Q4_1 weights as an `Int4Linear`'s `packed` [out, in / 2]
    and `scales_and_zeros` [in / 32, out, 2] bfloat16, or None where it cannot (no onnxruntime or
    operator, a shape outside whole `PACK_BLOCK_OUT` blocks, or a probe row whose output differs from
    the torch kernel's by more than 5 % of its largest value: a layout this reading does not know)."""
    if not available() or out_features % PACK_BLOCK_OUT or in_features % GROUP_SIZE:
        return None
    try:
        codes = unpack_torch_int4(packed, out_features, in_features).reshape(out_features, -1, GROUP_SIZE)
        parts = (codes[..., 0::2] | (codes[..., 1::2] << 4)).numpy()
        scales = scales_and_zeros[..., 0].T.float().contiguous().numpy()
        zeros = scales_and_zeros[..., 1].T.float().contiguous().numpy()
        layer = OrtProjection(in_features, out_features, 4, parts, scales, zeros, threads=threads)
        probe = torch.randn(1, in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        expected = torch.ops.aten._weight_int4pack_mm_for_cpu(probe, packed, GROUP_SIZE, scales_and_zeros).float()
        if (layer(probe.float()) - expected).abs().max() > 0.05 * expected.abs().max() + 1e-3:
            return None
        return layer
    except Exception:  # noqa: BLE001 - any failure keeps the torch kernel
        return None


def int4_layers_on_ort(model: torch.nn.Module, threads: int) -> int:
    """Run every `Int4Linear` of `model` (not `Int8Linear`) that the operator takes on it, for
    every row count (its bfloat16 reading copy dropped); returns how many layers moved."""
    from engine.models.int4_cpu import Int4Linear

    moved = 0
    for module in model.modules():
        if type(module) is not Int4Linear:
            continue
        projection = from_torch_int4(module.packed, module.scales_and_zeros, module.in_features, module.out_features, threads)
        if projection is None:
            continue

        def forward(x: torch.Tensor, layer=module, run=projection) -> torch.Tensor:
            y = run(x.reshape(-1, layer.in_features)).to(x.dtype).view(*x.shape[:-1], layer.out_features)
            return y if layer.bias is None else y + layer.bias

        module.dense, module.forward = None, forward
        moved += 1
    return moved
