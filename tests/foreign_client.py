"""A process that is not part of the job tries to get in: the foreign client of
tests/security_test.cc.

For each target (a Tessera transport address, tcp://HOST:PORT) it tries every way in that does
not need the job key -- ZeroMQ with no mechanism, PLAIN with a token made with another key or a
plain password, CURVE with keys of its own, raw TCP bytes -- and, given the key, replays a
connection token that was already used. Each attempt sends a message and waits for an answer.
One JSON line per attempt on stdout:

  {"target": ..., "attempt": ..., "handshake": "succeeded" | "failed" | "none", "replied": bool}

Only the first half of "replay" (the legitimate use of the token) may succeed.

    foreign_client.py --target tcp://127.0.0.1:5555 [--target ...] [--key-file PATH]
"""

import argparse
import hashlib
import hmac
import json
import os
import socket
import struct
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

WAIT_S = 0.4
HANDSHAKE_S = 5.0


def connect_token(key, now_ms):
    """A connection token as common/security/connect_token.h makes one."""
    subkey = hashlib.blake2b(b"zap-token", digest_size=32, key=key).digest()
    body = bytes([1]) + struct.pack("<q", now_ms) + os.urandom(16)
    parts = [b"tessera connect", body[0:1], body[1:9], body[9:25]]
    message = b"".join(struct.pack("<Q", len(part)) + part for part in parts)
    return body + hmac.new(subkey, message, hashlib.sha256).digest()


def read_key(path):
    text = open(path).read().strip()
    prefix = "tessera-job-key-v1 "
    assert text.startswith(prefix), "not a key file"
    return bytes.fromhex(text[len(prefix):])


def zmq_attempt(context, target, configure):
    """Connects a DEALER configured by `configure`, sends a message, waits for an answer."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    configure(sock)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED |
                                      zmq.EVENT_HANDSHAKE_FAILED_AUTH |
                                      zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                      zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    sock.connect(target)
    # Frames a worker might send, a header-sized blob and a payload, offered until ZeroMQ
    # takes them (it does once a connection is up; a refused one never is).
    frames = [b"\x10" * 64, b"\x00" * 4096]

    def offer():
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
    sent = offer()
    handshake = "none"
    replied = False
    # Until the first handshake's outcome (up to HANDSHAKE_S: the machine may be busy), then
    # WAIT_S more for an answer.
    deadline = time.monotonic() + HANDSHAKE_S
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    while time.monotonic() < deadline:
        ready = dict(poller.poll(10 if not sent else
                                 max(1, int((deadline - time.monotonic()) * 1000))))
        sent = sent or offer()
        if sock in ready:
            sock.recv_multipart()
            replied = True
        if monitor in ready:
            event = recv_monitor_message(monitor)["event"]
            if handshake == "none":
                deadline = time.monotonic() + WAIT_S
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                handshake = "succeeded"
            elif handshake == "none":
                handshake = "failed"
    sock.disable_monitor()
    monitor.close(0)
    sock.close(0)
    return handshake, replied


def raw_tcp_attempt(target):
    host, port = target[len("tcp://"):].rsplit(":", 1)
    replied = False
    try:
        conn = socket.create_connection((host, int(port)), timeout=WAIT_S)
    except ConnectionRefusedError:
        return "unreachable", False  # the process has finished
    with conn:
        # A ZMTP 3.0 greeting announcing NULL, then garbage.
        greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
        conn.sendall(greeting + b"\0" * 31 + os.urandom(256))
        conn.settimeout(WAIT_S)
        try:
            data = conn.recv(4096)
            # The listener's own greeting is not an answer; anything past it would be.
            replied = len(data) > 64
        except (socket.timeout, ConnectionResetError):
            pass
    return "none", replied


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--key-file", help="the job's key: only for the replay attempt")
    args = parser.parse_args()
    context = zmq.Context()
    other_key = os.urandom(32)
    now_ms = lambda: int(time.time() * 1000)
    for target in args.target:
        attempts = {
            "null": lambda s: None,
            "plain_wrong_key": lambda s: (s.setsockopt(zmq.PLAIN_USERNAME, b"tessera"),
                                          s.setsockopt(zmq.PLAIN_PASSWORD,
                                                       connect_token(other_key, now_ms()))),
            "plain_password": lambda s: (s.setsockopt(zmq.PLAIN_USERNAME, b"tessera"),
                                         s.setsockopt(zmq.PLAIN_PASSWORD, b"tessera")),
        }

        def curve(s):
            server_public, _ = zmq.curve_keypair()
            public, secret = zmq.curve_keypair()
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_public, public, secret
        attempts["curve_own_keys"] = curve
        for name, configure in attempts.items():
            handshake, replied = zmq_attempt(context, target, configure)
            print(json.dumps({"target": target, "attempt": name, "handshake": handshake,
                              "replied": replied}), flush=True)
        handshake, replied = raw_tcp_attempt(target)
        print(json.dumps({"target": target, "attempt": "raw_tcp", "handshake": handshake,
                          "replied": replied}), flush=True)
        if args.key_file:
            token = connect_token(read_key(args.key_file), now_ms())

            def with_token(s):
                s.setsockopt(zmq.PLAIN_USERNAME, b"tessera")
                s.setsockopt(zmq.PLAIN_PASSWORD, token)
            # The legitimate use (a member's connection, its handshake seen on the wire)...
            handshake, _ = zmq_attempt(context, target, with_token)
            print(json.dumps({"target": target, "attempt": "replay_original",
                              "handshake": handshake, "replied": False}), flush=True)
            # ...and the replay.
            handshake, replied = zmq_attempt(context, target, with_token)
            print(json.dumps({"target": target, "attempt": "replay", "handshake": handshake,
                              "replied": replied}), flush=True)
    context.term()


if __name__ == "__main__":
    main()
