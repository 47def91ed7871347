"""What the judge and the student's process say to each other: JSON headers and raw tensor bytes,
over a socket. Nothing here can run code on the receiving side (no pickle): a value is None, a
bool, an int, a float, a str, a tuple, list or dict of values, a torch dtype, or a tensor sent as
its dtype, shape and bytes. A callable becomes a number the other side calls back by.

A message: 8 bytes (header length, blobs' total length), the JSON header, then the blobs.
"""

import json
import math
import socket
import struct

import torch

DTYPES = {str(d)[6:]: d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class Malformed(Exception):
    """The other side sent something that is not a message of this protocol."""


class TooLarge(Exception):
    """A message past the output size limit."""


HEADER_LIMIT = 2 ** 21  # bytes of JSON one header may take, checked before it is parsed


def send(sock: socket.socket, header: dict, blobs=()) -> None:
    sizes = [len(b) for b in blobs]
    head_all = json.dumps(dict(h=header, sizes=sizes), allow_nan=False).encode()
    sock.sendall(b"".join([struct.pack("!II", len(head_all), sum(sizes)), head_all, *blobs]))


def _exactly(sock, n: int, left=None) -> bytes:
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        if left is not None:  # the whole message in the time left, not each read
            seconds = left()
            if seconds <= 0:
                raise socket.timeout("the message did not come whole in time")
            sock.settimeout(seconds)
        try:
            k = sock.recv_into(view[got:], n - got)
        except socket.timeout:  # left() says again how much time is left
            continue
        if not k:
            raise EOFError("the other side closed the connection")
        got += k
    return bytes(out)


def receive(sock: socket.socket, limit: int, left=None) -> tuple:
    """(header, blobs), whole while `left()` (the seconds left) is above 0; raises EOFError,
    socket.timeout, TooLarge or Malformed."""
    head_size, blob_size = struct.unpack("!II", _exactly(sock, 8, left))
    if head_size + blob_size > limit or head_size > HEADER_LIMIT:
        raise TooLarge(f"{head_size} + {blob_size} bytes, past the limit of {HEADER_LIMIT} + "
                       f"{limit}")
    try:
        message = json.loads(_exactly(sock, head_size, left))
        header, sizes = message["h"], message["sizes"]
        if not (isinstance(header, dict) and isinstance(sizes, list)
                and all(isinstance(s, int) and s >= 0 for s in sizes)
                and sum(sizes) == blob_size):
            raise Malformed("a header that does not describe its blobs")
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise Malformed(f"an unreadable header: {error}") from None
    return header, [_exactly(sock, s, left) for s in sizes]


def encode(value, callables=None) -> tuple:
    """(json value, tensor table, blobs, the tensors in table order): the same tensor object is
    sent once; callables None: a callable cannot be sent."""
    table, blobs, seen, sent = [], [], {}, []  # sent: so that each id() stays unique meanwhile

    def tensor(x: torch.Tensor) -> int:
        if id(x) in seen:
            return seen[id(x)]
        if x.device.type not in ("cpu", "meta") or x.layout != torch.strided \
                or str(x.dtype)[6:] not in DTYPES:
            raise TypeError(f"the grader sends CPU dense tensors only, got {x.dtype} on {x.device}")
        entry = dict(dtype=str(x.dtype)[6:], shape=list(x.shape), grad=bool(x.requires_grad))
        if x.device.type == "meta":  # no values: a test of the device checks
            entry["meta"] = True
        else:
            flat = x.detach().reshape(-1).contiguous()
            blobs.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
            entry["blob"] = len(blobs) - 1
        table.append(entry)
        seen[id(x)] = len(table) - 1
        sent.append(x)
        return len(table) - 1

    def convert(x):
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x if abs(x) < 2 ** 53 else dict(t="bigint", v=str(x))
        if isinstance(x, float):
            return x if math.isfinite(x) else dict(t="float", v=repr(x))
        if isinstance(x, torch.Tensor):
            return dict(t="tensor", i=tensor(x))
        if isinstance(x, torch.dtype):
            return dict(t="dtype", v=str(x)[6:])
        if isinstance(x, torch.device):
            return dict(t="device", v=str(x))
        if isinstance(x, (tuple, list, torch.Size)):
            return dict(t="list" if isinstance(x, list) else "tuple", v=[convert(v) for v in x])
        if isinstance(x, dict):
            return dict(t="dict", v=[[convert(k), convert(v)] for k, v in x.items()])
        if hasattr(x, "item") and hasattr(x, "dtype"):  # a numpy number
            return convert(x.item())
        if callable(x) and callables is not None:
            callables.append(x)
            return dict(t="callback", i=len(callables) - 1)
        raise TypeError(f"the grader cannot send a {type(x).__name__}")

    return convert(value), table, blobs, sent


def decode_tensors(table, blobs) -> list:
    """The tensors of a table, new objects; requires_grad as sent."""
    out = []
    for entry in table:
        if not (isinstance(entry, dict) and entry.get("dtype") in DTYPES
                and isinstance(entry.get("shape"), list) and len(entry["shape"]) <= 16
                and all(isinstance(n, int) and 0 <= n < 2 ** 40 for n in entry["shape"])):
            raise Malformed("a tensor entry that is not dtype, shape and bytes")
        dtype, shape = DTYPES[entry["dtype"]], entry["shape"]
        if entry.get("meta") is True:
            out.append(torch.empty(shape, dtype=dtype, device="meta"))
            continue
        if not (isinstance(entry.get("blob"), int) and 0 <= entry["blob"] < len(blobs)):
            raise Malformed("a tensor entry without its bytes")
        data = blobs[entry["blob"]]
        numel = math.prod(shape)
        if len(data) != numel * torch.empty((), dtype=dtype).element_size():
            raise Malformed("a tensor whose bytes do not fill its shape")
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape) \
            if numel else torch.empty(shape, dtype=dtype)  # frombuffer takes no empty buffer
        if entry.get("grad") and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_()
        out.append(t)
    return out


def decode(x, tensors, callback=None):
    """A value from its JSON form; `callback(i)` makes the stub for callable i."""
    if x is None or isinstance(x, (bool, str, int, float)):
        return x
    if not isinstance(x, dict) or "t" not in x:
        raise Malformed(f"an untagged value: {str(x)[:60]}")
    tag, v = x["t"], x.get("v")
    try:
        if tag == "tensor":
            return tensors[x["i"]]
        if tag == "float" and v in ("nan", "inf", "-inf"):  # what JSON holds no number for
            return float(v)
        if tag == "bigint":
            return int(v)
        if tag == "dtype":
            return DTYPES[v]
        if tag == "device" and v == "cpu":
            return torch.device(v)
        if tag in ("tuple", "list"):
            values = [decode(e, tensors, callback) for e in v]
            return tuple(values) if tag == "tuple" else values
        if tag == "dict":
            return {decode(k, tensors, callback): decode(e, tensors, callback) for k, e in v}
        if tag == "callback" and callback is not None:
            return callback(int(x["i"]))
    except (KeyError, IndexError, TypeError, ValueError, RecursionError) as error:
        raise Malformed(f"a {tag} value that does not decode: {error}") from None
    raise Malformed(f"a value tagged {tag!r} that this protocol does not take: {str(v)[:60]}")
