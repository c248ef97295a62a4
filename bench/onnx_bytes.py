"""A serialized ONNX model without the ``onnx`` package: the few protobuf fields a
one- or few-node graph needs, written by hand (bench/peers.py uses it when
``onnx`` is not importable; onnxruntime itself reads the bytes).

Field numbers from onnx/onnx.proto: ModelProto ir_version 1, graph 7,
opset_import 8; GraphProto node 1, name 2, input 11, output 12; NodeProto input
1, output 2, name 3, op_type 4, attribute 5, domain 7; AttributeProto name 1,
f 2, i 3, type 20 (FLOAT 1, INT 2); ValueInfoProto name 1, type 2; TypeProto
tensor_type 1; TypeProto.Tensor elem_type 1, shape 2; TensorShapeProto dim 1;
Dimension dim_value 1; OperatorSetIdProto domain 1, version 2.
"""
import struct

# TensorProto.DataType
ELEM_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float16": 10,
              "float64": 11, "bfloat16": 16}
IR_VERSION = 8


def _varint(n):
    n &= (1 << 64) - 1                 # negative int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire):
    return _varint(field << 3 | wire)


def _len(field, data):
    if isinstance(data, str):
        data = data.encode()
    return _key(field, 2) + _varint(len(data)) + data


def _int(field, n):
    return _key(field, 0) + _varint(int(n))


def attribute(name, value):
    """AttributeProto of an int or a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"attribute {name!r}: only int and float attributes, got {type(value).__name__}")
    if isinstance(value, float):
        return _len(1, name) + _key(2, 5) + struct.pack("<f", value) + _int(20, 1)
    return _len(1, name) + _int(3, value) + _int(20, 2)


def node(op_type, inputs, outputs, domain="", **attrs):
    """NodeProto: ``inputs`` may hold "" for an optional input left out."""
    b = b"".join(_len(1, i) for i in inputs) + b"".join(_len(2, o) for o in outputs)
    b += _len(3, f"{op_type}_{outputs[0]}") + _len(4, op_type)
    b += b"".join(_len(5, attribute(k, v)) for k, v in attrs.items())
    if domain:
        b += _len(7, domain)
    return b


def value_info(name, dtype, shape):
    """ValueInfoProto of a tensor of ``dtype`` (a NumPy name) and fixed ``shape``."""
    dims = b"".join(_len(1, _int(1, d)) for d in shape)
    tensor = _int(1, ELEM_TYPES[dtype]) + _len(2, dims)
    return _len(1, name) + _len(2, _len(1, tensor))


def model(nodes, inputs, outputs, opsets=(("", 17), ("com.microsoft", 1))):
    """Serialized ModelProto of one graph: ``nodes`` from :func:`node`, ``inputs``
    and ``outputs`` as (name, dtype, shape)."""
    g = b"".join(_len(1, n) for n in nodes) + _len(2, "g")
    g += b"".join(_len(11, value_info(*i)) for i in inputs)
    g += b"".join(_len(12, value_info(*o)) for o in outputs)
    return (_int(1, IR_VERSION) + b"".join(_len(8, _len(1, d) + _int(2, v)) for d, v in opsets)
            + _len(7, g))
