"""Sends the supervisor makes for a tool under `network = "public"`: `sendto` with an
address, and every `sendmsg` and `sendmmsg` (their address lies in memory, so the
filter cannot see it). Each message is copied once — address, data, ancillary data —
checked, and sent from the copy on the supervisor's own descriptor of the socket.

A datagram larger than 256 KiB is refused (EMSGSIZE; UDP stops at 64 KiB anyway); a
stream send is cut to it and reports the shorter count, as a stream send may.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct

from core.records import record
from core.sandbox import seccomp
from core.sandbox.netcall import (
    Call,
    Operation,
    Policy,
    Refused,
    ccall,
    check_inet,
    libc,
    read_sockaddr,
    sockopt,
)

_MAX_DATA = 256 * 1024  # bytes of one proxied message (of all of a sendmmsg's together)
_MAX_CONTROL = 16 * 1024
_MAX_IOV = 1024
_MAX_BATCH = 64  # messages of one sendmmsg; it may send fewer, and says how many
_MSGHDR = struct.Struct("=QI4xQQQQi4x")  # struct msghdr on a 64-bit machine
_MMSGHDR = 64  # struct mmsghdr: a msghdr and the count sent
_CONTROL_ALLOWED = {
    socket.IPPROTO_IP: {1, 2, 8},  # IP_TOS, IP_TTL, IP_PKTINFO (no IP_RETOPTS source route)
    socket.IPPROTO_IPV6: {50, 52, 62, 67},  # PKTINFO, HOPLIMIT, DONTFRAG, TCLASS (no RTHDR)
}


@record(frozen=True, slots=True)
class _Message:
    name: bytes
    data: bytes
    control: bytes


class _MsgHdr(ctypes.Structure):
    _fields_ = (
        ("name", ctypes.c_char_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.c_void_p),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_char_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    )


def prepare(kind: str, policy: Policy, call: Call) -> Operation:
    """The send to perform for one notified `sendto`, `sendmsg` or `sendmmsg`, from
    copies. Raises Refused (or OSError) to answer at once."""
    stream = sockopt(call.sock, socket.SO_TYPE) == socket.SOCK_STREAM
    args, sock = call.args, call.sock
    if kind == "sendto":
        name = read_sockaddr(call.pid, args[4], args[5])
        _check(policy, call.domain, name)
        size = min(args[2], _MAX_DATA)
        if size < args[2] and not stream:
            raise Refused(errno.EMSGSIZE)
        data = seccomp.read_memory(call.pid, [(args[1], size)])[0] if size else b""
        flags = ctypes.c_int(args[3]).value
        return lambda: ccall(libc.sendto, sock, data, len(data), flags, name or None, len(name))
    if kind == "sendmsg":
        (header,) = seccomp.read_memory(call.pid, [(args[1], _MSGHDR.size)])
        message = _message(policy, call, header, stream, _MAX_DATA)
        flags = ctypes.c_int(args[2]).value
        return lambda: _send(sock, message, flags)
    return _batch(policy, call, stream)


def _batch(policy: Policy, call: Call, stream: bool) -> Operation:
    args = call.args
    count = min(args[2] & 0xFFFFFFFF, _MAX_BATCH)
    if count == 0:
        return lambda: 0
    (headers,) = seccomp.read_memory(call.pid, [(args[1], _MMSGHDR * count)])
    messages: list[_Message] = []
    left = _MAX_DATA
    for i in range(count):
        try:
            header = headers[_MMSGHDR * i : _MMSGHDR * i + _MSGHDR.size]
            messages.append(_message(policy, call, header, stream, left))
        except Refused:
            if not messages:
                raise
            break  # the ones before it are sent; the count says so, as the kernel's would
        left -= len(messages[-1].data)
        if left <= 0:
            break
    flags, sock, pid, at = ctypes.c_int(args[3]).value, call.sock, call.pid, args[1]

    def send() -> int:
        for i, message in enumerate(messages):
            try:
                sent = _send(sock, message, flags)
            except OSError:
                if i == 0:
                    raise
                return i
            seccomp.write_memory(pid, at + _MMSGHDR * i + _MSGHDR.size, struct.pack("=I", sent))
        return len(messages)

    return send


def _check(policy: Policy, domain: int, name: bytes) -> None:
    if not name:
        return  # no address: the socket's own peer, which its connect() checked
    if policy.public is None:
        raise Refused(errno.EACCES)
    check_inet(policy, domain, name, connect=False)


def _message(policy: Policy, call: Call, header: bytes, stream: bool, room: int) -> _Message:
    """One msghdr's address, data and ancillary data, copied and checked."""
    name_at, name_len, iov_at, iov_len, ctl_at, ctl_len, _ = _MSGHDR.unpack(header)
    name = read_sockaddr(call.pid, name_at, name_len) if name_at else b""
    _check(policy, call.domain, name)
    if iov_len > _MAX_IOV:
        raise Refused(errno.EMSGSIZE)
    if ctl_len > _MAX_CONTROL:
        raise Refused(errno.ENOBUFS)
    vectors = seccomp.read_memory(call.pid, [(iov_at, 16 * iov_len)])[0] if iov_len else b""
    ranges = []
    for i in range(iov_len):
        base, length = struct.unpack_from("=QQ", vectors, 16 * i)
        if length > room and not stream:
            raise Refused(errno.EMSGSIZE)
        if length and room:
            ranges.append((base, min(length, room)))
            room -= min(length, room)
    data = b"".join(seccomp.read_memory(call.pid, ranges)) if ranges else b""
    control = b""
    if ctl_len and ctl_at:
        control = _own_control(seccomp.read_memory(call.pid, [(ctl_at, ctl_len)])[0], call)
    return _Message(name, data, control)


def _own_control(control: bytes, call: Call) -> bytes:
    """The ancillary data with the tool's descriptors (SCM_RIGHTS) replaced by ours;
    credentials (which would be checked against Parley's) and IP options that route a
    packet through another hop refused."""
    out, at = bytearray(), 0
    while at + 16 <= len(control):
        length, level, kind = struct.unpack_from("=Qii", control, at)
        if length < 16 or at + length > len(control):
            raise Refused(errno.EINVAL)
        body = control[at + 16 : at + length]
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            count = len(body) // 4
            ours = []
            for fd in struct.unpack(f"={count}i", body[: 4 * count]):
                ours.append(seccomp.take_fd(call.pidfd, fd))
                call.taken.append(ours[-1])
            body = struct.pack(f"={count}i", *ours) + body[4 * count :]
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            raise Refused(errno.EPERM)
        elif kind not in _CONTROL_ALLOWED.get(level, {kind}):
            raise Refused(errno.EACCES)
        out += control[at : at + 16] + body
        out += b"\0" * (-len(out) % 8)
        at += (length + 7) & ~7
    return bytes(out)


def _send(sock: int, message: _Message, flags: int) -> int:
    buf = ctypes.create_string_buffer(message.data, len(message.data))
    iov = seccomp._IoVec(ctypes.cast(buf, ctypes.c_void_p), len(message.data))
    msg = _MsgHdr(
        message.name or None,
        len(message.name),
        ctypes.addressof(iov),
        1,
        message.control or None,
        len(message.control),
        0,
    )
    return ccall(libc.sendmsg, sock, ctypes.byref(msg), flags)
